"""The job state machine: a pure function of a snapshot of plain figures.

States:
    starting  watched, but no work seen yet (loading a model, waiting for a process)
    running   progress events arrive
    silent    work is visible (dump files, output growth, CPU time, I/O) but no progress events:
              the original job's empty log, not an alert
    stalled   alive, and no signal has moved for ``stall_after`` seconds
    quiet     nothing moved for ``stall_after`` seconds, but no process and no events are watched:
              finished and stalled look alike (a warning, never critical, never notified)
    dead      the process is gone without a ``done``/``stopped`` event, or (a process that writes
              no events) its log ends with a traceback or a failure line, or the kernel says its
              OOM killer killed it
    exited    a process that writes no events ended with no sign of success or failure: a
              warning, never critical
    paused    the job said so (``pause`` event: disk, shm, server)
    done      the job said it finished every row or step (``done``), in its events or in its
              output's manifest (a ``done`` record after the last ``run``)
    stopped   the job ended on request or by a signal before its work was done (``stopped``
              event or manifest record): how far it got and the command that resumes it; a
              notice, never a page

No I/O, no clock, no threads here: the caller measures, this decides. The facts it reads
(`Snapshot` and its parts) are hsmon/core/state_facts.py, shared with the engine and data rules.
"""

from __future__ import annotations

from hsmon.contracts.units import format_duration
from hsmon.core import logtail
from hsmon.core.state_data import data_hints
from hsmon.core.state_engine import engine_hints, server_blame
from hsmon.core.state_facts import Decision, DoneFacts, Hint, Snapshot, StopFacts, age, fmt_seconds
from hsmon.core.state_online import online_decision


def hints_for(snap: Snapshot) -> list[Hint]:
    """Advice that holds whatever the state."""
    hints: list[Hint] = []
    for proc in snap.processes:
        if proc.alive and proc.stdout_buffered:
            hints.append(
                Hint(
                    "stdout-buffered",
                    "info",
                    f"{proc.role} PID {proc.pid} writes stdout to {proc.stdout}, a regular file, without "
                    "PYTHONUNBUFFERED or python -u: Python holds its output in an 8 KB buffer, so an empty "
                    "or stale log does not mean the job is stuck. Start it with `python -u` or "
                    "PYTHONUNBUFFERED=1 (or write hsmon progress events) to see progress as it happens.",
                )
            )
        if proc.alive and proc.status == "stopped":
            hints.append(
                Hint(
                    "process-stopped",
                    "warning",
                    f"{proc.role} PID {proc.pid} is stopped (SIGSTOP/SIGTSTP, e.g. Ctrl-Z): "
                    f"resume it with `kill -CONT {proc.pid}`.",
                )
            )
    for proc in snap.processes[1:]:
        if proc.seen_alive and (not proc.alive or proc.status == "zombie"):
            hints.append(
                Hint(
                    "process-gone",
                    "warning",
                    f"the job's {proc.role} process (PID {proc.pid}) is gone: the job cannot "
                    "progress without it",
                )
            )
    if snap.disk_fits is False:
        hints.append(
            Hint("disk-wont-fit", "critical", snap.disk_message or "the output will not fit on disk")
        )
    if snap.shm_fits is False:
        hints.append(Hint("shm-full-soon", "warning", snap.shm_message or "/dev/shm is filling up"))
    if snap.dump_oldest_age_s is not None and snap.dump_oldest_age_s > snap.stall_after:
        hints.append(
            Hint(
                "dump-backlog",
                "warning",
                f"the oldest dump file is {fmt_seconds(snap.dump_oldest_age_s)} old: nothing consumes the "
                "dump directory (is the packing script alive?)",
            )
        )
    for flag, path in snap.missing_paths:
        hints.append(
            Hint(
                "path-missing",
                "warning",
                f"{flag} {path} does not exist: nothing there to watch until a job creates it; if none "
                f"will, fix the path ({flag}) and restart the daemon (or SIGHUP it with a fixed config)",
            )
        )
    if snap.bad_event_lines:
        hints.append(
            Hint(
                "events-bad-lines",
                "warning",
                f"{snap.bad_event_lines} line(s) of the events file are not valid events (skipped)",
            )
        )

    return hints + data_hints(snap)


