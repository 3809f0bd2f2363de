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
from hsmon.contracts import stop_signals
from hsmon.contracts.port_holder import port_refusal
from hsmon.contracts.units import port_number
from hsmon.demo.pipeline import DemoRun, Pipeline
from hsmon.demo.prepare import EVAL_PROMPTS, PROFILES
from hsmon.demo.report import finish_eval_in_terminal, headless, summary
from hsmon.demo.stopping import DemoStop


def _stop(proc: subprocess.Popen[bytes] | None, name: str) -> bool:
    """SIGTERM to a child still running (SIGKILL after 15 s); whether it was running."""
    if proc is None:
        return False
    running = proc.poll() is None
    if running:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        stop_signals.say(f"demo: {name} did not stop on SIGTERM; killing it")
        proc.kill()
        proc.wait()
    return running


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
    parser.add_argument("--port", type=port_number, default=0, metavar="PORT",
                        help="the daemon's port (default 0: any free one; 9108 lets `hsmon status` and "
                        "`hsmon tui` in another terminal read it with their defaults)")
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.prepare:
        return args
    if args.interval <= 0:
        parser.error(f"--interval {args.interval}: must be a positive number of seconds")
    if args.online and args.port:
        parser.error(f"--port {args.port}: the online recipe's daemon is `hsmon online --daemon`'s "
                     "(on any free port); leave --port out")
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
            start_new_session=True,  # the terminal's Ctrl-C reaches the demo alone: it stops each in order
        )  # fmt: skip


def start_daemon(base: Path, extraction_pid: int | None, port: int = 0,
                 config: Path | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """A real `hsmon daemon` watching the extraction (and ``config``'s jobs), with the control token,
    on ``port`` (0: any free one); (process, URL). No ``extraction_pid``: the extraction starts later,
    its PID read from its events."""
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
            port=port,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )  # fmt: skip


def make_pipeline(run: DemoRun, args: argparse.Namespace, interactive: bool, stop: DemoStop) -> Pipeline:
    """The pipeline's thread, started: status lines headless; under the TUI its notices and the
    training to follow go to the dashboard (``stop.app``)."""
    if not interactive:
        started = time.monotonic()

        def say(text: str) -> None:
            print(f"[{time.monotonic() - started:6.1f}s] {text}", flush=True)

        pipeline = Pipeline(run, not args.no_train, args.train_seconds, say)
    else:
        from hsmon.tui.app import HsmonApp
        from hsmon.tui.sources import HttpStatusSource

        os.environ.pop("COLUMNS", None)
        os.environ.pop("LINES", None)
        stop.app = HsmonApp([HttpStatusSource(run.url, token=run.token)])
        hooks = TuiHooks(stop.app, run.base / "demo.log")
        pipeline = Pipeline(run, not args.no_train, args.train_seconds, hooks.notify, hooks.follow_training)
        pipeline.on_eval_started = hooks.watch_eval
        pipeline.on_finished = lambda: hooks.finished(pipeline)
    pipeline.eval_prompts = args.eval_prompts
    pipeline.thread.start()
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

    def finished(self, pipeline: Pipeline) -> None:
        """Every step ended: the verdict as a banner over the summary, on screen until q or escape."""
        from hsmon.tui.screens.banner import BannerScreen

        ok = bool(pipeline.ok)
        title = "demo: OK: every step went through" if ok else "demo: FAILED (see the notices and the logs)"
        with open(self.demo_log, "a") as fh:
            fh.write(title + "\n")
        closing = ("q quits (the summary is printed again in the terminal) · escape: back to the dashboard, "
                   "whose jobs keep their last state")
        self._call(self.app.push_screen, BannerScreen(title, summary(pipeline), ok, closing))

    def watch_eval(self, pid: int, events: Path) -> None:
        # The measurement is a job of this dashboard (a monitor in this process watches its
        # events and PID): a tab while it runs, its acceptance lengths on the training screen.
        from hsmon.core.config import JobConfig
        from hsmon.tui.sources import InProcessSource

        job = JobConfig(name="eval-drafter", kind="external", events=str(events), pid=pid, role="trainer")
        self._call(self.app.add_source, InProcessSource([job]))


