"""An online job's verdict (hsmon/core/state_online.py through `decide`): pure, from snapshots.

The slow-but-alive cases with their slowness made exact: an extractor paused for spool room for
ten times stall_after is paused, not stalled; a trainer waiting for rows is waiting; a trainer
whose steps stopped while its CPU moves is running; only one with neither moving stalls.
"""

from __future__ import annotations

from hsmon.core.state import decide
from hsmon.core.state_facts import ProcessFacts, Snapshot
from hsmon.core.state_online import OnlineFacts, TrainerFacts
from hsmon.core.trackers.online import WaitShare

NOW = 100_000.0
STALL = 60.0


def trainer(**kw) -> TrainerFacts:
    base = dict(seen=True, started=True, pid=77, alive=True, status="running", seen_alive=True,
                last_progress_ts=NOW - 2, last_busy_ts=NOW - 1)
    base.update(kw)
    return TrainerFacts(**base)


def facts(tr: TrainerFacts | None = None, **kw) -> OnlineFacts:
    base = dict(path="/dev/shm/spool", limit_bytes=20_000_000_000, spool_bytes=19_990_000_000,
                rows_written=5000, rows_consumed=3000, passes=2, consume=True, trainer_step=400,
                producer_rows_per_s=3.0, consumer_rows_per_s=2.0, spool_wait_frac=0.41, rows_wait_frac=0.0,
                window_s=600.0, trainer=tr or trainer())
    base.update(kw)
    return OnlineFacts(**base)


def snap(online: OnlineFacts, paused: str | None = "spool", **kw) -> Snapshot:
    """The extraction's snapshot: events watched, its process alive; paused for the spool by default,
    its last progress ten stall periods ago (it has waited that long for room)."""
    base = dict(now=NOW, stall_after=STALL, watch_start_ts=NOW - 5000, process_watched=True,
                events_watched=True, started=True, paused_reason=paused, last_progress_ts=NOW - 10 * STALL,
                processes=[ProcessFacts("extractor", 42, True, "sleeping", seen_alive=True)], online=online)
    base.update(kw)
    return Snapshot(**base)


def ids(decision) -> set[str]:
    return {h.id for h in decision.hints}


def test_extractor_waiting_for_room_while_the_trainer_consumes_is_running_and_names_training():
    d = decide(snap(facts()))
    assert d.state == "running" and not ids(d) & {"stalled", "trainer-dead", "trainer-stalled"}
    assert d.online is not None
    assert (d.online.producer.state, d.online.consumer.state) == ("paused", "running")
    assert d.online.producer.reason.startswith("spool full: 20.0 GB of rows waiting for the trainer")
    assert d.online.bottleneck == (
        "training is the bottleneck: extraction waited for spool room 41 % of the last 10 min")
    assert d.online.rows_waiting == 2000 and d.online.limit_bytes == 20_000_000_000


def test_trainer_waiting_for_rows_is_waiting_not_stalled_and_names_extraction():
    tr = trainer(paused_reason="rows", waiting_since_ts=NOW - 10 * STALL, last_progress_ts=NOW - 10 * STALL,
                 last_busy_ts=NOW - 10 * STALL)
    d = decide(snap(facts(tr, spool_wait_frac=0.0, rows_wait_frac=0.63, spool_bytes=1000), paused=None,
                    last_progress_ts=NOW - 1))
    assert d.state == "running"
    assert d.online.consumer.state == "waiting" and d.online.producer.state == "running"
    assert d.online.bottleneck == (
        "extraction is the bottleneck: training waited for rows 63 % of the last 10 min")


def test_trainer_dead_while_the_spool_is_full_pages_the_trainer_not_the_extractor():
    tr = trainer(alive=False, status="gone", last_progress_ts=NOW - 300, last_busy_ts=NOW - 300,
                 last_error="RuntimeError: boom")
    d = decide(snap(facts(tr)))
    assert d.state == "dead" and "trainer-dead" in ids(d) and "dead" not in ids(d)
    assert d.reason.startswith(
        "trainer PID 77 is gone without a done record (last error: RuntimeError: boom)")
    assert "the extractor waits for spool room" in d.reason
    assert d.online.producer.state == "paused" and d.online.consumer.state == "dead"


def test_a_slow_trainer_with_cpu_moving_is_running_one_with_nothing_moving_stalls():
    slow = trainer(last_progress_ts=NOW - 10 * STALL, last_busy_ts=NOW - 3)
    d = decide(snap(facts(slow)))
    assert d.state == "running" and d.online.consumer.state == "running"
    assert "slow, not stuck" in d.online.consumer.reason
    stuck = trainer(last_progress_ts=NOW - 10 * STALL, last_busy_ts=NOW - STALL - 1)
    d = decide(snap(facts(stuck)))
    assert d.state == "stalled" and "trainer-stalled" in ids(d)
    assert d.reason.startswith("the trainer: no step and no CPU for")
    stopped = trainer(status="stopped", last_progress_ts=NOW - 10 * STALL, last_busy_ts=NOW - 10 * STALL)
    assert "kill -CONT 77" in decide(snap(facts(stopped))).reason


