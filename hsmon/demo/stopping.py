"""What a stop signal does to the demo: Ctrl-C (SIGINT), SIGTERM, or a terminal that went away
(SIGHUP) ends it as `q` does, and more: the training stops (SIGTERM: it writes its checkpoint
first, and the demo waits for it), then the evaluation, the extraction and the daemon; one line
says what stopped, and the demo exits 128 + the signal. Nothing it started is left running.

The training runs in a session of its own (the daemon launched it detached, as for any user of the
launch API), so the terminal's signal never reaches it: the demo is the one that stops it.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

from hsmon.contracts import stop_signals


class DemoStop:
    """The demo's stop signals: the first raises :class:`stop_signals.Interrupted` in the main
    thread (headless: it leaves the status loop for the clean-up), or quits the dashboard (``app``);
    a second one while the clean-up runs changes nothing (the clean-up is what it would ask for)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.app: Any = None  # the dashboard while it runs
        self.stopped: list[str] = []  # what the clean-up stopped, in words
        self.previous = stop_signals.install(self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.signum is not None:
            return
        self.signum = signum
        if self.app is not None:  # Textual's loop runs in this thread: ask it from another one
            app = self.app
            threading.Thread(target=lambda: _quit(app), name="demo-quit", daemon=True).start()
            return
        raise stop_signals.Interrupted(signum)

    def restore(self) -> None:
        stop_signals.restore(self.previous)

    def line(self, stopped: list[str]) -> str:
        """'demo: stopped by SIGINT (Ctrl-C): the training (...), the daemon; nothing left running'."""
        assert self.signum is not None
        how = stop_signals.described(self.signum)
        if not stopped:
            return f"demo: stopped by {how} before anything ran; nothing left running"
        what = stopped[0] if len(stopped) == 1 else f"{', '.join(stopped[:-1])} and {stopped[-1]}"
        return f"demo: stopped by {how}: stopped {what}; nothing left running"


def _quit(app: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the app is not running (any more)
        app.call_from_thread(app.exit)


def training_stopped_at(drafter: Path) -> str:
    """'step 13 of 88, checkpoint in DIR/checkpoints' from the training's own `stopped` event."""
    from hsmon.contracts import events as ev

    path = drafter / "events.jsonl"
    stopped = [e for e in ev.iter_events(path) if e.get("kind") == ev.STOPPED] if path.is_file() else []
    if not stopped:
        return "before its first step"
    step, total = stopped[-1].get("step"), stopped[-1].get("total_steps")
    of = f" of {total}" if total else ""
    return f"at step {step}{of}, its checkpoint in {drafter / 'checkpoints'}"
