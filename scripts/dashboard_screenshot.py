"""Writes docs/images/dashboard.svg: the real `hsmon tui` during a real extraction (`make screenshot`).

The demo's pieces do the work: the embedded target and its sample, a real `hsmon extract`, a real
daemon watching it; the dashboard (Textual's own screenshot facility, at 160x48) reads the daemon
from the job's start, and once a little over half the rows are done its screen is saved as SVG.
Every child is stopped at the end, whatever happened.

usage: python scripts/dashboard_screenshot.py [--out docs/images/dashboard.svg] [--work DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hsmon.demo.cli import _stop, fresh_start, prepare_in_child, start_daemon  # noqa: E402

SIZE = (160, 48)
COPIES = 4  # the demo's sample, four times over: long enough to be seen mid-run


def start_extraction(base: Path, setup: dict[str, str]) -> subprocess.Popen[bytes]:
    """A real `hsmon extract` of the sample (repeated) on one thread, events where the daemon reads them."""
    data = base / "screenshot.jsonl"
    data.write_text(Path(setup["data"]).read_text() * COPIES)
    with open(base / "extract.log", "ab") as log:
        return subprocess.Popen(
            [
                sys.executable, "-m", "hsmon", "extract", str(data),
                "--out", str(base / "extract"), "--model", setup["model"],
                "--events", str(base / "events.jsonl"), "--chunk-size", "100", "--threads", "1",
                "--min-free", "100M", "--heartbeat", "1",
            ],
            stdout=log, stderr=log,
        )  # fmt: skip


def share_done(url: str) -> float:
    """The share of the rows the daemon reports done (0 while it cannot say)."""
    try:
        with urllib.request.urlopen(url + "/api/v1/status", timeout=5) as resp:
            progress = json.load(resp)["jobs"][0].get("progress") or {}
    except (OSError, ValueError, IndexError, KeyError):
        return 0.0
    done, total = progress.get("rows_done") or 0, progress.get("rows_total") or 0
    return done / total if total else 0.0


async def shoot(url: str, share: float, timeout: float = 600.0) -> str:
    """The dashboard on the daemon from the job's start (its sparklines fill) until ``share`` of the
    rows are done, then its screen as SVG."""
    from hsmon.tui.app import HsmonApp
    from hsmon.tui.sources import HttpStatusSource

    app = HsmonApp([HttpStatusSource(url, interval=0.5)])
    deadline = time.monotonic() + timeout
    async with app.run_test(size=SIZE) as pilot:
        while await asyncio.to_thread(share_done, url) < share:
            if time.monotonic() > deadline:
                raise SystemExit(f"screenshot: the extraction did not reach {share:.0%} in {timeout:.0f} s")
            await pilot.pause(0.5)
        await pilot.pause(1.0)
        return app.export_screenshot(title="hsmon tui")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "dashboard.svg")
    parser.add_argument("--work", type=Path, default=None, help="working directory (default: a temporary)")
    args = parser.parse_args()
    base = args.work or Path(tempfile.mkdtemp(prefix="hsmon-screenshot-"))
    base.mkdir(parents=True, exist_ok=True)
    extraction = daemon = None
    try:
        setup = prepare_in_child(base, "embedded")
        if setup is None:
            return 1
        fresh_start(base)
        extraction = start_extraction(base, setup)
        daemon, url = start_daemon(base, extraction.pid)
        svg = asyncio.run(shoot(url, 0.55))
    finally:
        _stop(extraction, "the extraction")
        _stop(daemon, "the daemon")
        if args.work is None:
            shutil.rmtree(base, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(svg)
    print(f"wrote {args.out} ({len(svg) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