def _ended_without_word(snap: Snapshot, what: str, hints: list[Hint]) -> Decision:
    """A process that writes no events (watched by --pid/--pidfile/--match) ended. Its exit status
    cannot be read by a process that did not start it: its log's ending, then the rows it wrote
    against the expected total, say how it ended; without either, ``exited`` (a warning)."""
    lines = snap.exit_log_tail or []
    failure = logtail.failure_line(lines)
    if failure is not None:
        hints.append(
            Hint(
                "dead",
                "critical",
                f"{what} ended and its log {snap.exit_log} ends with: {failure}. Check the log, fix "
                "the cause, then rerun.",
            )
        )
        return Decision("dead", f"{what} failed: {failure}", hints)
    done, total = snap.rows_done, snap.rows_total
    if total and done is not None and done >= total:
        return Decision(
            "done", f"{what} exited after writing {done} of {total} expected rows", hints
        )
    if snap.exit_log_tail is not None:
        last = logtail.last_line(lines)
        said = f"its log {snap.exit_log} ends without an error" + (
            f" (last line: {last[:120]!r})" if last else " (empty)"
        )
    else:
        said = "its stdout/stderr went to no file hsmon could read"
    if total:
        rows = f"{done or 0} of {total} expected rows written"
    elif done:
        rows = f"{done} rows written, no expected total known"
    else:
        rows = "no rows seen"
    hints.append(
        Hint(
            "exited",
            "warning",
            f"{what} ended with no sign of success or failure: {said}; {rows}. Check its log and "
            "output. Next time start it with `hsmon run` (exit code and traceback recorded) or give "
            "--rows-total N, so that its ending is known.",
        )
    )
    return Decision("exited", f"{what} ended with no sign of success or failure ({rows})", hints)


def decide(snap: Snapshot) -> Decision:
    """The job's state, a one-line reason, and hints; an online job's (a spool with its following
    trainer, hsmon/core/state_online.py) judged from both sides, with its section."""
    decision = _decide_job(snap)
    if snap.online is None:
        return decision
    decision, section = online_decision(snap.online, decision, snap.now, snap.stall_after,
                                        snap.paused_reason)
    decision.online = section
    return decision


def _decide_job(snap: Snapshot) -> Decision:
    """The job's own state, a one-line reason, and hints."""
    hints = hints_for(snap)

    if snap.terminal_kind is not None:
        # the state's clock (state_since_ts) is the ending's own time: the reason stays one line
        if snap.terminal_kind == "done":
            return Decision("done", done_reason(snap.done), hints, since_ts=snap.terminal_ts)
        return Decision("stopped", stopped_reason(snap, snap.stopped or StopFacts(), None), hints,
                        since_ts=snap.terminal_ts)
    ending = _output_ending(snap)
    if ending is not None:
        return Decision(ending[0], ending[1], hints, since_ts=snap.output_ending_ts)

    gone = _process_verdict(snap, hints)
    if gone is not None:
        return gone
    hints += engine_hints(snap)
    blame = server_blame(snap)
    if snap.paused_reason is not None:
        why = f"the job paused itself (reason: {snap.paused_reason})"
        return Decision("paused", f"{why}; {blame}" if blame else why, hints)
    return _activity_verdict(snap, hints, blame)


def _process_verdict(snap: Snapshot, hints: list[Hint]) -> Decision | None:
    """dead or starting when the job's watched main process is gone; None while it lives. A shared
    cgroup's OOM count (nothing names this process) is a hint beside that ending, never the verdict."""
    decision = _gone_verdict(snap, hints)
    main = snap.processes[0] if snap.processes else None
    if decision is not None and main is not None and main.oom_in_cgroup and decision.state != "starting":
        hints.append(oom_in_cgroup_hint(main.oom_in_cgroup, snap, decision))
    return decision


def oom_in_cgroup_hint(counted: str, snap: Snapshot, decision: Decision) -> Hint:
    """"The job's cgroup counted an OOM kill; the job's log ends with a traceback: ..." (warning)."""
    failure = snap.last_error or logtail.failure_line(snap.exit_log_tail or [])
    ending = (f"the job's log ends with a traceback: {failure}" if failure
              else f"nothing names this job's process as the one killed; its ending: {decision.reason}")
    return Hint("oom-in-cgroup", "warning", f"the job's cgroup counted an OOM kill ({counted}); {ending}")


