"""Launching and stopping a drafter training (`hsmon train`), shared by the TUI and the daemon.

    req, errors = validate_training_request(form_fields)   # field -> one-line error
    job = launch_training(req)                              # detached; survives its parent
    stop_job(job.pid)                                       # SIGTERM: checkpoint, then exit

No heavy imports: the monitor side imports this module.
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hsmon.contracts import events as ev
from hsmon.contracts import layout, spool
from hsmon.contracts.manifest_reader import read_manifest
from hsmon.contracts.train_defaults import checkpoint_step_in
from hsmon.launch import unit as launch_unit
from hsmon.launch.child import LOG_NAME, LaunchSpec, open_child, write_pidfile
from hsmon.launch.paths import PathRule, checked_paths

FIELDS = (
    "data_dir",
    "target_model",
    "out_dir",
    "epochs",
    "lr",
    "batch_tokens",
    "ttt_length",
    "arch",
    "draft_vocab_size",
    "gpus",
    "time_limit",
    "threads",
    "follow",
    "passes",
    "consume",
    "resume",
    "restart",
)
# drafter architectures of `hsmon train --arch` (trainer/model.py ARCHS; no torch import here)
ARCHS = ("eagle3", "eagle3.1")
EVENTS_NAME = "events.jsonl"


@dataclass
class TrainingRequest:
    data_dir: str
    out_dir: str
    target_model: str | None = None  # None: the embedded default target
    epochs: int | None = None  # None: hsmon train's default
    lr: float | None = None
    batch_tokens: int | None = None
    ttt_length: int | None = None
    arch: str | None = None  # drafter architecture (eagle3, eagle3.1); None: hsmon train's default
    draft_vocab_size: int | None = None
    gpus: int = 1
    time_limit: float | None = None  # seconds of steps; None: no limit
    threads: int | None = None  # torch CPU threads per process; None: torch's default
    # online: train while the extraction writes data_dir (`hsmon train --follow`)
    follow: bool = False
    passes: int | None = None  # with follow: batches each row is in (--passes E)
    consume: bool = False  # with follow: delete a chunk's rows once they had their passes
    resume: bool = False  # go on from out_dir's latest checkpoint (hsmon train --resume)
    restart: bool = False  # remove out_dir's checkpoints and start at step 0 (hsmon train --restart)
    roots: tuple[str, ...] = ()  # the allowed roots its paths were checked against (hsmon/launch/paths.py)
    job: str | None = None  # the name the launcher chose (hsmon/launch/watch.py: unique per path)

    @property
    def events_path(self) -> str:
        """OUT/events.jsonl; a following trainer's go in the spool (the spool contract), where the monitor
        reads the online job's consumer side."""
        if self.follow:
            return str(spool.train_events_path(self.data_dir))
        return os.path.join(self.out_dir, EVENTS_NAME)

    @property
    def job_name(self) -> str:
        """``job``, or train-BASENAME of out_dir (hsmon/launch/watch.py makes it unique per path)."""
        if self.job:
            return self.job
        base = "".join(c if c.isalnum() or c in "_.-" else "-" for c in os.path.basename(self.out_dir))
        return f"train-{base or 'out'}"[:57]


@dataclass
class LaunchedJob:
    pid: int
    job: str
    events: str
    out_dir: str
    log: str
    argv: list[str] = field(default_factory=list)
    unit: str | None = None  # the transient systemd unit it runs as, when it does

    def as_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "job": self.job,
            "events": self.events,
            "out_dir": self.out_dir,
            "log": self.log,
            "argv": self.argv,
            "unit": self.unit,
        }


def _number(
    fields: dict[str, Any], name: str, kind: type, low: float, high: float | None, errors: dict[str, str]
) -> Any:
    raw = fields.get(name)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    try:
        if isinstance(raw, bool):
            raise ValueError
        value = kind(raw.strip() if isinstance(raw, str) else raw)
        if kind is int and isinstance(raw, float) and raw != int(raw):
            raise ValueError
    except (TypeError, ValueError):
        errors[name] = f"{name} must be {'a whole number' if kind is int else 'a number'} (got {raw!r})"
        return None
    if not math.isfinite(value):
        errors[name] = f"{name} must be a finite number (got {raw!r})"
        return None
    if value < low or (high is not None and value > high):
        upper = f" and at most {high:g}" if high is not None else ""
        errors[name] = f"{name} must be at least {low:g}{upper} (got {value:g})"
        return None
    return value