def test_a_trainer_never_seen_on_this_host_is_judged_by_its_steps_never_dead_by_pid():
    remote = trainer(alive=False, status="gone", seen_alive=False, last_busy_ts=None)
    assert decide(snap(facts(remote))).state == "running"  # its steps arrive: it runs elsewhere
    quiet = trainer(alive=False, status="gone", seen_alive=False, last_busy_ts=None,
                    last_progress_ts=NOW - 2 * STALL)
    d = decide(snap(facts(quiet)))
    assert d.state == "stalled" and "trainer-dead" not in ids(d)
    assert "PID 77 is not a trainer on this host (gone, or on another host)" in d.reason


def test_an_extractor_watched_without_events_waiting_for_room_is_paused_not_stalled():
    """A spool watched by --out and --pid alone: no pause event, nothing moves for ten stall periods;
    the spool has no room for a row, so it waits for room (and with no room left it pages nothing)."""
    quiet = dict(paused=None, events_watched=False, started=False, last_progress_ts=None,
                 last_work_ts=NOW - 10 * STALL, last_busy_ts=NOW - 10 * STALL)
    d = decide(snap(facts(spool_full=True), **quiet))
    assert d.state == "running" and not ids(d) & {"stalled", "quiet"}
    assert d.online.producer.state == "paused" and "seen from the spool" in d.online.producer.reason
    d = decide(snap(facts(TrainerFacts(), spool_full=True), **quiet))
    assert d.state == "paused" and "stalled" not in ids(d) and "no-trainer" in ids(d)
    d = decide(snap(facts(spool_full=False, spool_bytes=1000), **quiet))  # room left: really stuck
    assert d.state == "stalled" and "stalled" in ids(d) and d.online.producer.state == "stalled"


def test_a_dead_extractor_pages_the_extractor_as_today():
    gone = ProcessFacts("extractor", 42, False, "gone", seen_alive=True)
    d = decide(snap(facts(trainer(paused_reason="rows", waiting_since_ts=NOW - 5)), paused=None,
                    processes=[gone]))
    assert d.state == "dead" and "dead" in ids(d) and d.reason.startswith("extractor PID 42 is gone")
    assert d.online.consumer.state == "waiting" and d.online.producer.state == "dead"


def test_extraction_finished_takes_the_trainers_state_then_done_with_both():
    d = decide(snap(facts(), paused=None, terminal_kind="done", terminal_ts=NOW - 100))
    assert d.state == "running" and d.reason.startswith("extraction finished; the trainer: a step")
    assert d.online.bottleneck == "extraction finished; training goes on (2000 rows waiting)"
    done = decide(snap(facts(trainer(ended="done")), paused=None, terminal_kind="done"))
    assert done.state == "done" and done.online.bottleneck == "both sides finished"
    # waiting for rows that will never come: a moment is fine, past stall_after it pages
    late = trainer(paused_reason="rows", waiting_since_ts=NOW - 5)
    assert decide(snap(facts(late), paused=None, terminal_kind="done")).state == "running"
    stuck = trainer(paused_reason="rows", waiting_since_ts=NOW - 2 * STALL)
    d = decide(snap(facts(stuck), paused=None, terminal_kind="done"))
    assert d.state == "stalled" and "trainer-stalled" in ids(d) and "the extraction finished" in d.reason


def test_both_sides_stopped_on_request_is_stopped_never_done():
    """Ctrl-C of `hsmon online`: the extraction's stopped event and the trainer's stopped ledger
    record make the job ``stopped`` (how far each side got, how to resume), not ``done``."""
    from hsmon.core.state_facts import StopFacts

    gone = ProcessFacts("extractor", 42, False, "gone", seen_alive=True)
    stop = StopFacts.of_event({"kind": "stopped", "signal": "SIGINT", "rows_done": 150, "rows_total": 600})
    d = decide(snap(facts(trainer(ended="stopped", alive=False, step=31)), paused=None, processes=[gone],
                    terminal_kind="stopped", terminal_ts=NOW - 3, rows_done=150, rows_total=600,
                    stopped=stop))
    assert d.state == "stopped", d.reason
    assert (d.online.producer.state, d.online.consumer.state) == ("stopped", "stopped")
    assert d.reason.startswith("the extraction stopped on request (SIGINT) at 150 / 600 rows (25 %); "
                               "training stopped on request at step 31: rerun `hsmon online`")
    assert "--resume" in d.reason and not [h for h in d.hints if h.severity == "critical"]
    # the trainer stopped while the extraction still writes: the job runs on, the trainer's stop said
    d = decide(snap(facts(trainer(ended="stopped", alive=False, step=31)), paused=None,
                    last_progress_ts=NOW - 1))
    assert d.state == "running" and "side-stopped" in ids(d) and "training stopped on request" in d.reason