def _gone_verdict(snap: Snapshot, hints: list[Hint]) -> Decision | None:
    main = snap.processes[0] if snap.processes else None
    gone = main is not None and not (main.alive and main.status != "zombie")
    # a process started by `hsmon run` is not judged while hsmon run is still recording its end
    if snap.process_watched and main is not None and gone and not snap.runner_alive:
        if main.seen_alive or snap.evidence_of_job:
            what = f"{main.role} PID {main.pid}" if main.pid else f"the {main.role} process"
            if main.oom_kill is not None:
                hints.append(
                    Hint(
                        "dead",
                        "critical",
                        f"{what} was killed by the kernel's OOM killer ({main.oom_kill}): give it more "
                        "memory or ask less of it (smaller batches, fewer workers), then rerun the same "
                        "command to resume.",
                    )
                )
                return Decision("dead", f"{what} was killed by the kernel: {main.oom_kill}", hints)
            if not snap.started and not snap.last_error:
                return _ended_without_word(snap, what, hints)
            status = "is a zombie" if main.status == "zombie" else "is gone"
            detail = f" (last error: {snap.last_error})" if snap.last_error else ""
            log = f" ({snap.exit_log})" if snap.exit_log else ""
            hints.append(
                Hint(
                    "dead",
                    "critical",
                    f"{what} {status} without a 'done' event{detail}: check its log{log}, then "
                    "rerun the same command to resume.",
                )
            )
            return Decision("dead", f"{what} {status} without a done event{detail}", hints)
        return Decision(
            "starting", f"waiting for the {main.role} process ({main.cmdline or 'not found yet'})", hints
        )
    return None


def _activity_verdict(snap: Snapshot, hints: list[Hint], blame: str | None) -> Decision:
    """running, silent, starting, quiet or stalled, from how long ago each signal last moved."""
    now, stall = snap.now, snap.stall_after
    progress_age = age(now, snap.last_progress_ts)
    work_age = age(now, snap.last_work_ts)
    busy_age = age(now, snap.last_busy_ts)
    if progress_age is not None and progress_age <= stall:
        return Decision("running", f"progress events {fmt_seconds(progress_age)} ago", hints)
    if work_age is not None and work_age <= stall:
        if snap.events_watched and snap.last_progress_ts is not None:
            why = f"no progress event for {fmt_seconds(progress_age or 0)}"
        elif snap.events_watched:
            why = "no progress events yet"
        else:
            why = "no events file watched"
        return Decision(
            "silent", f"work is visible ({snap.work_what} {fmt_seconds(work_age)} ago) but {why}", hints
        )
    never_worked = snap.last_progress_ts is None and snap.last_work_ts is None
    since_watch = max(0.0, now - snap.watch_start_ts)
    if not snap.process_watched and not snap.evidence_of_job and never_worked:
        # nothing says the job exists yet (no process known, no events, output or dump files)
        waiting = f"waiting for the job to start (watching for {fmt_seconds(since_watch)})"
        return Decision("starting", waiting, hints)
    if busy_age is not None and busy_age <= stall:
        if never_worked:
            busy = f"busy (CPU/I/O {fmt_seconds(busy_age)} ago) but no output yet"
            return Decision("starting", busy, hints)
        return Decision(
            "silent",
            f"CPU/I/O busy {fmt_seconds(busy_age)} ago, no output for "
            f"{fmt_seconds(min(a for a in (progress_age, work_age) if a is not None))}",
            hints,
        )
    if never_worked and snap.last_busy_ts is None and since_watch <= stall:
        return Decision("starting", f"watching for {fmt_seconds(since_watch)}; no signal yet", hints)
    last = max(
        (t for t in (snap.last_progress_ts, snap.last_work_ts, snap.last_busy_ts) if t is not None),
        default=snap.watch_start_ts,
    )
    quiet = max(0.0, now - last)
    if not snap.process_watched and not snap.events_watched and not blame:
        hints.append(Hint("quiet", "warning", _quiet_message(snap, quiet)))
        return Decision("quiet", f"no change for {fmt_seconds(quiet)}; no process or events watched", hints)
    nothing = (
        f"no signal (events, dump files, output, CPU, I/O) moved for {fmt_seconds(quiet)} "
        f"(stall-after {fmt_seconds(stall)})"
    )
    hints.append(Hint("stalled", "critical", f"{nothing}: {blame}" if blame else nothing))
    if blame:
        return Decision("stalled", blame, hints)
    return Decision("stalled", f"no signal moved for {fmt_seconds(quiet)}", hints)