def validate_training_request(
    fields: dict[str, Any], rule: PathRule | None = None, form: bool = False
) -> tuple[TrainingRequest | None, dict[str, str]]:
    """Check a launch form; returns (request, {}) or (None, {field: one-line error}). ``rule``: who
    names the paths and where they may lie (hsmon/launch/paths.py; default: a local user, anywhere).
    ``form``: the errors speak of the dashboard's buttons (Resume) rather than the API's fields."""
    rule = rule or PathRule()
    errors: dict[str, str] = {}
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        errors["_"] = f"unknown field(s) {', '.join(unknown)}; known: {', '.join(FIELDS)}"

    data, out, target = checked_paths(fields, rule, errors)

    epochs = _number(fields, "epochs", int, 1, 10_000, errors)
    lr = _number(fields, "lr", float, 1e-9, 1.0, errors)
    batch_tokens = _number(fields, "batch_tokens", int, 1, None, errors)
    ttt_length = _number(fields, "ttt_length", int, 1, 64, errors)
    arch = str(fields.get("arch") or "").strip() or None
    if arch is not None and arch not in ARCHS:
        errors["arch"] = f"arch must be one of {', '.join(ARCHS)} (got {arch!r}); empty: eagle3.1"
    draft_vocab = _number(fields, "draft_vocab_size", int, 1, None, errors)
    gpus = _number(fields, "gpus", int, 1, 1024, errors)
    time_limit = _number(fields, "time_limit", float, 1, None, errors)
    threads = _number(fields, "threads", int, 1, 1024, errors)
    follow = _yes_no(fields, "follow", errors)
    passes = _number(fields, "passes", int, 1, 1000, errors)
    consume = _yes_no(fields, "consume", errors)
    if not follow:
        for name, given in (("passes", passes is not None and passes != 1), ("consume", consume)):
            if given and name not in errors:
                errors[name] = f"{name} goes with follow (hsmon train --follow): set follow to yes"
    resume, restart = _yes_no(fields, "resume", errors), _yes_no(fields, "restart", errors)
    if resume and restart:
        errors["restart"] = "restart starts over, resume goes on: give one of them"
    step = checkpoint_step_in(out) if out is not None and not follow else None
    if step is not None and not (resume or restart) and "out_dir" not in errors:
        errors["out_dir"] = over_checkpoint_error(str(out), step, form)
    if errors:
        return None, errors
    assert data is not None and out is not None
    return TrainingRequest(
        data_dir=str(data),
        out_dir=str(out),
        target_model=str(target) if target else None,
        epochs=epochs,
        lr=lr,
        batch_tokens=batch_tokens,
        ttt_length=ttt_length,
        arch=arch,
        draft_vocab_size=draft_vocab,
        gpus=gpus or 1,
        time_limit=time_limit,
        threads=threads,
        follow=follow,
        passes=passes if follow else None,
        consume=consume,
        resume=resume,
        restart=restart,
        roots=rule.roots,
    ), {}


def over_checkpoint_error(out_dir: str, step: int, form: bool) -> str:
    """Why a fresh launch into ``out_dir`` is refused: a training's checkpoint is there (no silent
    restart), and the ways on in the words of who asked."""
    if form:
        return (f"{out_dir} holds a checkpoint at step {step}: Resume goes on from it; for a new training "
                "choose another output directory")
    return (f"{out_dir} holds a checkpoint at step {step}: resume (yes) goes on from it, restart (yes) "
            "starts over at step 0 and removes it")


def _yes_no(fields: dict[str, Any], name: str, errors: dict[str, str]) -> bool:
    """A yes/no field: a bool, or yes/no, true/false, on/off, 1/0 (empty: no)."""
    raw = fields.get(name)
    if isinstance(raw, bool):
        return raw
    text = str(raw if raw is not None else "").strip().lower()
    if text in ("", "no", "false", "off", "0", "n"):
        return False
    if text in ("yes", "true", "on", "1", "y"):
        return True
    errors[name] = f"{name} must be yes or no (got {raw!r})"
    return False


def _torchrun(python: str) -> list[str]:
    beside = os.path.join(os.path.dirname(python), "torchrun")
    if os.access(beside, os.X_OK):
        return [beside]
    found = shutil.which("torchrun")
    return [found] if found else [python, "-m", "torch.distributed.run"]


