"""The engine check during the run: `hsmon daemon --verify-every N`.

After every N complete chunks of a job's output (hsmon layout), ``VerifyWatch`` runs
`hsmon verify-data OUT --chunk NEWEST --sample K --json` on the newest complete chunk, against a
server URL or ``hf`` (a local model directory), in a child process: the monitor never imports
torch. The child runs at low priority (``nice``), one at a time per job, and is killed past its
time budget (verdict ``timeout``). ``poll`` is called on the monitor's tick; it never blocks.

The status document's ``output.data.verify`` section (``VerifyResult.as_dict``) describes the last
completed check; ``verdict`` is ``running`` only while the first check is in flight, and
``running_chunk`` names the chunk of a check in flight (docs/daemon.md "Engine check").
No heavy imports here: the monitor imports this module.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import IO, Any

from hsmon.status_doc import VerifySection

VERDICTS = ("agree", "disagree", "error", "timeout", "running")
DEFAULT_SAMPLE = 3
DEFAULT_BUDGET = 600.0
DEFAULT_NICE = 10
DATA_MODEL = "the data's model"


class VerifyConfigError(ValueError):
    """A bad engine-check setting (one line naming the setting and the fix)."""


@dataclass
class VerifySpec:
    """How one job's data is checked against the engine while it is written."""

    every: int  # complete chunks between checks
    against: str  # http(s)://HOST:PORT of an SGLang server, or "hf"
    model: str | None = None  # model directory (hf; default: the one the data was made with)
    sample: int = DEFAULT_SAMPLE  # rows of the newest chunk per check
    budget: float = DEFAULT_BUDGET  # seconds before the check is killed (verdict timeout)
    nice: int = DEFAULT_NICE

    def validate(self, job: str) -> None:
        if not isinstance(self.every, int) or self.every < 1:
            raise VerifyConfigError(f"job {job}: verify_every must be a whole number of chunks >= 1")
        if self.against != "hf" and not re.fullmatch(r"https?://[^\s/?#]+/?", self.against or ""):
            raise VerifyConfigError(
                f"job {job}: verify_against {self.against!r} is not valid: give http://HOST:PORT of a "
                "server started with the capture flags, or hf (with verify_model DIR)")
        if self.model and not os.path.isfile(os.path.join(self.model, "config.json")):
            raise VerifyConfigError(f"job {job}: verify_model {self.model}: no config.json there; "
                                    "give a model directory")
        if not isinstance(self.sample, int) or self.sample < 1:
            raise VerifyConfigError(f"job {job}: verify_sample must be a whole number of rows >= 1")
        if not isinstance(self.budget, (int, float)) or self.budget <= 0:
            raise VerifyConfigError(f"job {job}: verify_budget must be a positive number of seconds")
        self.against = self.against.rstrip("/")

    @property
    def where(self) -> str:
        if self.against != "hf":
            return self.against
        return f"hf:{self.model or DATA_MODEL}"


@dataclass
class VerifyResult:
    """The ``output.data.verify`` section (names shared with the TUI: /work/notes contract)."""

    verdict: str | None = None
    chunk: str | None = None
    rows_checked: int = 0
    worst_cosine: float | None = None
    max_abs_diff: float | None = None
    against: str = ""
    checked_ts: float | None = None
    seconds: float | None = None
    reason: str | None = None
    checks_total: int = 0
    disagreements_total: int = 0
    running_chunk: str | None = None
    checks_by_verdict: dict[str, int] = field(default_factory=dict)  # agree|disagree|error|timeout -> n

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "checks_by_verdict": dict(self.checks_by_verdict)}

    def section(self) -> VerifySection:
        """The status document's ``output.data.verify``."""
        return VerifySection(**self.as_dict())


