"""Webhook notifications on transitions to stalled, dead, paused, exited, stopped and done.

Generic JSON by default; a Slack-compatible body (``{"text": ...}``) with format "slack".
De-duplicated: one message per (job, state), repeated every ``repeat_s`` while the job stays
there, except the end states ``done``, ``stopped`` and ``exited``: said once, on the transition, never
repeated (a finished job needs no hourly reminder). Delivery runs on its own
thread; a failure is logged and counted, never fatal.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from hsmon.core.state_facts import ALERT_STATES
from hsmon.daemon.security import redact_url
from hsmon.status.text import regenerate_rows
from hsmon.status_doc import ENDED_STATES, JobStatus, figures, regenerate_of, to_builtins

log = logging.getLogger("hsmon.notify")
FORMATS = ("json", "slack")
SEVERITY = {
    "stalled": "critical", "dead": "critical", "exited": "warning", "paused": "warning", "done": "info",
    "stopped": "info",  # ended on request or by a signal: a notice (with how far and how to resume)
}
ONCE_STATES = frozenset({"exited", "done", "stopped"})  # announced on the transition, never repeated


def build_body(doc: JobStatus, previous: str | None, fmt: str) -> dict[str, Any]:
    """The webhook payload for a job's status (pure)."""
    hints = [h.message for h in doc.hints if h.severity in ("warning", "critical")]
    training = training_texts(doc)
    regeneration = regenerate_texts(doc)
    if fmt == "slack":
        icons = {"done": ":white_check_mark:", "paused": ":double_vertical_bar:", "exited": ":grey_question:",
                 "stopped": ":stop_button:"}
        icon = icons.get(doc.state, ":warning:")
        text = f"{icon} hsmon: job *{doc.job}* is *{doc.state}*: {doc.reason}"
        if training:
            text += "\ntraining: " + "; ".join(training)
        if regeneration:
            text += "\nregeneration: " + "; ".join(regeneration)
        if hints:
            text += "\n" + "\n".join(f"• {h}" for h in hints[:5])
        return {"text": text}
    return {
        "source": "hsmon",
        "job": doc.job,
        "kind": doc.kind,
        "state": doc.state,
        "severity": SEVERITY.get(doc.state, "info"),
        "previous": previous,
        "reason": doc.reason,
        "since_ts": doc.state_since_ts,
        "hints": to_builtins(doc.hints),
        "progress": to_builtins(doc.progress),
        "training": training,
        "regenerate": regeneration,
        "ts": time.time(),
    }


def training_texts(doc: JobStatus) -> list[str] | None:
    """A training's step and figures as `hsmon status` and the dashboard write them
    ('step 2 / 2, epoch 0, 13.0k tok/s', 'loss 3.841 (pos 0), mean 3.920', ...); None for another job."""
    if not figures.is_training(doc.training):
        return None
    return [figures.step_text(doc.training), *figures.figure_texts(doc.training)]


def regenerate_texts(doc: JobStatus) -> list[str] | None:
    """A regeneration's figures as `hsmon status` writes them ('answers 40 (length 12, stop 28)',
    'length mean answer 210.0 tokens, the source's 340.5', ...); None for another job."""
    regen = regenerate_of(doc)
    if regen is None:
        return None
    return [f"{label} {text}" for label, text in regenerate_rows(regen, doc.state in ENDED_STATES)]


class Notifier:
    """A Monitor listener that posts to a webhook."""

    def __init__(self, url: str, fmt: str = "json", repeat_s: float = 3600.0, timeout_s: float = 5.0) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"--notify-format {fmt!r} is unknown; use one of {', '.join(FORMATS)}")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--notify-webhook {redact_url(url) if '://' in url else '(hidden)'}: not an "
                             "http(s) URL")
        self.url, self.fmt, self.repeat_s, self.timeout_s = url, fmt, repeat_s, timeout_s
        self.sent_total = 0
        self.failed_total = 0
        self.suppressed_total = 0
        self._last_sent: dict[tuple[str, str], float] = {}
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=1000)
        self._thread = threading.Thread(target=self._run, name="hsmon-notify", daemon=True)
        self._thread.start()

    def __call__(self, doc: JobStatus, previous: str | None) -> None:
        """Monitor listener: called after each tick for each job."""
        state = doc.state
        if state not in ALERT_STATES:
            return
        if state in ONCE_STATES and previous is None:
            return  # still there: a warning is said once
        key = (doc.job, state)
        now = time.monotonic()
        last = self._last_sent.get(key)
        if last is not None and now - last < self.repeat_s:
            if previous is not None:
                self.suppressed_total += 1
            return
        self._last_sent[key] = now
        try:
            self._queue.put_nowait(build_body(doc, previous, self.fmt))
        except queue.Full:
            self.failed_total += 1
            log.warning("notification queue full: dropped a message for job %s", doc.job)

    def _run(self) -> None:
        while True:
            body = self._queue.get()
            if body is None:
                return
            self._post(body)

    def _post(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        req = urllib.request.Request(
            self.url,
            data=data,
            method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "hsmon"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                resp.read()
            self.sent_total += 1
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self.failed_total += 1
            log.warning("webhook %s failed: %s (will not retry this message)", redact_url(self.url),
                        str(exc).replace(self.url, redact_url(self.url)))

    def close(self, timeout: float = 5.0) -> None:
        """Deliver what is queued (up to ``timeout``), then stop."""
        self._queue.put(None)
        self._thread.join(timeout)


class NotifierSlot:
    """The daemon's notifications, which a reload may start, change or stop: a Monitor listener
    that hands each transition to the current :class:`Notifier` (none: nothing is sent), with
    counters that survive a change (``active`` once any webhook was configured)."""

    def __init__(self) -> None:
        self.current: Notifier | None = None
        self.key: tuple[str | None, str, float] = (None, "json", 3600.0)
        self.active = False
        self._sent = self._failed = 0  # those of the notifiers replaced

    def configure(self, url: str | None, fmt: str = "json", repeat_s: float = 3600.0) -> bool:
        """Use this webhook from now on (None: none); False when nothing changed. ValueError (one
        line) for a bad URL or format, the current one then kept."""
        key = (url, fmt, repeat_s)
        if key == self.key:
            return False
        new = Notifier(url, fmt, repeat_s) if url else None
        old, self.current, self.key = self.current, new, key
        self.active = self.active or new is not None
        if old is not None:
            old.close(timeout=1.0)
            self._sent += old.sent_total
            self._failed += old.failed_total
        return True

    def __call__(self, doc: JobStatus, previous: str | None) -> None:
        current = self.current
        if current is not None:
            current(doc, previous)

    @property
    def sent_total(self) -> int:
        return self._sent + (self.current.sent_total if self.current else 0)

    @property
    def failed_total(self) -> int:
        return self._failed + (self.current.failed_total if self.current else 0)

    def close(self) -> None:
        if self.current is not None:
            self.current.close()
