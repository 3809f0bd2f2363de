"""The training form: every field of `hsmon train`, prefilled from the job, validated inline."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Button, Input, Label, Static

from hsmon.contracts import train_defaults as defaults
from hsmon.status_doc.figures import fmt_lr

# (field, label, placeholder: at most 35 characters, the room a field has at 120 columns; docs/tui.md
# says more). Field names are the keys of hsmon.launch.training.validate_training_request
# and of the daemon's POST /api/v1/train body.
FIELDS: tuple[tuple[str, str, str], ...] = (
    ("data_dir", "data directory", "the extraction output"),
    ("target_model", "target model", "empty: the embedded target"),
    ("out_dir", "output directory", "where checkpoints and the export go"),
    ("epochs", "epochs", str(defaults.EPOCHS)),
    ("lr", "learning rate", fmt_lr(defaults.LR)),
    ("batch_tokens", "batch (tokens)", str(defaults.BATCH_TOKENS)),
    ("ttt_length", "unroll length", str(defaults.TTT_LENGTH)),
    ("arch", "architecture", "eagle3.1 (default) or eagle3"),
    ("draft_vocab_size", "draft vocab", "empty: 99% of the tokens, 256-32000"),
    ("gpus", "GPUs", "torchrun processes"),
    ("time_limit", "time limit (s)", "empty: no limit"),
    ("threads", "CPU threads", "empty: torch's, per process"),
    ("follow", "follow (online)", "yes: train as it extracts"),
    ("passes", "passes (follow)", "1: batches each row is in"),
    ("consume", "consume (follow)", "yes: delete rows after their passes"),
)
# shown only for an online extraction (a spool being written: hsmon extract --spool-max)
FOLLOW_FIELDS = ("follow", "passes", "consume")
Validator = Callable[[dict[str, str]], dict[str, str]]


class TrainingForm(Vertical):
    """Inputs with their error line under each; Launch posts ``LaunchRequested``."""

    DEFAULT_CSS = """
    TrainingForm { height: auto; }
    TrainingForm .field-box { height: auto; }
    TrainingForm .field { height: 1; }
    TrainingForm .field Label { width: 18; padding: 0 1 0 0; }
    TrainingForm .field Input { width: 1fr; height: 1; border: none; padding: 0 1; background: $boost; }
    TrainingForm .field Input:focus { background: $primary 30%; }
    TrainingForm .field Input.-invalid { background: $error 25%; border: none; }
    TrainingForm .error { color: $error; padding-left: 18; height: auto; }
    TrainingForm .buttons { height: auto; }
    """

    class LaunchRequested(Message):
        """Launch (``fields`` as typed) or Resume (with ``resume: yes``: from the checkpoint there)."""

        def __init__(self, fields: dict[str, str]) -> None:
            super().__init__()
            self.fields = fields

    def __init__(self, validator: Validator | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validator = validator
        self.errors: dict[str, str] = {}

    def compose(self) -> ComposeResult:
        for name, label, placeholder in FIELDS:
            with Vertical(classes="field-box", id=f"box-{name}"):
                with Horizontal(classes="field"):
                    yield Label(label)
                    yield Input(placeholder=placeholder, id=f"field-{name}")
                yield Static("", id=f"error-{name}", classes="error")
        yield Static("", id="form-warning", classes="warning")
        with Horizontal(classes="buttons"):
            yield Button("Launch (l)", id="launch", variant="success")
            yield Button("Resume (R)", id="resume", variant="primary")
            yield Button("Stop (s)", id="stop", variant="error")

    def on_mount(self) -> None:
        for name, _, _ in FIELDS:
            self.query_one(f"#error-{name}", Static).display = False
        self.show_follow(False)

    def show_follow(self, shown: bool) -> None:
        """Show the follow fields (an online extraction) or hide them (their values stay as set)."""
        for name in FOLLOW_FIELDS:
            box = self.query_one(f"#box-{name}", Vertical)
            if box.display != shown:
                box.display = shown

    @property
    def values(self) -> dict[str, str]:
        return {name: self.query_one(f"#field-{name}", Input).value.strip() for name, _, _ in FIELDS}

    def prefill(self, defaults: dict[str, str], overwrite: bool = False) -> None:
        """Fill empty fields (all fields with ``overwrite``) from the job's defaults."""
        for name, _, _ in FIELDS:
            box = self.query_one(f"#field-{name}", Input)
            if name in defaults and (overwrite or not box.value):
                box.value = defaults[name]
        self.validate()

    def set_warning(self, text: str | None) -> None:
        warning = self.query_one("#form-warning", Static)
        warning.update(text or "")
        warning.display = bool(text)

    def validate(self) -> dict[str, str]:
        """Run the validator over every field and show each error under its field."""
        if self.validator is None:
            return {}
        self.show_errors(self.validator(self.values))
        return self.errors

    def show_errors(self, errors: dict[str, str]) -> None:
        self.errors = dict(errors)
        for name, _, _ in FIELDS:
            box = self.query_one(f"#error-{name}", Static)
            message = errors.get(name)
            box.update(message or "")
            box.display = bool(message)
            self.query_one(f"#field-{name}", Input).set_class(bool(message), "-invalid")

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.validate()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.request_launch()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id in ("launch", "resume"):
            event.stop()
            self.request_launch(resume=event.button.id == "resume")

    def request_launch(self, resume: bool = False) -> None:
        """Launch a new training, or (``resume``) go on from the checkpoint of the output directory."""
        fields = {**self.values, "resume": "yes"} if resume else self.values
        if self.validator is not None:
            self.show_errors(self.validator(fields))
        if self.errors:
            self.app.notify("fix the fields marked in red first", severity="error")
            return
        self.post_message(self.LaunchRequested(fields))