@dataclass
class _Check:
    chunk: str
    proc: subprocess.Popen[bytes]
    started: float  # monotonic
    out: IO[bytes]
    err: IO[bytes]


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _data_model(out_dir: str) -> str | None:
    """The model directory the data was made with (its manifest's first run record), if readable."""
    from hsmon.contracts.layout import MANIFEST_NAME

    try:
        with open(os.path.join(out_dir, MANIFEST_NAME), "rb") as fh:
            first = json.loads(fh.readline() or b"{}")
    except (OSError, ValueError):
        return None
    model = (first.get("settings") or {}).get("model") if isinstance(first, dict) else None
    return model if isinstance(model, str) else None


def _last_line(data: bytes) -> str:
    lines = [line.strip() for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def judge(returncode: int, stdout: bytes, stderr: bytes) -> tuple[str, dict[str, Any]]:
    """The verdict of a finished `hsmon verify-data --json` and its report (empty on error)."""
    report: dict[str, Any] = {}
    if returncode in (0, 1):
        try:
            report = json.loads(stdout.decode("utf-8", "replace").strip().splitlines()[-1])
        except (ValueError, IndexError):
            report = {}
    if isinstance(report, dict) and report.get("verdict") in ("agree", "disagree"):
        return str(report["verdict"]), report
    if returncode < 0:
        why = f"killed by signal {-returncode}"
    else:
        why = _last_line(stderr) or f"exit status {returncode}"
    return "error", {"reason": why.removeprefix("hsmon verify-data: ")}


@dataclass
class VerifyWatch:
    """One job's engine checks: started by ``poll`` as chunks complete, one at a time."""

    spec: VerifySpec
    out_dir: str
    result: VerifyResult = field(init=False)
    _check: _Check | None = None
    _next_at: int = 0

    def __post_init__(self) -> None:
        where = self.spec.where
        if self.spec.against == "hf" and not self.spec.model:
            where = f"hf:{_data_model(self.out_dir) or DATA_MODEL}"
        self.result = VerifyResult(against=where)
        self._next_at = self.spec.every

    def argv(self, chunk: str) -> list[str]:
        """The check's command line (`hsmon verify-data ... --json`, under nice)."""
        cmd = [sys.executable, "-m", "hsmon", "verify-data", self.out_dir, "--chunk", chunk,
               "--sample", str(self.spec.sample), "--json"]
        if self.spec.against == "hf":
            cmd += ["--backend", "hf"]  # in-process: no request to time out (the budget still applies)
        else:
            cmd += ["--against", self.spec.against, "--request-timeout", str(max(1.0, self.spec.budget))]
        if self.spec.model:
            cmd += ["--model", self.spec.model]
        nice = shutil.which("nice")
        return [nice, "-n", str(self.spec.nice), *cmd] if nice and self.spec.nice else cmd

    def poll(self, chunks_complete: int | None, newest_chunk: str | None, now: float) -> None:
        """Finish a check that ended or ran out of time; start one when N more chunks completed."""
        if self._check is not None:
            self._finish_if_done(now)
        due = chunks_complete is not None and newest_chunk and chunks_complete >= self._next_at
        if due and self._check is None:
            self._next_at = (chunks_complete // self.spec.every + 1) * self.spec.every
            self._start(newest_chunk)

    def _start(self, chunk: str) -> None:
        out = tempfile.TemporaryFile()  # noqa: SIM115  (closed in _finish)
        err = tempfile.TemporaryFile()  # noqa: SIM115
        try:
            proc = subprocess.Popen(self.argv(chunk), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    start_new_session=True)
        except OSError as exc:
            out.close()
            err.close()
            why = {"reason": f"cannot start hsmon verify-data: {exc}"}
            self._record("error", chunk, why, 0.0, time.time())
            return
        self._check = _Check(chunk, proc, time.monotonic(), out, err)
        self.result.running_chunk = chunk
        if self.result.verdict is None:
            self.result.verdict, self.result.chunk = "running", chunk

    def _finish_if_done(self, now: float) -> None:
        check = self._check
        assert check is not None
        elapsed = time.monotonic() - check.started
        code = check.proc.poll()
        if code is None and elapsed <= self.spec.budget:
            return
        if code is None:  # past its budget: the whole group goes (a backend may have children)
            with contextlib.suppress(OSError):
                os.killpg(check.proc.pid, signal.SIGKILL)
            check.proc.wait()
            verdict, report = "timeout", {"reason": f"no verdict within the budget of {self.spec.budget:g} s"}
        else:
            check.out.seek(0)
            check.err.seek(0)
            verdict, report = judge(code, check.out.read(), check.err.read())
        check.out.close()
        check.err.close()
        self._check = None
        self._record(verdict, check.chunk, report, elapsed, now)

    def _record(self, verdict: str, chunk: str, report: dict[str, Any], seconds: float, now: float) -> None:
        r = self.result
        r.verdict, r.chunk, r.checked_ts, r.seconds, r.running_chunk = verdict, chunk, now, seconds, None
        r.rows_checked = len(report.get("rows") or [])
        r.worst_cosine = _finite(report.get("worst_cosine"))
        r.max_abs_diff = _finite(report.get("max_abs_diff"))
        r.reason = report.get("reason")
        if verdict == "disagree":
            tol = report.get("tolerance") or {}
            layers = ", ".join(report.get("differ") or [])
            r.reason = (f"layers {layers} differ beyond the {report.get('dtype')} tolerance, cosine >= "
                        f"{tol.get('cos_min')} and max abs diff <= "
                        f"{tol.get('max_abs_diff_rel')} x max |x|")
        r.checks_total += 1
        r.disagreements_total += verdict == "disagree"
        r.checks_by_verdict[verdict] = r.checks_by_verdict.get(verdict, 0) + 1

    def close(self) -> None:
        """Kill a check in flight (the daemon stops)."""
        if self._check is not None:
            with contextlib.suppress(OSError):
                os.killpg(self._check.proc.pid, signal.SIGKILL)
            self._check.proc.wait()
            self._check.out.close()
            self._check.err.close()
            self._check = None


VERIFY_KEYS = {"verify_every", "verify_against", "verify_model", "verify_sample", "verify_budget"}


def spec_from_table(table: dict[str, Any], job: str) -> VerifySpec | None:
    """The engine check of a [[job]] table (None without verify_every); validated by the job."""
    given = {k: table[k] for k in VERIFY_KEYS if k in table}
    if not given:
        return None
    if "verify_every" not in given or "verify_against" not in given:
        raise VerifyConfigError(f"job {job}: the engine check needs both verify_every = N and "
                                "verify_against = \"http://HOST:PORT\" (or \"hf\")")
    return VerifySpec(**{k.removeprefix("verify_"): v for k, v in given.items()})


def add_arguments(parser: Any) -> None:
    """`hsmon daemon`'s engine-check flags (for the job given by flags)."""
    parser.add_argument("--verify-every", type=int, metavar="N",
                        help="after every N complete chunks, re-extract a few rows of the newest one and "
                             "compare (hsmon verify-data; needs --verify-against)")
    parser.add_argument("--verify-against", metavar="URL|hf",
                        help="the engine to compare with: an SGLang server URL, or hf (with --verify-model)")
    parser.add_argument("--verify-model", metavar="DIR",
                        help="model directory for the check (default: the one the data was made with)")
    parser.add_argument("--verify-sample", type=int, default=DEFAULT_SAMPLE, metavar="ROWS",
                        help=f"rows of the newest chunk per check (default {DEFAULT_SAMPLE})")
    parser.add_argument("--verify-budget", type=float, default=DEFAULT_BUDGET, metavar="SECONDS",
                        help=f"kill a check past this (verdict timeout; default {DEFAULT_BUDGET:g})")


def spec_from_args(args: Any) -> VerifySpec | None:
    """The engine check given by flags (None without --verify-every/--verify-against)."""
    if args.verify_every is None and args.verify_against is None:
        return None
    if args.verify_every is None or args.verify_against is None:
        raise VerifyConfigError("--verify-every N and --verify-against URL|hf go together; give both")
    return VerifySpec(args.verify_every, args.verify_against, args.verify_model, args.verify_sample,
                      args.verify_budget)
