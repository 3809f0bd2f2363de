"""hsmon.core.state.decide with the engine's facts (servers, GPUs): pure, no threads, no clock."""

from __future__ import annotations

from hsmon.core.state import decide
from hsmon.core.state_facts import ProcessFacts, ServerFacts, Snapshot

NOW = 10_000.0
URL = "http://10.0.0.5:30000"


def snap(**kw) -> Snapshot:
    base = dict(
        now=NOW,
        stall_after=60.0,
        watch_start_ts=NOW - 1000,
        process_watched=True,
        events_watched=True,
        processes=[ProcessFacts("extractor", 42, True, "sleeping", seen_alive=True)],
    )
    base.update(kw)
    return Snapshot(**base)


def server(state: str, last_forward_ago: float | None = 130.0, detail: str = "") -> ServerFacts:
    last = None if last_forward_ago is None else NOW - last_forward_ago
    return ServerFacts(URL, state, detail or f"{state} detail", last, NOW - 2000)


def ids(decision) -> set[str]:
    return {h.id for h in decision.hints}


def test_stalled_client_with_hung_server_names_the_server_and_the_time_without_forward():
    d = decide(snap(last_progress_ts=NOW - 200, servers=[server("hung", 100)]))
    assert d.state == "stalled"
    assert d.reason == f"server {URL} is hung: no forward completed in 100s"
    hung = next(h for h in d.hints if h.id == "server-hung")
    assert hung.severity == "critical" and "py-spy dump" in hung.message and URL in hung.message
    assert URL in next(h.message for h in d.hints if h.id == "stalled")


def test_hung_server_never_seen_forwarding_counts_from_when_it_was_watched():
    d = decide(snap(last_progress_ts=NOW - 200, servers=[server("hung", None)]))
    assert d.reason == f"server {URL} is hung: no forward completed in 33m"


def test_stalled_client_without_server_trouble_keeps_the_plain_reason():
    d = decide(snap(last_progress_ts=NOW - 200, servers=[server("up", 1)]))
    assert d.state == "stalled"
    assert d.reason == "no signal moved for 3m"
    assert not ids(d) & {"server-hung", "server-down"}


def test_client_waiting_on_a_down_server_stalls_with_the_server_named():
    refused = server("down", detail="[Errno 111] Connection refused")
    d = decide(snap(last_progress_ts=NOW - 90, servers=[refused]))
    assert d.state == "stalled"
    assert d.reason == f"server {URL} is down ([Errno 111] Connection refused)"
    assert "server-down" in ids(d)


def test_client_that_paused_for_its_server_reads_paused_with_the_server_named():
    d = decide(snap(paused_reason="server", last_progress_ts=NOW - 5, servers=[server("down")]))
    assert d.state == "paused"
    assert d.reason == f"the job paused itself (reason: server); server {URL} is down (down detail)"


def test_hung_beats_down_when_both_explain_a_stall():
    other = ServerFacts("http://10.0.0.6:30000", "down", "refused", None, NOW - 10)
    d = decide(snap(last_progress_ts=NOW - 200, servers=[other, server("hung", 70)]))
    assert d.reason == f"server {URL} is hung: no forward completed in 70s"
    assert {"server-hung", "server-down"} <= ids(d)


def test_running_client_is_not_stalled_by_a_hung_server_but_is_told():
    d = decide(snap(last_progress_ts=NOW - 2, servers=[server("hung", 30)]))
    assert d.state == "running"
    assert "server-hung" in ids(d)


def test_healthy_server_and_silent_client_keep_the_buffering_hint():
    proc = ProcessFacts(
        "extractor", 42, True, "running", seen_alive=True, stdout="/x/log", stdout_buffered=True
    )
    d = decide(snap(processes=[proc], events_watched=False, last_work_ts=NOW - 3, last_busy_ts=NOW - 1,
                    servers=[server("up", 1), ServerFacts("http://b:1", "busy", "slow", NOW - 4, NOW - 99)]))
    assert d.state == "silent"
    assert "stdout-buffered" in ids(d)
    assert not ids(d) & {"server-hung", "server-down", "stalled"}


def test_done_and_dead_jobs_carry_no_server_hints():
    done = decide(snap(terminal_kind="done", servers=[server("down")]))
    assert done.state == "done" and "server-down" not in ids(done)
    gone = ProcessFacts("extractor", 42, False, "gone", seen_alive=True)
    dead = decide(snap(processes=[gone], started=True, servers=[server("hung")]))
    assert dead.state == "dead" and "server-hung" not in ids(dead)


def test_transitions_running_to_stalled_by_hung_server_and_back_to_running():
    servers_at = {0: [server("up", 1)], 1: [server("hung", 80)], 2: [server("up", 1)]}
    progress_at = {0: NOW - 1, 1: NOW - 100, 2: NOW - 1}
    states = [decide(snap(last_progress_ts=progress_at[i], servers=servers_at[i])).state for i in range(3)]
    assert states == ["running", "stalled", "running"]


def test_gpu_idle_hint_after_stall_after_while_processes_live():
    d = decide(snap(last_progress_ts=NOW - 5, gpu_indices=[0, 1], gpu_idle_since_ts=NOW - 61))
    hint = next(h for h in d.hints if h.id == "gpu-idle")
    assert hint.severity == "warning" and "GPU 0, 1" in hint.message and "61s" in hint.message


def test_no_gpu_idle_hint_before_stall_after_or_without_gpus_or_when_processes_are_gone():
    recent = dict(last_progress_ts=NOW)
    assert "gpu-idle" not in ids(decide(snap(gpu_indices=[0], gpu_idle_since_ts=NOW - 59, **recent)))
    assert "gpu-idle" not in ids(decide(snap(gpu_indices=[], gpu_idle_since_ts=NOW - 600)))
    assert "gpu-idle" not in ids(decide(snap(gpu_indices=[0], gpu_idle_since_ts=None, **recent)))
    gone = ProcessFacts("extractor", 42, False, "gone", seen_alive=True)
    assert "gpu-idle" not in ids(decide(snap(processes=[gone], gpu_indices=[0], gpu_idle_since_ts=NOW - 600)))