def _counts(snap: Snapshot) -> str:
    if snap.rows_done is None:
        return ""
    total = f" / {snap.rows_total}" if snap.rows_total is not None else ""
    return f"{snap.rows_done}{total} rows"


def _output_ending(snap: Snapshot) -> tuple[str, str] | None:
    """("done" or "stopped", the reason) when the output's manifests say the run ended, else None.

    A start event newer than the manifest's ending is a new run (e.g. paused for disk before its
    ``run`` record): its events decide.
    """
    if snap.output_ending is None:
        return None
    if snap.events_start_ts is not None and snap.events_start_ts > (snap.output_ending_ts or 0.0):
        return None
    if snap.output_ending != "done":
        return "stopped", stopped_reason(snap, snap.stopped or StopFacts(), snap.output_ending_ts,
                                         "the output's manifest says the run")
    when = ""
    if snap.output_ending_ts is not None:
        when = f" {fmt_seconds(max(0.0, snap.now - snap.output_ending_ts))} ago"
    facts = [_counts(snap)] if snap.rows_done is not None else []
    if snap.output_run_seconds is not None:
        facts.append(f"took {format_duration(snap.output_run_seconds)}")
    detail = f" ({', '.join(facts)})" if facts else ""
    return "done", f"the output's manifest says the run finished{when}{detail}"


def done_reason(done: DoneFacts | None) -> str:
    """"the job reported done", or the limit that ended it: "the training reached its time limit
    (--time-limit) at step 77 of 100 (77 %)" (its bar short of the end is no failure)."""
    if done is None or done.limit is None:
        return "the job reported done"
    what = "its time limit (--time-limit)" if done.limit == "--time-limit" else "its step limit (--max-steps)"
    at = ""
    if done.step is not None:
        at = f" at step {done.step}"
        if done.total_steps:
            at += f" of {done.total_steps} ({100.0 * done.step / done.total_steps:.0f} %)"
    return f"the training reached {what}{at}"


def stopped_reason(snap: Snapshot, stop: StopFacts, ts: float | None, who: str = "the job") -> str:
    """"the job stopped on request (SIGINT) 5s ago at 193 / 400 rows (48 %): run the same
    `hsmon extract` command to resume": what stopped it, how far it got, what resumes it."""
    how = f" ({stop.how})" if stop.how and stop.how not in ("signal", "request") else ""
    when = f" {fmt_seconds(max(0.0, snap.now - ts))} ago" if ts is not None else ""
    at = ""
    if stop.step is not None:
        of = f" of {stop.total_steps}" if stop.total_steps else ""
        at = f" at step {stop.step}{of}"
    elif snap.rows_done is not None:
        at = f" at {_counts(snap)}"
        if snap.rows_total:
            at += f" ({100.0 * snap.rows_done / snap.rows_total:.0f} %)"
    resume = stop.resume or ("rerun the same command with --resume" if stop.step is not None
                             else "run the same command to resume")
    return f"{who} stopped on request{how}{when}{at}: {resume}"


def _quiet_message(snap: Snapshot, quiet: float) -> str:
    """What is known about a quiet directory that no process or events file accounts for."""
    if snap.rows_total is not None and snap.rows_done is not None and snap.rows_done < snap.rows_total:
        return (
            f"{_counts(snap)} written and no change for {fmt_seconds(quiet)}, so the job did not finish: it "
            "was killed or is stuck, and with no process watched the two look alike: resume it (for "
            "hsmon extract, rerun the same command), or add --pid, --match or --events"
        )
    return (
        f"no change for {fmt_seconds(quiet)}; no process watched, so finished and stalled look alike: "
        "add --pid, --match or --events"
    )
