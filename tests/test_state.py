"""hsmon.core.state.decide: a pure function, tested without threads, clocks or files."""

from __future__ import annotations

from hsmon.core.state import decide
from hsmon.core.state_facts import STATES, ProcessFacts, Snapshot

NOW = 10_000.0


def snap(**kw) -> Snapshot:
    base = dict(
        now=NOW,
        stall_after=60.0,
        watch_start_ts=NOW - 1000,
        process_watched=True,
        processes=[ProcessFacts("extractor", 42, True, "running", seen_alive=True)],
    )
    base.update(kw)
    return Snapshot(**base)


def hint_ids(decision) -> set[str]:
    return {h.id for h in decision.hints}


def test_running_when_progress_events_are_recent():
    d = decide(snap(events_watched=True, last_progress_ts=NOW - 5, last_work_ts=NOW - 5))
    assert d.state == "running"


def test_silent_story_empty_log_with_work_visible_and_buffering_hint():
    proc = ProcessFacts(
        "extractor", 42, True, "running", seen_alive=True, stdout="/x/log", stdout_buffered=True
    )
    d = decide(snap(processes=[proc], last_work_ts=NOW - 3, last_busy_ts=NOW - 1))
    assert d.state == "silent"
    assert "stdout-buffered" in hint_ids(d)
    assert "PYTHONUNBUFFERED" in next(h.message for h in d.hints if h.id == "stdout-buffered")


def test_silent_when_events_stopped_but_dump_files_move():
    d = decide(snap(events_watched=True, last_progress_ts=NOW - 500, last_work_ts=NOW - 2))
    assert d.state == "silent"


def test_stalled_when_nothing_moved_for_stall_after():
    d = decide(snap(last_work_ts=NOW - 61, last_busy_ts=NOW - 70, last_progress_ts=NOW - 80))
    assert d.state == "stalled"
    assert "stalled" in hint_ids(d)


def test_not_stalled_one_second_before_the_limit():
    d = decide(snap(last_work_ts=NOW - 59))
    assert d.state == "silent"


def test_stopped_process_gets_sigcont_hint_and_stalls():
    proc = ProcessFacts("extractor", 42, True, "stopped", seen_alive=True)
    d = decide(snap(processes=[proc], last_work_ts=NOW - 100))
    assert d.state == "stalled"
    assert "process-stopped" in hint_ids(d)
    assert "kill -CONT 42" in " ".join(h.message for h in d.hints)


def test_dead_when_process_gone_without_done():
    proc = ProcessFacts("extractor", 42, False, "gone", seen_alive=True)
    d = decide(snap(processes=[proc], started=True, last_progress_ts=NOW - 1))
    assert d.state == "dead"


def test_zombie_is_dead():
    proc = ProcessFacts("extractor", 42, True, "zombie", seen_alive=True)
    assert decide(snap(processes=[proc], started=True)).state == "dead"


def test_done_event_wins_over_a_gone_process():
    proc = ProcessFacts("extractor", 42, False, "gone", seen_alive=True)
    assert decide(snap(processes=[proc], terminal_kind="done")).state == "done"
    assert decide(snap(processes=[proc], terminal_kind="stopped")).state == "stopped"


def test_stopped_is_its_own_state_with_how_far_and_what_resumes_it():
    """A run ended on request before its work was done is never ``done``: the reason says what
    stopped it, how far it got and the command that resumes it, from the writer's own event."""
    from hsmon.core.state_facts import StopFacts

    proc = ProcessFacts("extractor", 42, False, "gone", seen_alive=True)
    event = {"kind": "stopped", "reason": "signal", "signal": "SIGINT", "rows_done": 193, "rows_total": 400,
             "resume": "run the same `hsmon extract` command again: it resumes after row 193"}
    d = decide(snap(processes=[proc], terminal_kind="stopped", terminal_ts=NOW - 5, rows_done=193,
                    rows_total=400, stopped=StopFacts.of_event(event)))
    assert d.state == "stopped"
    assert d.reason == ("the job stopped on request (SIGINT) at 193 / 400 rows (48 %): run the same "
                        "`hsmon extract` command again: it resumes after row 193")
    assert not [h for h in d.hints if h.severity == "critical"]
    train = {"kind": "stopped", "reason": "signal", "signal": "SIGTERM", "step": 31, "total_steps": 1000}
    d = decide(snap(terminal_kind="stopped", stopped=StopFacts.of_event(train)))
    assert d.state == "stopped" and "at step 31 of 1000: rerun the same command with --resume" in d.reason
    # the output's manifest alone (no events): stopped too, never done
    d = decide(snap(output_ending="stopped", output_ending_ts=NOW - 10, rows_done=32, rows_total=48))
    assert d.state == "stopped" and "at 32 / 48 rows (67 %): run the same command to resume" in d.reason


