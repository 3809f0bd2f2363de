"""Everything about one job on one scrollable page: the overview tab of a job."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Grid, VerticalScroll

from hsmon.status_doc import GpuSection, JobStatus
from hsmon.tui.view import JobHistory
from hsmon.tui.widgets.alerts import AlertsPanel
from hsmon.tui.widgets.data_panel import DataPanel
from hsmon.tui.widgets.disk_panel import DiskPanel
from hsmon.tui.widgets.dump_panel import DumpPanel
from hsmon.tui.widgets.engine_panel import EnginePanel
from hsmon.tui.widgets.event_log import EventLog
from hsmon.tui.widgets.job_header import JobHeader
from hsmon.tui.widgets.online_panel import OnlinePanel
from hsmon.tui.widgets.processes import ProcessTable
from hsmon.tui.widgets.progress_panel import ProgressPanel
from hsmon.tui.widgets.quiet import WholeCellScrollBar
from hsmon.tui.widgets.rates import RatesPanel
from hsmon.tui.widgets.regenerate_panel import RegeneratePanel


class JobOverview(VerticalScroll):
    """Header, alerts, progress, rates, dump backlog, disk, data, servers and GPUs, processes and the
    event log of a job."""

    def __init__(self, key: tuple[int, str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.key = key
        self._parts: tuple[Any, ...] | None = None

    def compose(self) -> ComposeResult:
        yield JobHeader(classes="job-header")
        yield AlertsPanel(classes="alerts")
        # an online job's two sides: the whole width (their reasons are long), above the others
        online = OnlinePanel(classes="panel")
        online.border_title = "online: the spool and both sides"
        yield online
        regenerate = RegeneratePanel(classes="panel")  # a regeneration's answers, the whole width too
        regenerate.border_title = "regenerate: the target's own answers"
        yield regenerate
        with Grid(classes="panels"):
            progress = ProgressPanel(classes="panel")
            progress.border_title = "progress"
            yield progress
            rates = RatesPanel(classes="panel")
            rates.border_title = "rates"
            yield rates
            dump = DumpPanel(classes="panel")
            dump.border_title = "dump"
            yield dump
            disk = DiskPanel(classes="panel")
            disk.border_title = "disk"
            yield disk
            data = DataPanel(classes="panel")
            data.border_title = "data: mean L2 norm per chunk, by layer"
            yield data
            engine = EnginePanel(classes="panel")
            engine.border_title = "servers and GPUs"
            yield engine
        processes = ProcessTable(classes="panel")
        processes.border_title = "processes"
        yield processes
        log = EventLog(classes="panel")
        log.border_title = "events  (f: filter)"
        yield log

    def on_mount(self) -> None:
        self.vertical_scrollbar.renderer = WholeCellScrollBar

    def show(self, job: JobStatus, history: JobHistory, now_ts: float | None,
             stale: str | None = None, gpus: GpuSection | None = None) -> None:
        """Render one job's status (``stale``: why these figures may be old; ``gpus``: the
        document's machine-wide GPU section)."""
        if self._parts is None:  # found once: a query walks the page, and this runs at every document
            self._parts = tuple(self.query_one(part) for part in (
                JobHeader, AlertsPanel, ProgressPanel, OnlinePanel, RegeneratePanel, RatesPanel, DumpPanel,
                DiskPanel, DataPanel, EnginePanel, ProcessTable, EventLog))
        header, alerts, progress, online, regenerate, rates, dump, disk, data, engine, processes, log = \
            self._parts
        header.show(job, stale)
        alerts.show(job)
        progress.show(job)
        online.show(job)
        regenerate.show(job)
        rates.show(job, history)
        dump.show(job, history)
        disk.show(job)
        data.show(job)
        engine.show(job, history, gpus, now_ts)
        processes.show(job)
        log.show(job, now_ts, history.events)
