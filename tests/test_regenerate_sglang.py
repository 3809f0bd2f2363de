"""`hsmon regenerate --backend sglang` against a REAL SGLang server on CPU (the embedded target, through
`hsmon sglang-serve`: the server that extracts generates too), watched by a real `hsmon daemon`:

- a row the server refuses (longer than its context, its limits hidden so the client sends it) is a
  reject with the server's words, and the run goes on;
- one run lives through everything a long regeneration meets: the server slowed (SGLang's own
  /slow_down: each forward sleeps, so rows come further apart than --stall-after whatever the machine)
  reads silent ("the server decoded answers"), never stalled; its scheduler frozen (SIGSTOP) makes the
  server hung and the job stalled, the server named, a webhook with the run's figures; the server
  killed (-9) pauses the run (reason server); started again, the run resumes and ends equal to
  transformers' own greedy answers (an uninterrupted run), each row once, in source order, with two
  answers in flight (rows of two answers finish after the one-answer rows fed behind them).

The SGLang group's shared server (tests/sglang_server.py), killed and started again by the last test."""

from __future__ import annotations

import time

import pytest
from daemon_helpers import Daemon, Procs, WebhookReceiver, post_json, wait_until
from extract_helpers import events_of, wait_for_event
from fake_sglang_proxy import FakeSGLangProxy
from regen_helpers import (
    chat_rows,
    dataset_rows,
    manifest,
    requests_of,
    run_regenerate,
    start_regenerate,
    write_rows,
)
from sglang_server import (  # noqa: F401 (capture_workdir, capture_server: session fixtures)
    CAPTURE_CONTEXT,
    capture_server,
    capture_workdir,
    crash,
    scheduler_of,
)

from hsmon.contracts import layout, regen_layout

pytestmark = pytest.mark.slow
CONTEXT = CAPTURE_CONTEXT  # the server's --context-length
ROWS = 10


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("regenerate-sglang")


@pytest.fixture(scope="module")
def server(capture_server):  # noqa: F811
    """The SGLang group's shared server (tests/sglang_server.py: --context-length 512): this module
    kills and starts it again, as it found it."""
    return capture_server


@pytest.fixture(scope="module")
def data(workdir):
    return write_rows(workdir / "chat.jsonl", chat_rows(ROWS, start=40))


@pytest.fixture(scope="module")
def reference(workdir, data):
    """The in-process run (transformers' greedy generation): what every SGLang run must equal."""
    out = workdir / "hf"
    proc = run_regenerate(data, out)
    assert proc.returncode == 0, proc.stderr
    return (out / regen_layout.DATA_NAME).read_bytes()


def sglang(url: str, *extra: str) -> list[str]:
    return ["--backend", "sglang", "--url", url, *extra]


def test_a_row_the_server_refuses_is_a_reject_and_the_run_goes_on(workdir, server):
    code = "\n".join(source for _, source in requests_of(30, start=100))
    rows = chat_rows(2, start=70)
    rows.insert(1, {"id": "long", "conversations": [{"role": "user", "content": code[:3000]}]})
    path = write_rows(workdir / "refused.jsonl", rows)
    proxy = FakeSGLangProxy(server.url, hide_limits=True).start()  # the client does not know the context
    url = proxy.url
    try:
        out = workdir / "refused"
        proc = run_regenerate(path, out, *sglang(url))
    finally:
        proxy.stop()
    assert proc.returncode == 0, proc.stderr
    assert [r["id"] for r in dataset_rows(out)] == ["row-70", "row-71"]
    (reject,) = list(layout.iter_jsonl(out / "rejects.jsonl"))
    assert reject["row"] == 1 and reject["class"] == "server_too_long", reject
    assert reject["reason"].startswith(f"refused by the server (HTTP 400 from {url})")