def test_both_sides_waiting_on_each_other_for_stall_after_is_the_pipeline_stopped():
    tr = trainer(paused_reason="rows", waiting_since_ts=NOW - 2 * STALL)
    d = decide(snap(facts(tr, producer_paused_since_ts=NOW - 3 * STALL)))
    assert d.state == "stalled" and "pipeline-stopped" in ids(d) and "raise --spool-max" in d.reason
    # complete chunks the trainer finished but left unconsumed (a kill between its checkpoint and
    # its consumed records): the limit is not the cause, the advice is the trainer's --resume
    d = decide(snap(facts(tr, producer_paused_since_ts=NOW - 3 * STALL, chunks_complete=9,
                          chunks_consumed=7)))
    assert d.state == "stalled" and "--resume" in d.reason and "raise --spool-max" not in d.reason
    d = decide(snap(facts(tr, producer_paused_since_ts=NOW - 3 * STALL, consume=False)))
    assert "--consume" in d.reason and "raise --spool-max" not in d.reason
    young = trainer(paused_reason="rows", waiting_since_ts=NOW - STALL + 5)
    assert decide(snap(facts(young, producer_paused_since_ts=NOW - 3 * STALL))).state == "running"


def test_a_full_spool_with_no_trainer_stays_paused_with_a_warning():
    d = decide(snap(facts(TrainerFacts())))
    assert d.state == "paused" and "no-trainer" in ids(d)
    assert "hsmon train /dev/shm/spool --follow" in next(h.message for h in d.hints if h.id == "no-trainer")


def test_wait_share_over_its_window():
    share = WaitShare(window=600.0)
    share.add(0.0, False)
    share.add(100.0, True)  # waits from 100 to 346: 246 s
    share.add(346.0, False)
    frac, span = share.share(400.0)
    assert span == 400.0 and round(frac, 3) == round(246 / 400, 3)
    share.add(1000.0, True)
    frac, span = share.share(1100.0)  # window 500..1100: waiting 1000..1100
    assert span == 600.0 and round(frac, 3) == round(100 / 600, 3) and share.since == 1000.0


def test_a_trainer_that_ended_while_rows_wait_pages_naming_it_and_the_resume():
    """--max-steps (a done event) or a SIGTERM (stopped) while the spool is full: nothing will ever
    make room, so the job is stopped with a critical hint naming the trainer and what to run."""
    for how in ("done", "stopped"):
        tr = trainer(ended=how, alive=False, status="gone", step=2, ended_reason="max_steps")
        d = decide(snap(facts(tr)))
        assert d.state == "stopped", (how, d.reason)
        hint = next(h for h in d.hints if h.id == "trainer-ended")
        assert hint.severity == "critical"
        assert hint.message.startswith("the trainer (PID 77) ended (training "
                                       "ended by --max-steps at step 2)")
        assert "2000 rows wait in the spool: the extractor waits for spool room that will never come" \
            in hint.message
        assert "`hsmon train /dev/shm/spool --follow --resume`" in hint.message
    # the spool not full yet: the extraction runs on, but the page comes now, not once it is full
    d = decide(snap(facts(trainer(ended="done", alive=False, status="gone")), paused=None,
                    last_progress_ts=NOW - 1))
    assert d.state == "running" and "trainer-ended" in ids(d)
    assert "will wait for spool room for ever once the spool is full" in d.reason + str(d.hints)
    # no spool limit: the extraction can always finish, a warning; every row consumed: nothing
    d = decide(snap(facts(trainer(ended="done", alive=False), limit_bytes=None), paused=None,
                    last_progress_ts=NOW - 1))
    assert next(h for h in d.hints if h.id == "trainer-ended").severity == "warning"
    d = decide(snap(facts(trainer(ended="done", alive=False), rows_consumed=5000), paused=None,
                    last_progress_ts=NOW - 1))
    assert "trainer-ended" not in ids(d)


def test_a_slow_trainer_alive_never_reads_ended_however_long_the_spool_stays_full():
    """Slow but alive (CPU moving, no step for a hundred stall periods, the spool full all along):
    running, no trainer-ended and no critical hint; the slowness is exact (timestamps), not timed."""
    slow = trainer(last_progress_ts=NOW - 100 * STALL, last_busy_ts=NOW - 1, step=3)
    d = decide(snap(facts(slow, producer_paused_since_ts=NOW - 100 * STALL)))
    assert d.state == "running" and not [h for h in d.hints if h.severity == "critical"]
    assert d.online.consumer.state == "running" and "trainer-ended" not in ids(d)
