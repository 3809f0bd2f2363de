"""The demo's steps after the start, in a thread: wait for the extraction, launch the training through
the daemon, wait for it, evaluate. Talks to the daemon over HTTP and to children; never imports torch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsmon.demo.prepare import EVAL_DEPTH, PROFILES
from hsmon.status_doc import ENDED_STATES, StatusDocument

TRAIN_STOP_WAIT_S = 120.0  # a stopped training's checkpoint, on a loaded machine


def daemon_status(url: str) -> StatusDocument | None:
    """The daemon's status document (hsmon.status_doc), or None when it does not answer one."""
    import msgspec
    import requests

    from hsmon.status_doc import decode

    try:
        response = requests.get(f"{url}/api/v1/status", timeout=3)
        return decode(response.content) if response.ok else None
    except (requests.RequestException, msgspec.DecodeError):
        return None


def _job_state(url: str, name: str) -> str | None:
    doc = daemon_status(url)
    return next((job.state for job in doc.jobs if job.job == name), None) if doc else None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _events(path: Path) -> list[dict[str, Any]]:
    from hsmon.contracts import events as ev

    return list(ev.iter_events(path)) if path.is_file() else []


def eval_progress(path: Path) -> tuple[int, int | None]:
    """(decodes done, decodes in all) of an `hsmon eval-drafter --events` file; (0, None) before its start."""
    done, total = 0, None
    for event in _events(path):
        if event["kind"] in ("start", "rows") and isinstance(event.get("rows_total"), int):
            total = event["rows_total"]
        if event["kind"] == "rows" and isinstance(event.get("rows_done"), int):
            done = event["rows_done"]
    return done, total


@dataclass(frozen=True)
class DemoRun:
    """What the demo started: its folder, the daemon (URL, control token), the prepared target and
    data (``setup``), the extraction's process."""

    base: Path
    url: str
    token: str
    setup: dict[str, Any]
    extraction: subprocess.Popen[bytes] | None
    # DEMO_ARGS=--regenerate: the regeneration runs first; the extraction starts once it is done
    regeneration: subprocess.Popen[bytes] | None = None
    start_extraction: Callable[[], subprocess.Popen[bytes]] | None = None