def run_in_tui(pipeline: Pipeline, stop: DemoStop) -> None:
    """The dashboard until the user quits (or a stop signal quits it); when it quits early, the
    pipeline stops, but an evaluation under way finishes in the terminal unless a signal came."""
    stop.app.run()
    stop.app = None
    if stop.signum is None and pipeline.thread.is_alive() and pipeline.phase == "evaluating":
        finish_eval_in_terminal(pipeline)
    if pipeline.thread.is_alive() and pipeline.extraction is not None and pipeline.extraction.poll() is None:
        print("demo: stopping the extraction (run `make demo` again to start over)")


def main(argv: list[str] | None = None) -> int:
    """`make demo`: every step of the pipeline, then the summary and the verdict (exit 0 when OK;
    128 + the signal when Ctrl-C, SIGTERM or a lost terminal stopped it: hsmon/demo/stopping.py)."""
    args = parse_args(argv)
    base = Path(args.dir).resolve()
    if args.prepare:
        return prepare_here(base, args.model)
    taken = port_refusal("127.0.0.1", args.port, '--port (DEMO_ARGS="--port N"; 0: any free port)')
    if taken:  # said before anything starts
        print(f"demo: {taken}", file=sys.stderr)
        return 2
    interactive = not args.headless and sys.stdout.isatty() and sys.stdin.isatty()
    base.mkdir(parents=True, exist_ok=True)
    stop = DemoStop()
    try:
        code = run_demo(args, base, interactive, stop)
    except stop_signals.Interrupted:
        code = 1  # the clean-up ran on the way out; the line below says what it stopped
    finally:
        stop.restore()
    if stop.signum is not None:
        stop_signals.say(stop.line(stop.stopped))
        return stop_signals.exit_status(stop.signum)
    return code


def path_hint() -> str | None:
    """How to get this installation's `hsmon` on PATH (the tour's commands), when it is not there."""
    bin_dir = Path(sys.executable).parent
    mine = bin_dir / "hsmon"
    found = shutil.which("hsmon")
    if not mine.exists() or (found and Path(found).resolve() == mine.resolve()):
        return None
    activate = bin_dir / "activate"
    how = f"`source {activate}`" if activate.exists() else f"add {bin_dir} to PATH"
    return f"demo: the tour's commands need hsmon on PATH: {how} (or run {mine})"


def prepare_here(base: Path, model: str) -> int:
    """The child's side of `prepare_in_child`: the set-up as one JSON line (a stop signal: no trace)."""
    from hsmon.demo.prepare import prepare

    previous = stop_signals.raise_on_stop()
    try:
        print(json.dumps(prepare(base, model)))
    except (stop_signals.Interrupted, KeyboardInterrupt):
        return 1
    finally:
        stop_signals.restore(previous)
    return 0


def run_demo(args: argparse.Namespace, base: Path, interactive: bool, stop: DemoStop) -> int:
    """Prepare, start the extraction and the daemon, run the pipeline; stop every child on the way out."""
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
            daemon, url = start_daemon(base, extraction.pid if extraction else None, args.port,
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
        pipeline = make_pipeline(run, args, interactive, stop)
        if interactive:
            run_in_tui(pipeline, stop)
        else:
            headless(run.url, pipeline, args.interval, started)
        for line in summary(pipeline):
            print(line, flush=True)
        ok = bool(pipeline.ok)
        verdict = "OK" if ok else "FAILED or interrupted"
        if stop.signum is None:
            hint = path_hint()
            if hint:
                print(hint, flush=True)
            print(f"demo: {verdict} in {time.monotonic() - started:.0f} s", flush=True)
        return 0 if ok else 1
    finally:
        stop.stopped = pipeline.stop() if pipeline is not None else []
        if pipeline is not None:
            extraction = pipeline.extraction  # started by the pipeline after a regeneration
        for proc, name in ((regeneration, "the regeneration"), (extraction, "the extraction"),
                           (daemon, "the daemon")):
            if _stop(proc, name):
                stop.stopped.append(name)


if __name__ == "__main__":
    raise SystemExit(main())
