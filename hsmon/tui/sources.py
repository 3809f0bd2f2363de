"""Where the dashboard's status documents come from.

A ``StatusSource`` delivers status documents (docs/status-api.md) to the app as messages from a
worker thread (the watcher-thread style of Textualize/toolong), and carries out the two actions
that start or stop work: launching a training and stopping a job.

- ``HttpStatusSource``: a daemon's ``/api/v1/status``; actions go to its API with the bearer token.
- ``InProcessSource``: trackers run in this process (``hsmon.core.monitor.Monitor``); actions use
  ``hsmon.launch.training`` directly and the launched training is added to the monitor as a job.
- ``FixedSource``: documents given up front (a saved ``hsmon status --json``; tests).

Every source delivers the typed ``hsmon.status_doc.StatusDocument``; the events inside it
(``recent_events``) stay the dicts the jobs wrote.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from textual.message import Message

from hsmon.status.client import StatusClient
from hsmon.status_doc import JobStatus, StatusDocument, decode, from_builtins
from hsmon.tui.clocks import generated_ts, quiet_bytes, quiet_signature
from hsmon.tui.messages import SourceDown, StatusUpdate

Post = Callable[[Message], Any]
RETRY_DELAYS = (1.0, 2.0, 3.0, 5.0)
PATH_FIELDS = frozenset({"data_dir", "target_model", "out_dir"})


@dataclass
class ActionResult:
    """Outcome of a launch or stop: ``ok``, a one-line ``message``, and per-field ``errors``."""

    ok: bool
    message: str
    errors: dict[str, str] = field(default_factory=dict)
    job: str | None = None


class StatusSource:
    """Base class: a thread that posts ``StatusUpdate``/``SourceDown`` until stopped."""

    label = "?"
    is_local = True  # its paths are this machine's paths

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self.source_id = 0
        self._post: Post | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        # Set by the app after each render: the document time from which the clocks it shows
        # change (0: every document). Until then a document that differs from the last one sent
        # only in its clocks is not sent (hsmon/tui/clocks.py).
        self.due_ts = 0.0
        self._sent: Any = None  # quiet_signature of the last document sent
        self._skipped = 0
        self._force = False

    def start(self, source_id: int, post: Post) -> None:
        """Start delivering documents through ``post`` (thread-safe message posting)."""
        self.source_id = source_id
        self._post = post
        self._thread = threading.Thread(target=self._run, name=f"hsmon-source-{source_id}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=3)

    def poll_now(self) -> None:
        """Read again at once (after an action, or on the user's refresh), and send what is read."""
        self._force = True
        self._wake.set()

    def _sleep(self, seconds: float) -> bool:
        """Wait ``seconds`` or until woken; False once stopped."""
        self._wake.wait(seconds)
        self._wake.clear()
        return not self._stop.is_set()

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                document = self.fetch()
            except Exception as exc:  # any failure is shown, then retried
                delay = RETRY_DELAYS[min(failures, len(RETRY_DELAYS) - 1)]
                failures += 1
                self._sent = None
                self._emit(SourceDown(self.source_id, _one_line(exc), delay))
                if not self._sleep(delay):
                    return
                continue
            failures = 0
            if document is not None:
                self._deliver(document)
            if not self._sleep(self.interval):
                return

    def _deliver(self, document: StatusDocument) -> bool:
        """Send ``document`` unless it differs from the last one sent only in clocks whose shown
        text has not changed (before ``due_ts``); True when sent."""
        signature = quiet_signature(document)
        due = document.generated_ts >= self.due_ts
        if self._force or due or signature != self._sent:
            self._force = False
            self._emit(StatusUpdate(self.source_id, document, self._skipped))
            self._sent, self._skipped = signature, 0
            return True
        self._skipped += 1
        return False

    def _emit(self, message: Message) -> None:
        if self._post is not None and not self._stop.is_set():
            self._post(message)

    # -- what subclasses provide -------------------------------------------------------------
    def fetch(self) -> StatusDocument | None:
        """One status document (None: nothing new). Raise to report the source as down."""
        raise NotImplementedError

    def validate_fields(self, fields: dict[str, str]) -> dict[str, str]:
        """Inline errors for the training form: {field: one-line error}, empty when it is fine."""
        from hsmon.launch.training import validate_training_request

        return dict(validate_training_request(fields, form=True)[1])

    def launch_training(self, fields: dict[str, str]) -> ActionResult:
        """Start a drafter training (blocking: call from a worker thread)."""
        return ActionResult(False, f"{self.label}: this source cannot launch a training")

    def stop_job(self, job: JobStatus) -> ActionResult:
        """Stop a job gracefully (blocking: call from a worker thread)."""
        return ActionResult(False, f"{self.label}: this source cannot stop a job")


def _one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


class HttpStatusSource(StatusSource):
    """Polls a daemon's ``/api/v1/status``; launches and stops through its token-guarded API."""

    def __init__(self, url: str, token: str | None = None, interval: float = 1.0,
                 timeout: float = 3.0, ca: str | None = None) -> None:
        super().__init__(interval)
        self._client = StatusClient(url, timeout, ca=ca, token=token)
        self.ca = ca
        self.base_url = self._client.base_url
        self.label = self.base_url.split("://", 1)[-1]
        self.token = token
        self.timeout = timeout
        self._sent_bytes = b""  # quiet_bytes of the last document sent
        self._pending_bytes = b""
        self._control_ok = False  # the control token passed a check (control_problem)

    @property
    def is_local(self) -> bool:
        host = self.label.split("/", 1)[0].rsplit(":", 1)[0].strip("[]")
        return host in ("127.0.0.1", "localhost", "::1")

    def validate_fields(self, fields: dict[str, str]) -> dict[str, str]:
        """Paths are checked here only for a daemon on this machine; a remote one checks its own."""
        errors = super().validate_fields(fields)
        if not self.is_local:
            errors = {k: v for k, v in errors.items() if k not in PATH_FIELDS}
        return errors

    def fetch(self) -> StatusDocument | None:
        """The daemon's document; None (counted as skipped) when its text, without its clocks, is
        the last sent one's and the app's due time has not come: not even parsed."""
        body = self._client.get()
        quiet = quiet_bytes(body)
        now = generated_ts(body)
        if (not self._force and quiet == self._sent_bytes and now is not None and now < self.due_ts
                and self._sent is not None):
            self._skipped += 1
            return None
        try:
            document = decode(body)
        except msgspec.DecodeError as exc:  # ValidationError too: it names the bad field
            raise ValueError(f"{self.base_url}/api/v1/status did not return a status document "
                             f"this hsmon reads ({exc})") from None
        self._pending_bytes = quiet
        return document

    def _deliver(self, document: StatusDocument) -> bool:
        sent = super()._deliver(document)
        if sent:
            self._sent_bytes = self._pending_bytes
        return sent

    def control_problem(self) -> str | None:
        """Both sides of the control token checked at once, until a check passes
        (hsmon/tui/control_check.py): None when a launch may go, else everything missing."""
        if self._control_ok:
            return None
        import requests

        from hsmon.tui.control_check import control_problem

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            code: int | None = requests.post(f"{self.base_url}/api/v1/train", json={}, headers=headers,
                                             timeout=self.timeout, verify=self.ca or True).status_code
        except requests.RequestException:
            code = None
        problem = control_problem(code, bool(self.token), self.label)
        self._control_ok = problem is None
        return problem

    def _post_action(self, path: str, body: dict[str, Any]) -> ActionResult:
        if problem := self.control_problem():
            return ActionResult(False, problem)
        import requests

        try:
            response = requests.post(f"{self.base_url}{path}", json=body, timeout=max(self.timeout, 30.0),
                                     headers={"Authorization": f"Bearer {self.token}"},
                                     verify=self.ca or True)
        except requests.RequestException as exc:
            return ActionResult(False, f"{self.label}: {_one_line(exc)}")
        try:
            reply = response.json()
        except ValueError:
            reply = {}
        if not isinstance(reply, dict):
            reply = {}
        errors = reply.get("errors") if isinstance(reply.get("errors"), dict) else {}
        message = reply.get("message") or reply.get("error") or errors.get("_") or ""
        if not message and errors:
            message = "the daemon refused: " + "; ".join(str(v) for v in errors.values())
        if response.status_code in (401, 403):
            return ActionResult(False, message or "the daemon refused the token (401/403)")
        if response.status_code >= 400:
            return ActionResult(False, message or f"the daemon answered {response.status_code}",
                                {str(k): str(v) for k, v in errors.items()})
        self.poll_now()
        if reply.get("warning"):
            message = f"{message or 'done'}; {reply['warning']}"
        return ActionResult(True, message or "done", job=reply.get("job"))

    def launch_training(self, fields: dict[str, str]) -> ActionResult:
        result = self._post_action("/api/v1/train", dict(fields))
        if result.ok and result.message.startswith("done"):
            result.message = f"training {result.job} launched through {self.label}" + result.message[4:]
        return result

    def stop_job(self, job: JobStatus) -> ActionResult:
        name = job.job
        result = self._post_action(f"/api/v1/jobs/{name}/stop", {})
        if result.ok and result.message == "done":
            result.message = f"asked {name} to stop (it writes a checkpoint first)"
        return result


class FixedSource(StatusSource):
    """Documents given up front, delivered in order (a saved status; deterministic tests). A
    document given as parsed JSON (a dict) is converted to the types here."""

    def __init__(self, documents: Sequence[StatusDocument | dict[str, Any]], label: str = "file",
                 interval: float = 0.0) -> None:
        super().__init__(interval)
        self.label = label
        self._documents = [doc if isinstance(doc, StatusDocument) else from_builtins(doc)
                           for doc in documents]
        self.is_local = False  # a saved document's paths may be another machine's

    @classmethod
    def from_file(cls, path: str) -> FixedSource:
        with open(path, "rb") as fh:
            body = fh.read()
        try:
            document = decode(body)
        except msgspec.DecodeError as exc:
            raise ValueError(f"{exc}; give the output of `hsmon status --json`") from None
        return cls([document], label=path)

    def _run(self) -> None:
        for document in self._documents:
            if self._stop.is_set():
                return
            self._emit(StatusUpdate(self.source_id, document))
            if self.interval:
                time.sleep(self.interval)

    def fetch(self) -> StatusDocument | None:
        return self._documents[-1] if self._documents else None


class InProcessSource(StatusSource):
    """Runs the trackers in this process (no daemon needed) and reads their status document."""

    label = "local"

    def __init__(self, job_configs: list[Any], interval: float = 1.0) -> None:
        super().__init__(interval)
        from hsmon.core.monitor import Monitor

        self.monitor = Monitor(job_configs, source="inprocess")
        self._started = False

    def start(self, source_id: int, post: Post) -> None:
        self.monitor.start()
        self._started = True
        super().start(source_id, post)

    def stop(self) -> None:
        super().stop()
        if self._started:
            self.monitor.stop()
            self._started = False

    def fetch(self) -> StatusDocument:
        return self.monitor.status()

    def launch_training(self, fields: dict[str, str]) -> ActionResult:
        from hsmon.launch.watch import launch_and_watch

        try:
            outcome = launch_and_watch(self.monitor, fields)
        except OSError as exc:
            return ActionResult(False, f"launch failed: {_one_line(exc)}")
        if outcome.errors:
            return ActionResult(False, "fix the highlighted fields", outcome.errors)
        launched = outcome.job
        if launched is None:
            conflict = outcome.conflict or "not launched"
            return ActionResult(False, conflict, {"out_dir": conflict})
        self.poll_now()
        message = f"training {launched.job} launched (pid {launched.pid}, log {launched.log})"
        warning = outcome.warning
        return ActionResult(True, f"{message}; {warning}" if warning else message, job=launched.job)

    def stop_job(self, job: JobStatus) -> ActionResult:
        from hsmon.launch.watch import stop_watched

        try:
            pid, error = stop_watched(self.monitor, job.job)
        except OSError as exc:
            return ActionResult(False, f"stop failed: {_one_line(exc)}")
        if pid is None:
            return ActionResult(False, error or f"{job.job}: no live process to stop")
        self.poll_now()
        return ActionResult(True, f"asked {job.job} (pid {pid}) to stop; it writes a checkpoint first")
