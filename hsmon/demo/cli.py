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
from typing import Any

import hsmon.demo as demo_package
from hsmon import daemon as daemon_process
from hsmon.demo.pipeline import DemoRun, Pipeline
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The demo's options, checked (a bad value exits with one line naming it)."""
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
    parser.add_argument(
        "--online",
        action="store_true",
        help="the online recipe instead: `hsmon online` (extract and train --follow --passes 2 "
        "at once, with the daemon; 3x --train-seconds of steps at most), then eval-drafter (headless)",
    )
    parser.add_argument(
        "--regenerate",
        action="store_true",
        help="the target's own answers first: `hsmon regenerate` of the sample (watched by the daemon and "
        "the dashboard), then the extraction reads them (docs/regenerate.md)",
    )
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.prepare:
        return args
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
    return args


def prepare_in_child(base: Path, model: str) -> dict[str, Any] | None:
    """The target, the sample dataset and the held-out prompts, made in a child (torch stays out of
    this process); None when that failed (the child said why)."""
    print(f"demo: preparing the {model} target and the sample dataset (a first run makes the target)",
          flush=True)  # fmt: skip
    preparing = time.monotonic()
    made = subprocess.run(
        [sys.executable, "-m", "hsmon.demo", "--prepare", "--model", model, str(base)],
        stdout=subprocess.PIPE,
        text=True,
    )
    if made.returncode != 0:
        print("demo: preparing failed; see the messages above", file=sys.stderr)
        return None
    setup = json.loads(made.stdout.strip().splitlines()[-1])
    setup["prepare_seconds"] = time.monotonic() - preparing
    print(f"demo: prepared in {setup['prepare_seconds']:.1f} s: {setup['model']}", flush=True)
    return setup


def fresh_start(base: Path) -> str:
    """Remove an earlier demo's extraction, training and events; a new control token (returned)."""
    shutil.rmtree(base / "extract", ignore_errors=True)
    shutil.rmtree(base / "drafter", ignore_errors=True)  # a fresh training, not a resumed one
    shutil.rmtree(base / "regen", ignore_errors=True)
    for name in ("events.jsonl", "regen-events.jsonl"):
        (base / name).unlink(missing_ok=True)
    token = secrets.token_hex(16)
    token_file = base / "control-token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    return token


def start_extraction(base: Path, setup: dict[str, Any]) -> subprocess.Popen[bytes]:
    """A real `hsmon extract` of the sample into base/extract, logging to base/extract.log."""
    with open(base / "extract.log", "ab") as log:
        return subprocess.Popen(
            [
                sys.executable, "-m", "hsmon", "extract", setup["data"],
                "--out", str(base / "extract"),
                "--model", setup["model"],
                "--events", str(base / "events.jsonl"),
                "--chunk-size", "100",
                "--min-free", "100M",
                "--heartbeat", "1",
            ],
            stdout=log,
            stderr=log,
        )  # fmt: skip


