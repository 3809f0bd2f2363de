"""The hsmon dashboard: keeps the latest status document of every source and shows it.

Sources post documents from their own threads; the app stores them, bumps ``revision``, and the
visible screen redraws (the hidden one catches up when shown), so CPU use follows the refresh
interval, not the job's event rate.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, ClassVar

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.reactive import var

from hsmon import __version__
from hsmon.status_doc import ENDED_STATES, JobStatus, StatusDocument, online_of
from hsmon.tui.backfill import RateSeries, events_rate_history
from hsmon.tui.clocks import has_short_clocks, next_minute
from hsmon.tui.messages import SourceDown, StatusUpdate
from hsmon.tui.screens.help import HelpScreen
from hsmon.tui.screens.overview import OverviewScreen
from hsmon.tui.screens.training import TrainingScreen
from hsmon.tui.sources import ActionResult, StatusSource
from hsmon.tui.view import HISTORY_POINTS, JobHistory, is_acceptance_job
from hsmon.tui.widgets.connection_bar import Connection

JobKey = tuple[int, str]


class HsmonApp(App[None]):
    """`hsmon tui`."""

    CSS_PATH = "hsmon.tcss"
    TITLE = "hsmon"
    SUB_TITLE = f"extraction and training monitor {__version__}"
    MODES: ClassVar = {"overview": OverviewScreen, "training": TrainingScreen}
    DEFAULT_MODE = "overview"
    ENABLE_COMMAND_PALETTE = False  # every action has its own key; the footer keeps the room
    HORIZONTAL_BREAKPOINTS: ClassVar = [(0, "-narrow"), (120, "-wide")]
    BINDINGS: ClassVar = [
        Binding("o", "switch_mode('overview')", "overview"),
        Binding("t", "switch_mode('training')", "training"),
        Binding("r", "poll_now", "refresh", show=False),  # in the help (the footer fits 80 columns)
        Binding("question_mark", "help", "help", key_display="?"),
        Binding("q", "quit", "quit"),
        Binding("ctrl+c", "quit", "quit", show=False, priority=True),  # as htop and k9s: Ctrl-C quits
    ]

    # A var, not a reactive: a reactive on the app repaints the whole screen whenever it is set;
    # the screens watch it and repaint only the widgets whose content changed.
    revision: var[int] = var(0, always_update=True)

    def __init__(self, sources: Sequence[StatusSource], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sources = list(sources)
        self.documents: dict[int, StatusDocument] = {}  # the newest document of each source
        self.errors: dict[int, str | None] = {}
        # Sources gone after every job they watched had ended: a note, not an alarm.
        self.finished: dict[int, str] = {}
        self.last_update: dict[int, float] = {}
        self.histories: dict[JobKey, JobHistory] = {}
        self.selected: JobKey | None = None
        self.launched: JobKey | None = None
        self.first_paint_ts: float | None = None
        # Documents that arrive faster than the sources' refresh interval are coalesced: only the
        # newest is rendered (the histories still record every one).
        self.render_interval = 0.9 * min((source.interval for source in self.sources), default=0.0)
        self._render_pending = False
        self._last_render = float("-inf")

    # -- lifecycle --------------------------------------------------------------------------
    def on_mount(self) -> None:
        for source_id, source in enumerate(self.sources):
            self.errors[source_id] = "connecting…"
            source.start(source_id, self.post_message)

    def add_source(self, source: StatusSource) -> int:
        """Watch one more source from now on (the demo's eval-drafter, started after the dashboard)."""
        source_id = len(self.sources)
        self.sources.append(source)
        self.errors[source_id] = "connecting…"
        source.start(source_id, self.post_message)
        self.revision += 1
        return source_id

    def on_unmount(self) -> None:
        for source in self.sources:
            source.stop()

    # -- messages from the sources ----------------------------------------------------------
    def on_status_update(self, message: StatusUpdate) -> None:
        document = message.document
        self.documents[message.source_id] = document
        self.errors[message.source_id] = None
        self.finished.pop(message.source_id, None)
        self.last_update[message.source_id] = time.monotonic()
        present = set()
        for job in document.jobs:
            key = (message.source_id, job.job)
            present.add(key)
            if key not in self.histories:
                self._backfill_from_events(key, job)
            self.history(key).add(job, document.generated_ts, message.skipped)
        for key in [k for k in self.histories if k[0] == message.source_id and k not in present]:
            del self.histories[key]  # a job the daemon retired: its figures go with its tab
        self._schedule_render()

    def _schedule_render(self) -> None:
        """Render the newest documents once: at once (after the messages already queued), or when
        the refresh interval since the last render has passed."""
        if self._render_pending:
            return
        self._render_pending = True
        wait = self._last_render + self.render_interval - time.monotonic()
        if wait > 0:
            self.set_timer(wait, self._render)
        else:
            self.call_later(self._render)

    def _render(self) -> None:
        self._render_pending = False
        self._last_render = time.monotonic()
        self.revision += 1
        if self.first_paint_ts is None:
            self.first_paint_ts = time.time()
        for source_id, document in self.documents.items():
            self.sources[source_id].due_ts = self._clock_due(source_id, document)

    def _clock_due(self, source_id: int, document: StatusDocument) -> float:
        """The document time from which what this source's jobs show changes with the clock alone:
        the next document while a figure below a minute grows or a sparkline still moves, else the
        next minute (hsmon/tui/clocks.py)."""
        now = document.generated_ts
        for job in document.jobs:
            history = self.history((source_id, job.job))
            newest = max((e.get("ts") for e in history.events if isinstance(e.get("ts"), (int, float))),
                         default=None)
            if not history.settled() or has_short_clocks(job, newest, now):
                return 0.0
        return next_minute(now)

    def on_source_down(self, message: SourceDown) -> None:
        source_id = message.source_id
        if self.ended_before_going(source_id):
            self.finished[source_id] = (
                "gone after every job it watched had ended: their last state is shown "
                f"(read {time.strftime('%H:%M:%S', time.localtime(self.documents[source_id].generated_ts))})"
            )
        self.errors[source_id] = f"disconnected, retrying in {message.retry_in:.0f}s ({message.error})"
        self.revision += 1

    def ended_before_going(self, source_id: int) -> bool:
        """True when the source's last document showed jobs, every one of them ended: a daemon that
        exits with its run (`hsmon online --daemon`) leaves a result, not a connection to wait for."""
        document = self.documents.get(source_id)
        return document is not None and bool(document.jobs) and all(
            job.state in ENDED_STATES for job in document.jobs
        )

    def _backfill_from_events(self, key: JobKey, job: JobStatus) -> None:
        """A job seen for the first time: rebuild its rate history from its events file (when this
        machine can read it), so that a job that ran before the dashboard started has sparklines."""
        path = job.events.path if job.events is not None else None
        if path and self.sources[key[0]].is_local:
            self._backfill_worker(key, str(path))

    @work(thread=True, group="backfill")
    def _backfill_worker(self, key: JobKey, path: str) -> None:
        series = events_rate_history(path, HISTORY_POINTS)
        if series is not None:
            self.call_from_thread(self._backfilled, key, series)

    def _backfilled(self, key: JobKey, series: RateSeries) -> None:
        self.history(key).backfill(series.rows_per_s, series.tokens_per_s, series.bytes_per_s)
        self.revision += 1

    # -- what screens read ------------------------------------------------------------------
    def history(self, key: JobKey) -> JobHistory:
        if key not in self.histories:
            self.histories[key] = JobHistory()
        return self.histories[key]

    def jobs(self) -> list[tuple[JobKey, JobStatus, StatusDocument]]:
        """(key, job, document) for every job of every source, in source then document order."""
        out = []
        for source_id in sorted(self.documents):
            document = self.documents[source_id]
            for job in document.jobs:
                out.append(((source_id, job.job), job, document))
        return out

    def job(self, key: JobKey | None) -> JobStatus | None:
        for job_key, job, _ in self.jobs():
            if job_key == key:
                return job
        return None

    def tab_label(self, key: JobKey) -> str:
        if len(self.sources) > 1:
            return f"{key[1]} @ {self.sources[key[0]].label}"
        return key[1]

    def connection_states(self) -> list[Connection]:
        return [
            Connection(source.label, self.errors.get(i), self.finished.get(i))
            for i, source in enumerate(self.sources)
        ]

    def stale_note(self, source_id: int) -> str | None:
        error = self.errors.get(source_id)
        if error is None or source_id not in self.last_update or source_id in self.finished:
            return None
        age = time.monotonic() - self.last_update[source_id]
        return f"{self.sources[source_id].label} {error.split(' (')[0]}: figures are {age:.0f}s old"

    def extraction_job(self) -> tuple[JobKey, JobStatus] | None:
        """The job a training would train on: the selected one unless it is a training itself."""
        selected = self.job(self.selected)
        if (selected is not None and selected.kind != "train" and self.selected is not None
                and not is_acceptance_job(selected)):
            return self.selected, selected
        for key, job, _ in self.jobs():
            if job.kind != "train" and job.training is None and not is_acceptance_job(job):
                return key, job
        return None

    def training_job(self) -> tuple[JobKey, JobStatus] | None:
        """The training to follow: the one launched here, else the last training job seen."""
        launched = self.job(self.launched)
        if launched is not None and self.launched is not None:
            return self.launched, launched
        found = None
        for key, job, _ in self.jobs():
            if (job.kind == "train" or job.training is not None) and not is_acceptance_job(job):
                found = (key, job)
        return found

    def online_job(self) -> tuple[JobKey, JobStatus] | None:
        """The last online extraction seen (its spool's consumer is a trainer of its own)."""
        found = None
        for key, job, _ in self.jobs():
            if online_of(job) is not None:
                found = (key, job)
        return found

    def acceptance_job(self) -> tuple[JobKey, JobStatus] | None:
        """The last `hsmon eval-drafter` run seen (its progress, then its acceptance lengths)."""
        found = None
        for key, job, _ in self.jobs():
            if is_acceptance_job(job):
                found = (key, job)
        return found

    def source_for_actions(self) -> tuple[int, StatusSource]:
        key = self.extraction_job()
        source_id = key[0][0] if key else 0
        return source_id, self.sources[source_id]

    # -- actions ----------------------------------------------------------------------------
    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_poll_now(self) -> None:
        for source in self.sources:
            source.poll_now()
        self.notify("reading every source again", timeout=2)

    def launch_training(self, fields: dict[str, str]) -> None:
        """Launch in a thread (a launch can take a second); report in a notification."""
        if not self.sources:
            self.notify("no source to launch through", severity="error")
            return
        source_id, source = self.source_for_actions()
        self.notify(f"launching hsmon train through {source.label}…", timeout=3)
        self._launch_worker(source_id, source, fields)

    @work(thread=True, exclusive=True, group="launch")
    def _launch_worker(self, source_id: int, source: StatusSource, fields: dict[str, str]) -> None:
        result = source.launch_training(fields)
        self.call_from_thread(self._launched, source_id, result)

    def _launched(self, source_id: int, result: ActionResult) -> None:
        if result.ok:
            if result.job:
                self.launched = (source_id, result.job)
            self.notify(result.message, title="training launched")
        else:
            self.notify(result.message, title="launch failed", severity="error", timeout=10)
        screen = self.screen
        if isinstance(screen, TrainingScreen):
            screen.show_launch_errors(result.errors)
        self.revision += 1

    def stop_job(self, key: JobKey) -> None:
        job = self.job(key)
        if job is None:
            self.notify(f"{key[1]} is not known any more", severity="error")
            return
        self._stop_worker(self.sources[key[0]], job)

    @work(thread=True, group="stop")
    def _stop_worker(self, source: StatusSource, job: JobStatus) -> None:
        result = source.stop_job(job)
        self.call_from_thread(self.notify, result.message, title="stop" if result.ok else "stop failed",
                              severity="information" if result.ok else "error")