def test_paused_when_the_job_says_so():
    d = decide(snap(paused_reason="disk", last_progress_ts=NOW - 1000))
    assert d.state == "paused"
    assert "disk" in d.reason


def test_starting_when_no_process_found_yet_and_no_evidence():
    proc = ProcessFacts(
        "extractor", None, False, "gone", seen_alive=False, cmdline="command line matching /x/"
    )
    assert decide(snap(processes=[proc])).state == "starting"


def test_dead_when_never_seen_alive_but_the_job_left_evidence():
    proc = ProcessFacts("extractor", 42, False, "gone", seen_alive=False)
    assert decide(snap(processes=[proc], started=True, evidence_of_job=True)).state == "dead"


def test_starting_while_loading_then_stalled_after_limit():
    fresh = snap(watch_start_ts=NOW - 10)
    assert decide(fresh).state == "starting"
    loading = snap(last_busy_ts=NOW - 1)
    assert decide(loading).state == "starting"
    idle_long = snap(watch_start_ts=NOW - 61)
    assert decide(idle_long).state == "stalled"


def test_cpu_busy_after_work_is_silent_not_stalled():
    d = decide(snap(last_work_ts=NOW - 300, last_busy_ts=NOW - 2))
    assert d.state == "silent"


def test_disk_hint_and_backlog_hint():
    d = decide(
        snap(
            last_progress_ts=NOW - 1,
            disk_fits=False,
            disk_message="needs 2 TB, 1 TB free",
            dump_oldest_age_s=600.0,
            bad_event_lines=3,
        )
    )
    assert d.state == "running"
    assert {"disk-wont-fit", "dump-backlog", "events-bad-lines"} <= hint_ids(d)


def test_every_decision_is_a_known_state():
    for kw in ({}, {"terminal_kind": "done"}, {"paused_reason": "shm"}, {"last_work_ts": NOW}):
        assert decide(snap(**kw)).state in STATES


def test_a_job_with_no_trace_yet_is_starting_not_stalled():
    d = decide(snap(process_watched=False, processes=[], events_watched=True, watch_start_ts=NOW - 1000))
    assert d.state == "starting" and "waiting for the job" in d.reason
    # events watched but no process known yet: nothing moving is still a stall
    d = decide(
        snap(
            process_watched=False,
            processes=[],
            events_watched=True,
            evidence_of_job=True,
            last_work_ts=NOW - 1000,
        )
    )
    assert d.state == "stalled"


def test_a_second_process_gone_is_a_warning():
    server = ProcessFacts("server", 7, False, "gone", seen_alive=True)
    main = ProcessFacts("extractor", 42, True, "running", seen_alive=True)
    d = decide(snap(processes=[main, server], last_progress_ts=NOW - 1))
    assert d.state == "running" and "process-gone" in hint_ids(d)


# -- what the output's manifest says, and a quiet directory nobody accounts for ----------
GONE = ProcessFacts("extractor", 42, False, "gone", seen_alive=True)


def test_done_from_the_manifest_without_events_or_process():
    d = decide(
        snap(
            process_watched=False,
            processes=[],
            evidence_of_job=True,
            last_work_ts=NOW - 1320,  # 22 minutes of nothing: the original false alarm
            output_ending="done",
            output_ending_ts=NOW - 1320,
            output_run_seconds=17.0,
            rows_done=300,
            rows_total=300,
        )
    )
    assert d.state == "done"
    assert "300 / 300 rows" in d.reason and "17s" in d.reason
    assert not [h for h in d.hints if h.severity == "critical"]


def test_done_from_the_manifest_wins_over_a_gone_process():
    d = decide(
        snap(processes=[GONE], output_ending="done", output_ending_ts=NOW - 5, rows_done=3, rows_total=3)
    )
    assert d.state == "done" and "dead" not in hint_ids(d)


