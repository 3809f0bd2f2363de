"""The reference drafter `make demo` shows beside its one-minute one: the same training command on the
same rows, for the acceptance bench's budget, made once and shipped in the repository.

    python -m hsmon.demo.reference [--seconds 570] [--out hsmon/demo/reference-drafter]

It prepares the demo's rows for the embedded target, runs `hsmon extract`, then `hsmon train` with the
demo's own settings (`PROFILES["embedded"].train_fields`) except for more epochs and a time limit of
``--seconds`` (the bench's 570 s), and `hsmon export-drafter` (bf16, well under a megabyte) into the
output, with `hsmon-reference.json` saying how it was made and for which build of the target (a
fingerprint of its files: the demo skips a reference made for another build, and says so).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REFERENCE_DIR = Path(__file__).resolve().parent / "reference-drafter"
INFO = "hsmon-reference.json"
DEFAULT_SECONDS = 570.0  # bench/drafter_acceptance.py's training budget
EPOCHS = "100"  # more than fit in the budget (30 took 380 s on an idle 2-core machine)


def target_fingerprint(model_dir: Path) -> str:
    """The fingerprint `hsmon extract` records for a model directory (config, tokenizer, weight sizes)."""
    from extractor.prepare import model_fingerprint

    return model_fingerprint(Path(model_dir))


def find_reference(
    model_dir: Path, preset: str = "embedded", reference: Path = REFERENCE_DIR
) -> tuple[Path | None, str]:
    """(the reference drafter for ``model_dir``, or None; a line saying which and why)."""
    info_path = reference / INFO
    if not info_path.is_file():
        return None, f"no reference drafter in {reference} (python -m hsmon.demo.reference makes one)"
    info = json.loads(info_path.read_text())
    if preset != info.get("target"):
        return None, (
            f"the shipped reference drafter is for the {info.get('target')} target; for {preset}, "
            f"bench/drafter_acceptance.py --target {preset} trains one for 10 minutes (docs/train.md)"
        )
    if info.get("target_fingerprint") != target_fingerprint(model_dir):
        return None, (
            f"the reference drafter in {reference} was made for another build of the target; "
            "python -m hsmon.demo.reference remakes it"
        )
    seconds = info.get("train_seconds")
    steps = info.get("steps")
    return reference, f"reference drafter: the same command trained {seconds:.0f} s ({steps} steps)"


def _run(argv: list[str], log: Path) -> None:
    with open(log, "ab") as fh:
        proc = subprocess.run([sys.executable, "-m", "hsmon", *argv], stdout=fh, stderr=fh)
    if proc.returncode != 0:
        raise SystemExit(f"reference: hsmon {argv[0]} exited {proc.returncode}; see {log}")


def make_reference(out: Path, seconds: float, work: Path) -> dict[str, Any]:
    """Extract, train for ``seconds`` with the demo's settings, export into ``out`` (replaced)."""
    from hsmon.contracts import events as ev
    from hsmon.demo.prepare import PROFILES, prepare

    setup = prepare(work, "embedded")
    log = work / "reference.log"
    extract = ["extract", setup["data"], "--out", str(work / "extract"), "--model", setup["model"],
               "--events", str(work / "extract.jsonl"), "--chunk-size", "100"]  # fmt: skip
    _run(extract, log)
    fields = {**PROFILES["embedded"].train_fields, "epochs": EPOCHS}
    train = ["train", str(work / "extract"), "--target-model", setup["model"], "--out", str(work / "drafter"),
             "--events", str(work / "train.jsonl"), "--time-limit", f"{seconds:g}"]  # fmt: skip
    for key, value in fields.items():
        train += [f"--{key.replace('_', '-')}", value]
    started = time.monotonic()
    _run(train, log)
    events = list(ev.iter_events(work / "train.jsonl"))
    start = next(e for e in events if e["kind"] == "start")
    done = next(e for e in reversed(events) if e["kind"] == "done")
    staging = Path(tempfile.mkdtemp(prefix=".reference-", dir=out.parent))
    try:
        _run(["export-drafter", str(work / "drafter"), "--out", str(staging / "export")], log)
        export = staging / "export"
        command = " ".join(["hsmon", *train]).replace(str(work), "WORK")
        info = {
            "command": command.replace(setup["model"], "embedded"),
            "made_by": f"python -m hsmon.demo.reference --seconds {seconds:g}",
            "target": "embedded",
            "target_fingerprint": target_fingerprint(Path(setup["model"])),
            "rows": setup["rows"],
            "train_seconds": round(done["ts"] - start["ts"], 1),
            "wall_seconds": round(time.monotonic() - started, 1),
            "steps": done["step"],
            "tokens": done["tokens"],
            "eval_accs": done.get("eval_accs"),
            "time_limit_reached": done.get("time_limit_reached"),
            "made": time.strftime("%Y-%m-%d", time.gmtime()),
        }
        (export / INFO).write_text(json.dumps(info, indent=1) + "\n")
        export.chmod(0o755)
        for item in export.iterdir():
            item.chmod(0o644)  # package data, readable like the rest of the checkout
        if out.exists():
            shutil.rmtree(out)
        os.replace(export, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hsmon.demo.reference", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, help="training time limit (570)")
    parser.add_argument("--out", type=Path, default=REFERENCE_DIR, help="where the export goes")
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: temporary)")
    args = parser.parse_args(argv)
    if args.seconds < 1:
        parser.error(f"--seconds {args.seconds}: must be at least 1")
    work = args.work or Path(tempfile.mkdtemp(prefix="hsmon-reference-"))
    info = make_reference(args.out.resolve(), args.seconds, work)
    print(json.dumps(info, indent=1))
    print(f"reference drafter -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