def test_slow_reads_silent_frozen_reads_hung_killed_pauses_and_restarted_ends_equal(
        workdir, server, data, reference):
    procs, hook = Procs(), WebhookReceiver()
    out, events = workdir / "watched", workdir / "watched.jsonl"
    proc = start_regenerate(data, out, *sglang(server.url, "--concurrency", "2", "--request-timeout", "120"),
                            "--job", "regen", events=events)
    try:
        daemon = Daemon(procs, workdir, ["--job", "regen", "--events", str(events), "--out", str(out),
                                         "--stall-after", "3", "--scan-interval", "0.5", "--server-interval",
                                         "0.5", "--health-interval", "1", "--health-timeout", "4",
                                         "--notify-webhook", hook.url])
        wait_for_event(events, lambda e: e["kind"] == "rows", proc)
        # slowed: each forward sleeps 0.4 s, an answer of 24 tokens takes 10 s; two in flight, rows are
        # committed at least 5 s apart once a cycle, over --stall-after 3: silent then, whatever the machine
        post_json(server.url + "/slow_down", {"forward_sleep_time": 0.4})
        states = watch_states(daemon, least=10, most=40, until="silent")
        assert "silent" in {s for s, _ in states} and "stalled" not in {s for s, _ in states}, states
        assert any("the server decoded answers" in why for s, why in states if s == "silent"), states
        scheduler = scheduler_of(server)
        scheduler.suspend()  # SIGSTOP: nothing decodes, nothing answers
        job = wait_until(lambda: (j := daemon.job()) and j["state"] == "stalled" and "hung" in j["reason"]
                         and j, 60, interval=0.3, what="the job stalled on its hung server")
        assert job["reason"].startswith(f"server {server.url} is hung")
        assert "server-hung" in {h["id"] for h in job["hints"]}
        crash(server)  # -9, the frozen scheduler with it
        pause = wait_for_event(events, lambda e: e["kind"] == "pause", proc)
        assert pause["reason"] == "server" and pause["url"] == server.url
        wait_until(lambda: daemon.job()["state"] == "paused", 30, interval=0.3, what="the job paused")
        server.start()
        resume = wait_for_event(events, lambda e: e["kind"] == "resume", proc)
        assert resume["reason"] == "server" and resume["paused_seconds"] > 0
        assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""
        done = wait_until(lambda: (j := daemon.job()) and j["state"] == "done" and j, 60, what="done")
        assert done["regenerate"]["rows_done"] == ROWS
    finally:
        if proc.poll() is None:
            proc.kill()
        procs.close()
        hook.close()
        leave_as_found(server)
    assert (out / regen_layout.DATA_NAME).read_bytes() == reference  # transformers' greedy answers
    committed = [r["row"] for r in manifest(out) if r["type"] == "row"]
    assert committed == list(range(ROWS))  # each once, in source order
    provenance = manifest(out)[0]["provenance"]
    assert provenance["engine"] == "sglang" and provenance["release"] and provenance["urls"] == [server.url]
    assert provenance["deterministic"] is False  # no --enable-deterministic-inference: greedy only
    last_rows = [e["last_row"] for e in events_of(events) if e["kind"] == "rows"]
    assert last_rows == sorted(last_rows) and events_of(events)[0]["concurrency"] == 2
    stalled = [b for b in hook.bodies if b.get("state") == "stalled"]
    assert stalled and stalled[0]["kind"] == "regenerate" and stalled[0]["regenerate"]


def watch_states(daemon: Daemon, least: float, most: float, until: str) -> list[tuple[str, str]]:
    """The job's (state, reason) every 0.3 s, for ``least`` seconds and until state ``until`` was seen
    (``most`` seconds at most)."""
    seen: list[tuple[str, str]] = []
    started = time.monotonic()
    while time.monotonic() - started < most:
        job = daemon.job()
        seen.append((job["state"], job["reason"]))
        if time.monotonic() - started >= least and any(s == until for s, _ in seen):
            break
        time.sleep(0.3)
    return seen


def leave_as_found(server) -> None:
    """The shared server running, neither frozen nor slowed (a failure half-way must not leave the
    group's next module a stopped scheduler): started again unless it answers at once."""
    import urllib.request

    try:
        assert server.proc is not None and server.proc.poll() is None
        post_json(server.url + "/slow_down", {"forward_sleep_time": None}, timeout=5)
        with urllib.request.urlopen(server.url + "/health_generate", timeout=10) as resp:
            assert resp.status == 200
    except Exception:
        crash(server)
        server.start()