class Pipeline:
    """The steps after the start, in a thread: wait for the extraction, launch the training through
    the daemon, wait for it, evaluate. ``say`` reports progress; ``results`` feeds the summary."""

    def __init__(
        self,
        run: DemoRun,
        train: bool,
        train_seconds: float,
        say: Callable[[str], None],
        on_launched: Callable[[str], None] = lambda job: None,
    ) -> None:
        base = run.base
        self.base, self.url, self.token, self.setup = base, run.url, run.token, run.setup
        self.extraction, self.train, self.train_seconds = run.extraction, train, train_seconds
        self.regeneration, self.start_extraction = run.regeneration, run.start_extraction
        self.say, self.on_launched = say, on_launched
        self.profile = PROFILES[run.setup.get("preset", "embedded")]
        self.out, self.events = base / "extract", base / "events.jsonl"
        self.drafter = base / "drafter"
        self.phase = "regenerating" if self.regeneration is not None else "extracting"
        self.phase_started = time.monotonic()
        self.results: dict[str, Any] = {}
        self.ok: bool | None = None
        self.train_pid: int | None = None
        self.eval_proc: subprocess.Popen[str] | None = None
        self.eval_prompts = self.profile.eval_prompts
        self.eval_events = base / "eval-events.jsonl"  # eval-drafter --events: the measurement as a job
        # called with the eval's PID and events file once it runs: the TUI watches it as a job
        self.on_eval_started: Callable[[int, Path], None] = lambda pid, events: None
        self.on_finished: Callable[[], None] = lambda: None  # once every step ended (the TUI's banner)
        self.cancel = threading.Event()
        self.thread = threading.Thread(target=self._run_safely, name="demo-pipeline", daemon=True)

    def _phase(self, name: str) -> None:
        self.phase, self.phase_started = name, time.monotonic()

    def _run_safely(self) -> None:
        try:
            self.ok = self._run()
        except Exception as exc:  # reported, not raised: the thread's end is what the caller waits for
            self.say(f"demo: {type(exc).__name__}: {exc}")
            self.ok = False
        finally:
            self._phase("finished")
            if not self.cancel.is_set():
                self.on_finished()

    def _wait_state(self, job: str, seconds: float = 15.0) -> str | None:
        """The daemon's state of ``job`` once it ended (done, stopped, dead, exited), else the last
        one after ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:  # read at least once: a TUI quit right after DONE still counts the extraction
            state = _job_state(self.url, job)
            if state in ENDED_STATES or time.monotonic() > deadline or self.cancel.wait(0.5):
                return state

    def _run(self) -> bool:
        if self.regeneration is not None:  # the target's own answers first (hsmon/demo/regenerate.py)
            from hsmon.demo.regenerate import finish_regeneration

            if not finish_regeneration(self) or self.start_extraction is None or self.cancel.is_set():
                return False
            self.extraction = self.start_extraction()
            self._phase("extracting")
        assert self.extraction is not None
        started = time.monotonic()
        while self.extraction.poll() is None:
            if self.cancel.wait(0.5):
                # a TUI quit just after DONE: the extraction has said done and is exiting
                finishing = any(e["kind"] == "done" for e in _events(self.events))
                try:
                    self.extraction.wait(timeout=10 if finishing else 0)
                except subprocess.TimeoutExpired:
                    return False
        state = self._wait_state("extract")
        done = next((e for e in reversed(_events(self.events)) if e["kind"] == "done"), None)
        if done:
            self.results["extraction"] = {
                "rows": done["rows_done"],
                "rejects": done.get("rejects", 0),
                "tokens": done["tokens_done"],
                "bytes": done["bytes_done"],
                "seconds": done["seconds"],
                "wall_seconds": time.monotonic() - started,
                "output": str(self.out),
            }
        ok = self.extraction.returncode == 0 and state == "done" and done is not None
        if ok and (done["rows_done"] != self.setup["rows"] or done.get("rejects")):
            self.say(f"demo: the extraction wrote {done['rows_done']} of {self.setup['rows']} rows "
                     f"({done.get('rejects', 0)} rejected); every row of the sample should pass")  # fmt: skip
            ok = False
        self.say(
            f"extraction exited {self.extraction.returncode}; the daemon says {state or 'nothing'}: "
            f"{'OK' if ok else 'FAILED'}"
        )
        if not ok or not self.train or self.cancel.is_set():
            return ok
        return self._train() and self._evaluate()

    def _train(self) -> bool:
        from hsmon.tui.sources import HttpStatusSource

        self._phase("training")
        fields = {
            "data_dir": str(self.out),
            "out_dir": str(self.drafter),
            "target_model": self.setup["model"],
            "time_limit": f"{self.train_seconds:g}",
            **self.profile.train_fields,
        }
        launched = HttpStatusSource(self.url, token=self.token).launch_training(fields)
        if not launched.ok or not launched.job:
            errors = launched.errors or ""
            self.say(f"demo: the daemon did not launch the training: {launched.message} {errors}")
            return False
        job = launched.job
        pidfile = self.drafter / "train.pid"
        self.train_pid = int(pidfile.read_text()) if pidfile.is_file() else None
        self.say(f"demo: {launched.message} (PID {self.train_pid}, {self.train_seconds:g} s of steps)")
        self.on_launched(job)
        events = self.drafter / "events.jsonl"
        ends = ("done", "stopped", "error")
        while _alive(self.train_pid) and not any(e["kind"] in ends for e in _events(events)):
            if self.cancel.wait(1.0):
                return False
        state = self._wait_state(job)
        seen = _events(events)
        start = next((e for e in seen if e["kind"] == "start"), None)
        done = next((e for e in reversed(seen) if e["kind"] == "done"), None)
        if done is None or state != "done":
            log = self.drafter / "train.log"
            self.say(f"demo: the training ended without `done` (the daemon says {state}); see {log}")
            return False
        self.results["training"] = {
            "job": job,
            "steps": done["step"],
            "tokens": done["tokens"],
            "seconds": done["ts"] - start["ts"] if start else None,
            "accs": done.get("eval_accs") or [],
            "time_limit_reached": done.get("time_limit_reached"),
            "rows": start.get("total_rows") if start else None,
            "held_out_rows": start.get("eval_rows") if start else None,
            "output": str(self.drafter),
            "wall_seconds": time.monotonic() - self.phase_started,
        }
        if done["step"] < 1 or not done.get("eval_accs"):
            self.say(f"demo: the training ended after {done['step']} steps without a held-out evaluation")
            return False
        self.say(f"training {job}: the daemon says done: OK")
        return True

    def _eval_drafter(self, drafter: Path, log_name: str, watched: bool = True) -> dict[str, Any] | None:
        """`hsmon eval-drafter --json` of ``drafter`` on the held-out prompts; None when it failed.
        ``watched``: announce it through ``on_eval_started`` (the TUI shows it as a job)."""
        profile = self.profile
        argv = [
            sys.executable, "-m", "hsmon", "eval-drafter",
            "--drafter", str(drafter),
            "--target-model", self.setup["model"],
            "--prompts", self.setup["prompts"],
            "--depth", str(EVAL_DEPTH),
            "--max-new-tokens", str(profile.eval_new_tokens),
            "--max-prompts", str(self.eval_prompts),
            "--threads", "1",
            "--json",
            "--events", str(self.eval_events),
        ]  # fmt: skip
        self.eval_events.unlink(missing_ok=True)
        started = time.monotonic()
        with open(self.base / log_name, "ab") as log:
            self.eval_proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True,
                                              start_new_session=True)  # stopped by the demo (stop())
            if watched:
                self.on_eval_started(self.eval_proc.pid, self.eval_events)
            stdout, _ = self.eval_proc.communicate()
        if self.cancel.is_set():
            return None  # stopped on purpose: the stop says so
        if self.eval_proc.returncode != 0:
            self.say(f"demo: eval-drafter exited {self.eval_proc.returncode}; see {self.base / log_name}")
            return None
        result = json.loads(stdout.strip().splitlines()[-1])
        result["seconds"] = time.monotonic() - started
        if not result["outputs_match_greedy"]:
            self.say("demo: speculative decoding did not reproduce the target's greedy output")
            return None
        return result

    def _evaluate(self) -> bool:
        from hsmon.demo.reference import find_reference

        self._phase("evaluating")
        count = min(self.setup["eval_prompts"], self.eval_prompts)
        self.say(f"demo: hsmon eval-drafter on {count} held-out prompts, depths 1..{EVAL_DEPTH}")
        result = self._eval_drafter(self.drafter, "eval.log")
        if result is None:
            return False
        self.results["acceptance"] = result
        (self.base / "acceptance.json").write_text(json.dumps(result, indent=1) + "\n")
        lengths = result["acceptance_length"]
        self.say(
            f"acceptance at depth {EVAL_DEPTH}: EAGLE-3 drafter {lengths['eagle3'][str(EVAL_DEPTH)]:.3f}, "
            f"n-gram {lengths['ngram'][str(EVAL_DEPTH)]:.3f} tokens per target forward"
        )
        reference, why = find_reference(Path(self.setup["model"]), self.setup.get("preset", "embedded"))
        self.results["reference_note"] = why
        if reference is None:
            self.say(f"demo: {why}")
            return True
        self.say(f"demo: {why}: eval-drafter on the same prompts")
        self.eval_events = self.base / "eval-reference-events.jsonl"  # headless lines follow this one now
        ref = self._eval_drafter(reference, "eval-reference.log", watched=False)
        if ref is None:
            return False
        same = ref["acceptance_length"]["ngram"] == lengths["ngram"]
        if not same or ref["greedy_outputs"] != result["greedy_outputs"]:
            self.say("demo: the two evaluations did not see the same prompts and outputs")
            return False
        self.results["reference"] = ref
        (self.base / "acceptance-reference.json").write_text(json.dumps(ref, indent=1) + "\n")
        self.say(
            f"acceptance at depth {EVAL_DEPTH}: reference drafter "
            f"{ref['acceptance_length']['eagle3'][str(EVAL_DEPTH)]:.3f} tokens per target forward"
        )
        return True

    def stop(self) -> list[str]:
        """Cancel what is left, as `q` and a stop signal do: the evaluation ends, the pipeline's
        thread returns, then a training still running gets SIGTERM and is waited for (it writes its
        checkpoint first; it runs in a session of its own, so only this reaches it). What was
        stopped, in words."""
        from hsmon.demo.stopping import training_stopped_at
        from hsmon.launch.training import stop_job

        stopped = []
        self.cancel.set()
        if self.eval_proc is not None and self.eval_proc.poll() is None:
            self.eval_proc.terminate()
            stopped.append("the evaluation")
        self.thread.join(timeout=20)
        pid = self.train_pid or _pid_in(self.drafter / "train.pid")  # launched as the thread was cancelled
        if _running(pid) and stop_job(pid):  # type: ignore[arg-type]
            print(f"demo: stopping the training (PID {pid}): it writes a checkpoint first", flush=True)
            deadline = time.monotonic() + TRAIN_STOP_WAIT_S
            while _running(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if _running(pid):
                os.kill(pid, signal.SIGKILL)  # type: ignore[arg-type]
                stopped.append(f"the training (killed: no checkpoint within {TRAIN_STOP_WAIT_S:g} s)")
            else:
                stopped.append(f"the training ({training_stopped_at(self.drafter)})")
        return stopped


def _pid_in(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _running(pid: int | None) -> bool:
    """Whether ``pid`` runs (a zombie no longer does: its parent, maybe gone, has not reaped it yet)."""
    import psutil

    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
