"""The demo command: start the extraction and the daemon, run the pipeline under the TUI or headless,
print the summary and the verdict, and stop every child it started."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import hsmon.demo as demo_package
from hsmon import daemon as daemon_process
from hsmon.demo.pipeline import Pipeline
from hsmon.demo.prepare import EVAL_PROMPTS, PROFILES
from hsmon.demo.report import finish_eval_in_terminal, headless, summary


def _stop(proc: subprocess.Popen[bytes] | None, name: str) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        print(f"demo: {name} did not stop on SIGTERM; killing it", file=sys.stderr)
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hsmon.demo",
        description=demo_package.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dir", nargs="?", default="demo-out", help="working directory (default demo-out)")
    parser.add_argument("--headless", action="store_true", help="print status lines instead of the TUI")
    parser.add_argument("--no-train", action="store_true", help="stop after the extraction")
    parser.add_argument(
        "--train-seconds", type=float, default=60.0, help="time limit of the training's steps (default 60)"
    )
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between status lines (headless)")
    parser.add_argument(
        "--model",
        choices=sorted(PROFILES),
        default="embedded",
        help="target preset: embedded (default, fast) or smollm2 (SmolLM2-135M-Instruct; fewer rows)",
    )
    parser.add_argument(
        "--eval-prompts",
        type=int,
        default=None,
        help=f"held-out prompts eval-drafter uses (default: the target's, 4 or 3; at most {EVAL_PROMPTS})",
    )
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    base = Path(args.dir).resolve()
    if args.prepare:
        from hsmon.demo.prepare import prepare

        print(json.dumps(prepare(base, args.model)))
        return 0
    if args.interval <= 0:
        parser.error(f"--interval {args.interval}: must be a positive number of seconds")
    if args.train_seconds < 1:
        parser.error(f"--train-seconds {args.train_seconds}: must be at least 1 second")
    if args.eval_prompts is None:
        args.eval_prompts = PROFILES[args.model].eval_prompts
    if not 1 <= args.eval_prompts <= EVAL_PROMPTS:
        parser.error(
            f"--eval-prompts {args.eval_prompts}: give 1 to {EVAL_PROMPTS} (the held-out prompts there are)"
        )
    interactive = not args.headless and sys.stdout.isatty() and sys.stdin.isatty()

    base.mkdir(parents=True, exist_ok=True)
    print(f"demo: preparing the {args.model} target and the sample dataset (a first run makes the target)",
          flush=True)  # fmt: skip
    preparing = time.monotonic()
    made = subprocess.run(
        [sys.executable, "-m", "hsmon.demo", "--prepare", "--model", args.model, str(base)],
        stdout=subprocess.PIPE,
        text=True,
    )
    if made.returncode != 0:
        print("demo: preparing failed; see the messages above", file=sys.stderr)
        return 1
    setup = json.loads(made.stdout.strip().splitlines()[-1])
    setup["prepare_seconds"] = time.monotonic() - preparing
    print(f"demo: prepared in {setup['prepare_seconds']:.1f} s: {setup['model']}", flush=True)
    out, events = base / "extract", base / "events.jsonl"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(base / "drafter", ignore_errors=True)  # a fresh training, not a resumed one
    events.unlink(missing_ok=True)
    token_file = base / "control-token"
    token = secrets.token_hex(16)
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    port_file = base / "daemon.port"

    extraction = daemon = None
    pipeline: Pipeline | None = None
    try:
        with open(base / "extract.log", "ab") as log:
            extraction = subprocess.Popen(
                [
                    sys.executable, "-m", "hsmon", "extract", setup["data"],
                    "--out", str(out),
                    "--model", setup["model"],
                    "--events", str(events),
                    "--chunk-size", "100",
                    "--min-free", "100M",
                    "--heartbeat", "1",
                ],
                stdout=log,
                stderr=log,
            )  # fmt: skip
        try:
            with open(base / "daemon.log", "ab") as log:
                daemon, url = daemon_process.spawn(
                    [
                        "--job", "extract",
                        "--kind", "extract",
                        "--out", str(out),
                        "--events", str(events),
                        "--pid", str(extraction.pid),
                        "--control-token-file", str(token_file),
                        "--scan-interval", "1",
                    ],
                    port_file,
                    stdout=log,
                    stderr=log,
                )  # fmt: skip
        except daemon_process.DaemonStartError as exc:
            print(f"demo: {exc}; see {base / 'daemon.log'}", file=sys.stderr)
            return 1
        print(f"demo: extraction pid {extraction.pid} ({setup['rows']} rows) -> {out}", flush=True)
        print(f"demo: daemon {url} (metrics {url}/metrics); logs in {base}", flush=True)
        if not args.no_train:
            print(
                f"demo: then a drafter training through the daemon ({args.train_seconds:g} s of steps) "
                f"and hsmon eval-drafter on {setup['eval_prompts']} held-out prompts",
                flush=True,
            )
        started = time.monotonic()

        if not interactive:

            def say(text: str) -> None:
                print(f"[{time.monotonic() - started:6.1f}s] {text}", flush=True)

            pipeline = Pipeline(
                base, url, token, setup, extraction, not args.no_train, args.train_seconds, say
            )
            pipeline.eval_prompts = args.eval_prompts
            pipeline.thread.start()
            headless(url, pipeline, args.interval, started)
        else:
            from hsmon.tui.app import HsmonApp
            from hsmon.tui.sources import HttpStatusSource

            os.environ.pop("COLUMNS", None)
            os.environ.pop("LINES", None)
            app = HsmonApp([HttpStatusSource(url, token=token)])
            demo_log = base / "demo.log"

            def notify(text: str) -> None:
                with open(demo_log, "a") as fh:
                    fh.write(text + "\n")
                # RuntimeError: the app is not running (not started yet, or quit)
                with contextlib.suppress(RuntimeError):
                    app.call_from_thread(app.notify, text, title="demo", timeout=8)

            def follow_training(job: str) -> None:
                def show() -> None:
                    app.launched = (0, job)
                    app.switch_mode("training")

                with contextlib.suppress(RuntimeError):
                    app.call_from_thread(show)

            def watch_eval(pid: int, events: Path) -> None:
                # The measurement is a job of this dashboard (a monitor in this process watches its
                # events and PID): a tab while it runs, its acceptance lengths on the training screen.
                from hsmon.config import JobConfig
                from hsmon.tui.sources import InProcessSource

                job = JobConfig(
                    name="eval-drafter", kind="external", events=str(events), pid=pid, role="trainer"
                )
                with contextlib.suppress(RuntimeError):
                    app.call_from_thread(app.add_source, InProcessSource([job]))

            train = not args.no_train
            pipeline = Pipeline(
                base, url, token, setup, extraction, train, args.train_seconds, notify, follow_training
            )
            pipeline.eval_prompts = args.eval_prompts
            pipeline.on_eval_started = watch_eval
            pipeline.thread.start()
            app.run()
            if pipeline.thread.is_alive() and pipeline.phase == "evaluating":
                finish_eval_in_terminal(pipeline)
            if pipeline.thread.is_alive():
                if extraction.poll() is None:
                    print("demo: stopping the extraction (run `make demo` again to start over)")
                pipeline.stop()
        for line in summary(pipeline):
            print(line, flush=True)
        ok = bool(pipeline.ok)
        verdict = "OK" if ok else "FAILED or interrupted"
        print(f"demo: {verdict} in {time.monotonic() - started:.0f} s", flush=True)
        return 0 if ok else 1
    finally:
        if pipeline is not None:
            pipeline.stop()
        _stop(extraction, "the extraction")
        _stop(daemon, "the daemon")


if __name__ == "__main__":
    raise SystemExit(main())