def test_stopped_from_the_manifest():
    d = decide(
        snap(
            processes=[GONE],
            last_work_ts=NOW - 900,
            output_ending="stopped",
            output_ending_ts=NOW - 900,
            rows_done=40,
            rows_total=160,
        )
    )
    assert d.state == "stopped"
    assert "stopped on request" in d.reason and "40 / 160 rows" in d.reason and "resume" in d.reason


def test_resumed_not_done_a_newer_start_event_decides():
    # the manifest's last run ended, but a start event after it says a new run began (it paused for
    # disk before its run record): the events' pause counts, not the old ending
    d = decide(
        snap(
            events_watched=True,
            events_start_ts=NOW - 10,
            paused_reason="disk",
            output_ending="stopped",
            output_ending_ts=NOW - 100,
        )
    )
    assert d.state == "paused"
    # a resumed run whose manifest has a run record after the ending has no output_ending: it runs
    d = decide(snap(output_ending=None, rows_done=80, rows_total=160, last_work_ts=NOW - 1))
    assert d.state == "silent"


def test_quiet_without_process_or_events_is_a_warning_not_a_stall():
    d = decide(
        snap(
            process_watched=False, processes=[], evidence_of_job=True, last_work_ts=NOW - 1320, rows_done=300
        )
    )
    assert d.state == "quiet"
    (hint,) = [h for h in d.hints if h.id == "quiet"]
    assert hint.severity == "warning"
    assert hint.message == (
        "no change for 22m; no process watched, so finished and stalled look alike: "
        "add --pid, --match or --events"
    )
    assert not [h for h in d.hints if h.severity == "critical"]


def test_quiet_with_a_plan_not_reached_says_killed_or_stuck():
    d = decide(
        snap(
            process_watched=False,
            processes=[],
            evidence_of_job=True,
            last_work_ts=NOW - 600,
            rows_done=150,
            rows_total=300,
        )
    )
    assert d.state == "quiet"
    message = next(h.message for h in d.hints if h.id == "quiet")
    assert "150 / 300 rows" in message and "rerun the same command" in message


def test_a_watched_live_process_where_nothing_moves_still_stalls():
    frozen = ProcessFacts("extractor", 42, True, "stopped", seen_alive=True)
    d = decide(snap(processes=[frozen], evidence_of_job=True, last_work_ts=NOW - 1320, rows_done=3))
    assert d.state == "stalled" and "stalled" in hint_ids(d)


def test_a_limit_the_user_set_is_the_reason_and_the_ending_its_own_clock():
    """A training ended by --time-limit at 77 % reads done with that limit as its reason (not "the
    job reported done" beside a bar at 77 %); the state's clock is the ending's own time."""
    from hsmon.core.job_document import JobState
    from hsmon.core.state_facts import DoneFacts

    event = {"kind": "done", "step": 77, "total_steps": 100, "time_limit_reached": True,
             "ended_by": "time_limit"}
    decision = decide(snap(terminal_kind="done", terminal_ts=900.0, done=DoneFacts.of_event(event)))
    assert decision.state == "done" and decision.since_ts == 900.0
    assert decision.reason == "the training reached its time limit (--time-limit) at step 77 of 100 (77 %)"
    older = {"kind": "done", "step": 3, "time_limit_reached": True}  # a trainer before ended_by
    assert decide(snap(terminal_kind="done", done=DoneFacts.of_event(older))).reason == (
        "the training reached its time limit (--time-limit) at step 3")
    steps = {"kind": "done", "step": 40, "total_steps": 40, "ended_by": "max_steps"}
    assert "its step limit (--max-steps) at step 40 of 40" in decide(
        snap(terminal_kind="done", done=DoneFacts.of_event(steps))).reason
    assert decide(snap(terminal_kind="done", done=DoneFacts.of_event({"kind": "done"}))).reason == (
        "the job reported done")
    state = JobState(since_ts=500.0, state="running")
    state.move_to(decision, now=1500.0, job="t")
    assert state.since_ts == 900.0  # done for 600 s at 1500, not for 0 s
    state = JobState(since_ts=500.0, state="done")
    state.move_to(type(decision)("running", "", [], since_ts=2000.0), now=1500.0, job="t")
    assert state.since_ts == 1500.0  # a record from the future is not believed