def training_argv(req: TrainingRequest, python: str | None = None) -> list[str]:
    """The command that runs the training: `hsmon train DATA --out OUT --events OUT/events.jsonl ...`,
    under torchrun with --nproc-per-node when more than one GPU is asked for.

    Env HSMON_TRAIN_COMMAND replaces `python -m hsmon` (a site wrapper, a container entry point).
    """
    python = python or sys.executable
    override = shlex.split(os.environ.get("HSMON_TRAIN_COMMAND", ""))
    if req.gpus > 1:
        runner = [*_torchrun(python), "--standalone", "--nproc-per-node", str(req.gpus)]
        if override:
            interp = "python" in os.path.basename(override[0])
            head = [*runner, *(override[1:] if interp else override)]
        else:
            head = [*runner, "-m", "hsmon"]
    else:
        head = override or [python, "-m", "hsmon"]
    argv = [*head, "train", req.data_dir, "--out", req.out_dir, "--events", req.events_path, "--launched"]
    options = (
        ("--target-model", req.target_model),
        ("--epochs", req.epochs),
        ("--lr", req.lr),
        ("--batch-tokens", req.batch_tokens),
        ("--ttt-length", req.ttt_length),
        ("--arch", req.arch),
        ("--draft-vocab-size", req.draft_vocab_size),
        ("--time-limit", req.time_limit),
        ("--threads", req.threads),
    )
    for flag, value in options:
        if value is not None:
            argv += [flag, str(value)]
    if req.follow:
        argv += ["--follow", "--passes", str(req.passes or 1), *(["--consume"] if req.consume else [])]
    if req.resume or req.restart:
        argv.append("--resume" if req.resume else "--restart")
    return argv


def launch_training(
    req: TrainingRequest, argv: list[str] | None = None, env: dict[str, str] | None = None
) -> LaunchedJob:
    """Start the training detached (own session: it survives the TUI or daemon that started it;
    under the daemon's systemd unit an instance of the template unit hsmon-launch@, hsmon/launch/unit.py),
    stdout and stderr appended to OUT/train.log, its PID in OUT/train.pid. Either way the training
    gets the descriptor of the output directory checked against the roots (hsmon/launch/child.py)."""
    argv = argv or training_argv(req)
    spec = LaunchSpec(argv=argv, out_dir=req.out_dir, roots=list(req.roots),
                      data_dir=req.data_dir if req.follow else None)
    base_env = dict(os.environ if env is None else env)
    if launch_unit.wanted():
        unit, pid = launch_unit.start(req.job_name, spec, base_env)
        return LaunchedJob(pid=pid, job=req.job_name, events=req.events_path, out_dir=req.out_dir,
                           log=os.path.join(req.out_dir, LOG_NAME), argv=argv, unit=unit)
    start = open_child(spec, base_env)  # the check repeated on what is made
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=start.log_fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=start.fds,
            env=start.env,
            cwd=f"/proc/self/fd/{start.out_fd}",  # the directory checked, whatever its path names by now
        )
        # Reap it when it ends, so that a long-lived launcher never shows a zombie as "alive".
        threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
        write_pidfile(start.out_fd, proc.pid)
    finally:
        start.close()
    return LaunchedJob(pid=proc.pid, job=req.job_name, events=req.events_path, out_dir=req.out_dir,
                       log=os.path.join(req.out_dir, LOG_NAME), argv=argv)


def stop_job(pid: int) -> bool:
    """Ask a job to stop gracefully (SIGTERM: the trainer writes a checkpoint, then exits).
    False when there is no such process."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    return True


def complete_chunks_warning(data_dir: str | os.PathLike[str]) -> str | None:
    """A warning when the extraction in ``data_dir`` looks unfinished (training uses complete
    chunks only); None when it looks finished or cannot be told."""
    path = Path(data_dir)
    if not path.is_dir():
        return None
    reasons = []
    if layout.manifest_paths(path):
        manifest = read_manifest(path)
        pending = []
        for chunk in sorted(p for p in path.iterdir() if p.is_dir() and layout.parse_chunk_dir_name(p.name)):
            if chunk.name not in manifest.chunks:
                pending.append(chunk.name)
        if pending:
            reasons.append(
                f"{len(pending)} chunk(s) not complete ({', '.join(pending[:3])}"
                f"{', ...' if len(pending) > 3 else ''})"
            )
        complete_rows = sum(int(c.get("rows", 0)) for c in manifest.chunks.values())
    else:
        complete_rows = None
    temps = sum(
        1
        for chunk in path.glob("rows_*")
        if chunk.is_dir()
        for f in chunk.iterdir()
        if layout.is_temporary(f.name)
    )
    if temps:
        reasons.append(f"{temps} file(s) still being written")
    events_file = path / EVENTS_NAME
    if events_file.is_file():
        last_start_ended = None
        for event in ev.iter_events(events_file):
            if event["kind"] == ev.START:
                last_start_ended = False
            elif event["kind"] in ev.TERMINAL_KINDS and last_start_ended is False:
                last_start_ended = event["kind"] == ev.DONE
        if last_start_ended is False:
            reasons.append("its events show no 'done'")
    if not reasons:
        return None
    usable = f" ({complete_rows} rows)" if complete_rows is not None else ""
    return (
        f"the extraction in {path} looks unfinished: {'; '.join(reasons)}. Training uses the complete "
        f"chunks only{usable}; wait for it to finish to train on everything."
    )
