"""`make demo` for real: `hsmon extract` on the embedded default, `hsmon daemon` watching it, and
the dashboard: headless (what CI runs) and the real TUI in tmux, read with capture-pane."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_tui_e2e import Terminal, repo_env

pytestmark = pytest.mark.slow


def test_demo_headless_prints_status_until_done(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hsmon.demo", str(tmp_path / "demo"), "--headless", "--interval", "1"],
        cwd=tmp_path,
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert any("extract: RUNNING" in line and "tok/s" in line for line in lines), result.stdout
    done = [line for line in lines if "extract: DONE" in line]
    assert done, result.stdout
    rows = re.search(r"rows (\d+) / (\d+)", done[-1])
    assert rows and rows.group(1) == rows.group(2)  # every row of the sample, as the daemon counted it
    assert lines[-1].endswith("the daemon says done: OK")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (make test installs it)")
def test_demo_tui_in_tmux_follows_a_real_extraction(tmp_path: Path) -> None:
    env = repo_env()
    command = (
        f"cd {tmp_path} && env PYTHONPATH={env['PYTHONPATH']} TERM=xterm-256color "
        f"{sys.executable} -m hsmon.demo {tmp_path / 'demo'}; echo DEMO-EXITED-$?; sleep 600"
    )
    term = Terminal(command, 120, 40)
    try:
        term.wait_for(lambda s: "RUNNING" in s and "extractor" in s, "the extraction running", timeout=300)
        screen = term.wait_for(lambda s: "DONE" in s, "the extraction done", timeout=300)
        match = re.search(r"rows\s+━+\s+(\d+) / (\d+) \(100\.0%\)", screen)
        assert match and match.group(1) == match.group(2), screen
        term.keys("q")
        term.wait_for(lambda s: "DEMO-EXITED-0" in s, "the demo ending cleanly after q")
    finally:
        term.close()