def start_daemon(base: Path, extraction_pid: int | None,
                 config: Path | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """A real `hsmon daemon` watching the extraction (and ``config``'s jobs), with the control token;
    (process, URL). No ``extraction_pid``: the extraction starts later, its PID read from its events."""
    with open(base / "daemon.log", "ab") as log:
        return daemon_process.spawn(
            [
                *(["--config", str(config)] if config is not None else []),
                "--job", "extract",
                "--kind", "extract",
                "--out", str(base / "extract"),
                "--events", str(base / "events.jsonl"),
                *(["--pid", str(extraction_pid)] if extraction_pid is not None else []),
                "--control-token-file", str(base / "control-token"),
                "--scan-interval", "1",
            ],
            base / "daemon.port",
            stdout=log,
            stderr=log,
        )  # fmt: skip


def run_headless(run: DemoRun, args: argparse.Namespace, started: float) -> Pipeline:
    """The pipeline with a status line per job every ``--interval`` seconds."""

    def say(text: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {text}", flush=True)

    pipeline = Pipeline(run, not args.no_train, args.train_seconds, say)
    pipeline.eval_prompts = args.eval_prompts
    pipeline.thread.start()
    headless(run.url, pipeline, args.interval, started)
    return pipeline


class TuiHooks:
    """What the pipeline's thread tells the dashboard: notices, the training to follow, the eval job."""

    def __init__(self, app: Any, demo_log: Path) -> None:
        self.app = app
        self.demo_log = demo_log

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the app is not running (not started yet, or quit)
            self.app.call_from_thread(fn, *args, **kwargs)

    def notify(self, text: str) -> None:
        with open(self.demo_log, "a") as fh:
            fh.write(text + "\n")
        self._call(self.app.notify, text, title="demo", timeout=8)

    def follow_training(self, job: str) -> None:
        def show() -> None:
            self.app.launched = (0, job)
            self.app.switch_mode("training")

        self._call(show)

    def watch_eval(self, pid: int, events: Path) -> None:
        # The measurement is a job of this dashboard (a monitor in this process watches its
        # events and PID): a tab while it runs, its acceptance lengths on the training screen.
        from hsmon.core.config import JobConfig
        from hsmon.tui.sources import InProcessSource

        job = JobConfig(name="eval-drafter", kind="external", events=str(events), pid=pid, role="trainer")
        self._call(self.app.add_source, InProcessSource([job]))


def run_in_tui(run: DemoRun, args: argparse.Namespace) -> Pipeline:
    """The pipeline under the TUI on the daemon; when the TUI quits early, the pipeline stops."""
    from hsmon.tui.app import HsmonApp
    from hsmon.tui.sources import HttpStatusSource

    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)
    app = HsmonApp([HttpStatusSource(run.url, token=run.token)])
    hooks = TuiHooks(app, run.base / "demo.log")
    pipeline = Pipeline(run, not args.no_train, args.train_seconds, hooks.notify,
                        hooks.follow_training)
    pipeline.eval_prompts = args.eval_prompts
    pipeline.on_eval_started = hooks.watch_eval
    pipeline.thread.start()
    app.run()
    if pipeline.thread.is_alive() and pipeline.phase == "evaluating":
        finish_eval_in_terminal(pipeline)
    if pipeline.thread.is_alive():
        if pipeline.extraction is not None and pipeline.extraction.poll() is None:
            print("demo: stopping the extraction (run `make demo` again to start over)")
        pipeline.stop()
    return pipeline


def main(argv: list[str] | None = None) -> int:
    """`make demo`: every step of the pipeline, then the summary and the verdict (exit 0 when OK)."""
    args = parse_args(argv)
    base = Path(args.dir).resolve()
    if args.prepare:
        from hsmon.demo.prepare import prepare

        print(json.dumps(prepare(base, args.model)))
        return 0
    interactive = not args.headless and sys.stdout.isatty() and sys.stdin.isatty()
    base.mkdir(parents=True, exist_ok=True)
    setup = prepare_in_child(base, args.model)
    if setup is None:
        return 1
    if args.online:
        from hsmon.demo.online import run_online

        return run_online(base, setup, args.train_seconds, args.eval_prompts)
    token = fresh_start(base)
    extraction = daemon = regeneration = None
    pipeline: Pipeline | None = None
    try:
        if args.regenerate:
            from hsmon.demo.regenerate import daemon_config, start_regeneration

            regeneration = start_regeneration(base, setup)
            (base / "extract").mkdir()  # watched from the start: written once the answers are in
            print(f"demo: regeneration pid {regeneration.pid} ({setup['rows']} rows) -> {base / 'regen'}; "
                  "then the extraction of the target's own answers", flush=True)
        else:
            extraction = start_extraction(base, setup)
        try:
            daemon, url = start_daemon(base, extraction.pid if extraction else None,
                                       daemon_config(base) if regeneration else None)
        except daemon_process.DaemonStartError as exc:
            print(f"demo: {exc}; see {base / 'daemon.log'}", file=sys.stderr)
            return 1
        out = base / "extract"
        if extraction is not None:
            print(f"demo: extraction pid {extraction.pid} ({setup['rows']} rows) -> {out}", flush=True)
        print(f"demo: daemon {url} (metrics {url}/metrics); logs in {base}", flush=True)
        if not args.no_train:
            print(
                f"demo: then a drafter training through the daemon ({args.train_seconds:g} s of steps) "
                f"and hsmon eval-drafter on {setup['eval_prompts']} held-out prompts",
                flush=True,
            )
        started = time.monotonic()
        regenerated = {**setup, "data": str(base / "regen")}
        run = DemoRun(base, url, token, setup, extraction, regeneration,
                      lambda: start_extraction(base, regenerated))
        pipeline = run_in_tui(run, args) if interactive else run_headless(run, args, started)
        for line in summary(pipeline):
            print(line, flush=True)
        ok = bool(pipeline.ok)
        verdict = "OK" if ok else "FAILED or interrupted"
        print(f"demo: {verdict} in {time.monotonic() - started:.0f} s", flush=True)
        return 0 if ok else 1
    finally:
        if pipeline is not None:
            pipeline.stop()
            extraction = pipeline.extraction
        _stop(regeneration, "the regeneration")
        _stop(extraction, "the extraction")
        _stop(daemon, "the daemon")


if __name__ == "__main__":
    raise SystemExit(main())
