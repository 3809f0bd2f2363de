"""The training screen: the form that launches `hsmon train`, and the training's live figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Header

from hsmon.contracts.layout import MANIFEST_NAME
from hsmon.status_doc import ENDED_STATES, JobStatus, online_of
from hsmon.tui.screens.confirm import ConfirmScreen
from hsmon.tui.view import complete_chunks, extraction_unfinished, training_defaults
from hsmon.tui.widgets.acceptance import AcceptancePanel
from hsmon.tui.widgets.compact_footer import compact_footer
from hsmon.tui.widgets.connection_bar import ConnectionBar
from hsmon.tui.widgets.quiet import WholeCellScrollBar
from hsmon.tui.widgets.training_form import TrainingForm
from hsmon.tui.widgets.training_status import TrainingStatus
from hsmon.tui.widgets.unroll_plot import UnrollPlot


def manifest_model(data_dir: str) -> str | None:
    """The target model an extraction used, from the first `run` record of its manifest (first line
    only: a manifest of a long run is large). None when there is no such local record."""
    if not data_dir:
        return None
    try:
        with open(Path(data_dir) / MANIFEST_NAME, encoding="utf-8") as fh:
            record = json.loads(fh.readline() or "{}")
    except (OSError, ValueError):
        return None
    model = (record.get("settings") or {}).get("model") if isinstance(record, dict) else None
    return str(model) if isinstance(model, str) and model else None


class TrainingScreen(Screen[None]):
    """Prefilled from the job selected in the overview; follows the training it launched."""

    BINDINGS: ClassVar = [
        Binding("l", "launch", "launch"),
        Binding("R", "resume", "resume"),
        Binding("s", "stop", "stop"),
        Binding("ctrl+r", "prefill", "reset form", show=False),
        Binding("escape", "leave_field", "leave field", show=False),
    ]
    AUTO_FOCUS = None  # keys work at once; tab walks into the form

    def __init__(self) -> None:
        super().__init__()
        self._prefilled_from: object = None

    def compose(self) -> ComposeResult:
        yield Header(icon="◉")
        yield ConnectionBar(id="connections")
        with VerticalScroll(id="training-body"), Horizontal(id="training-columns"):
            with Vertical(id="training-live") as live:
                live.border_title = "training"
                yield TrainingStatus(id="training-status")
                yield AcceptancePanel(id="acceptance")
                yield UnrollPlot(id="unroll-plot")
            with Vertical(id="training-form-box") as box:
                box.border_title = "launch a drafter training"
                yield TrainingForm(validator=self._validate, id="training-form")
        yield compact_footer()

    def _validate(self, fields: dict[str, str]) -> dict[str, str]:
        if not self.app.sources:
            return {}
        return self.app.source_for_actions()[1].validate_fields(fields)

    def on_mount(self) -> None:
        self.query_one("#training-body", VerticalScroll).vertical_scrollbar.renderer = WholeCellScrollBar
        self.watch(self.app, "revision", self.refresh_from_app, init=False)
        self.refresh_from_app()

    def on_screen_resume(self) -> None:
        self.refresh_from_app()

    def refresh_from_app(self) -> None:
        if not self.is_current:
            return
        app = self.app
        self.query_one("#connections", ConnectionBar).show(app.connection_states())
        source_job = app.extraction_job()
        key = source_job[0] if source_job else None
        form = self.query_one(TrainingForm)
        if key != self._prefilled_from:
            self._prefilled_from = key
            form.prefill(self._defaults(source_job))
        extraction = source_job[1] if source_job else None
        following = bool(extraction and online_of(extraction) is not None
                         and extraction.state not in ENDED_STATES)
        form.show_follow(following)
        training = app.training_job()
        online = app.online_job() if training is None else None
        followed = online is not None and online_of(online[1]).consumer.state != "starting"
        if following and followed and online is not None and online[1] is extraction:
            form.set_warning(f"▲ a training already follows extraction {extraction.job} (its figures "
                             "are in the training panel): a second one would share its spool")
        elif following:
            form.set_warning(f"▲ extraction {extraction.job} writes a spool: follow = yes trains on its "
                             "chunks as they complete (hsmon train --follow), consume = yes makes room")
        elif extraction_unfinished(extraction):
            chunks = complete_chunks(extraction)
            if chunks == 0:
                form.set_warning(f"▲ extraction {extraction.job} is unfinished and no chunk is "
                                 "complete yet: a training now would find no data")
            else:
                form.set_warning(f"▲ extraction {extraction.job} is unfinished: a training now uses "
                                 f"only the {chunks if chunks is not None else '?'} complete chunks")
        else:
            form.set_warning(None)
        self.query_one(TrainingStatus).show(training[1] if training else None,
                                            online[1] if followed and online is not None else None)
        acceptance = app.acceptance_job()
        self.query_one(AcceptancePanel).show(acceptance[1] if acceptance else None)
        self.query_one(UnrollPlot).set_history(app.history(training[0]).unroll if training else None)
        self.query_one("#stop", Button).disabled = training is None or training[1].state in ENDED_STATES

    def action_leave_field(self) -> None:
        self.query_one("#launch", Button).focus()

    def _defaults(self, source_job: tuple[tuple[int, str], JobStatus] | None) -> dict[str, str]:
        defaults = training_defaults(source_job[1] if source_job else None)
        if source_job and not defaults["target_model"] and self.app.sources[source_job[0][0]].is_local:
            # The start event has scrolled out of the status: the manifest says which target it was.
            defaults["target_model"] = manifest_model(defaults["data_dir"]) or ""
        return defaults

    def action_prefill(self) -> None:
        self.query_one(TrainingForm).prefill(self._defaults(self.app.extraction_job()), overwrite=True)

    def action_launch(self) -> None:
        self.query_one(TrainingForm).request_launch()

    def action_resume(self) -> None:
        self.query_one(TrainingForm).request_launch(resume=True)

    def on_training_form_launch_requested(self, message: TrainingForm.LaunchRequested) -> None:
        self.app.launch_training(message.fields)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "stop":
            self.action_stop()

    def action_stop(self) -> None:
        training = self.app.training_job()
        if training is None:
            self.app.notify("no training to stop", severity="warning")
            return
        name = training[1].job

        def answered(yes: bool | None) -> None:
            if yes:
                self.app.stop_job(training[0])
            else:
                self.app.notify(f"{name} keeps running")

        self.app.push_screen(ConfirmScreen(f"Stop training {name}?\nIt writes a checkpoint, then exits."),
                             answered)

    def show_launch_errors(self, errors: dict[str, str]) -> None:
        if errors:
            self.query_one(TrainingForm).show_errors(errors)
