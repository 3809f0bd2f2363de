"""Webhook notifications against a real HTTP receiver on loopback."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest
from daemon_helpers import WebhookReceiver, wait_until

from hsmon import status_doc
from hsmon.daemon.notify import Notifier, build_body

RECORDED = Path(__file__).parent / "fixtures" / "status_document.json"


def doc(state: str) -> status_doc.JobStatus:
    """A job's status (the recorded document's first job) in ``state``."""
    job = status_doc.decode(RECORDED.read_bytes()).jobs[0]
    return msgspec.structs.replace(
        job, job="ex", kind="extract", state=state, reason="because", state_since_ts=1.0,
        hints=[status_doc.Hint(id="stalled", severity="critical", message="no signal moved for 5m")],
        progress=msgspec.structs.replace(job.progress, rows_done=3),
    )


def test_dedup_repeat_and_flapping():
    hook = WebhookReceiver()
    notifier = Notifier(hook.url, repeat_s=1.0)
    try:
        notifier(doc("running"), "starting")  # not an alert state
        notifier(doc("stalled"), "running")
        wait_until(lambda: len(hook.bodies) == 1, 5)
        notifier(doc("stalled"), None)  # still stalled: within the repeat interval
        notifier(doc("running"), "stalled")
        notifier(doc("stalled"), "running")  # flapping back within the interval: not re-announced
        time.sleep(0.3)
        assert [b["state"] for b in hook.bodies] == ["stalled"]
        assert hook.bodies[0]["previous"] == "running" and hook.bodies[0]["hints"][0]["id"] == "stalled"
        time.sleep(1.0)
        notifier(doc("stalled"), None)  # the repeat
        notifier(doc("dead"), "stalled")  # another state: at once
        wait_until(lambda: len(hook.bodies) == 3, 5)
        assert sorted(b["state"] for b in hook.bodies[1:]) == ["dead", "stalled"]
        assert notifier.sent_total == 3 and notifier.failed_total == 0 and notifier.suppressed_total == 1
    finally:
        notifier.close()
        hook.close()


def test_failed_delivery_is_counted_not_raised():
    notifier = Notifier("http://127.0.0.1:9/hook", timeout_s=2)
    notifier(doc("dead"), "running")
    wait_until(lambda: notifier.failed_total == 1, 10)
    notifier.close()


def test_slack_body_and_bad_options():
    body = build_body(doc("stalled"), "running", "slack")
    assert set(body) == {"text"} and "*ex*" in body["text"] and "no signal moved" in body["text"]
    with pytest.raises(ValueError, match="notify-format"):
        Notifier("http://x/", fmt="xml")
    with pytest.raises(ValueError, match="not an http"):
        Notifier("ftp://x/")


def test_exited_and_done_are_said_once_and_never_repeated():
    hook = WebhookReceiver()
    notifier = Notifier(hook.url, repeat_s=0.2)
    try:
        notifier(doc("exited"), "silent")
        wait_until(lambda: len(hook.bodies) == 1, 5)
        time.sleep(0.3)
        for _ in range(3):
            notifier(doc("exited"), None)  # stays exited, past the repeat interval
            time.sleep(0.1)
        notifier(doc("done"), "running")
        wait_until(lambda: len(hook.bodies) == 2, 5)
        time.sleep(0.3)
        for _ in range(3):
            notifier(doc("done"), None)  # stays done, past the repeat interval
            time.sleep(0.1)
        notifier(doc("stalled"), "running")  # a critical state still repeats as before
        time.sleep(0.3)
        notifier(doc("stalled"), None)
        wait_until(lambda: len(hook.bodies) == 4, 5)
        time.sleep(0.2)
        assert [b["state"] for b in hook.bodies] == ["exited", "done", "stalled", "stalled"]
        assert [b["severity"] for b in hook.bodies] == ["warning", "info", "critical", "critical"]
        assert build_body(doc("exited"), "silent", "slack")["text"].startswith(":grey_question:")
    finally:
        notifier.close()
        hook.close()


def test_a_trainings_body_carries_its_figures_as_status_writes_them():
    """The recorded document's training (step 21 of 10,000): the JSON body's `training` texts, and
    the same figures on one line of the Slack text; none for a job that is no training."""
    trained = status_doc.decode(RECORDED.read_bytes()).jobs[1]
    body = build_body(msgspec.structs.replace(trained, state="done"), "running", "json")
    first, second = body["training"][:2]
    assert first.startswith("step 21 / 10.0k, epoch 0") and second.startswith("loss "), body["training"]
    slack = build_body(msgspec.structs.replace(trained, state="done"), "running", "slack")["text"]
    assert "\ntraining: " + "; ".join(body["training"]) in slack
    assert build_body(doc("done"), "running", "json")["training"] is None
