"""How every long command ends on a signal: Ctrl-C (SIGINT), `kill` or systemd (SIGTERM) and a
terminal that went away (SIGHUP) ask for the same clean stop, and the exit status is 128 + the
signal's number (130, 143, 129), the shell's convention, so that a wrapping script never takes a
stopped run for a finished one (the units count 130 and 143 as the stop they asked for).

    previous = install(on_stop)        # SIGINT, SIGTERM and SIGHUP (unless started under nohup)
    ...
    restore(previous)
    return exit_status(signum)         # 130 for SIGINT

A command with nothing to save between two steps raises instead: ``raise_on_stop()`` makes each of
the three signals raise :class:`Interrupted` wherever the main thread is (as Ctrl-C raises
KeyboardInterrupt), and `hsmon`'s dispatcher turns one that reaches it into one line and the status.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
HOW = {
    signal.SIGINT: "SIGINT (Ctrl-C)",
    signal.SIGTERM: "SIGTERM",
    signal.SIGHUP: "SIGHUP (its terminal went away)",
}


class Interrupted(BaseException):
    """A stop signal, raised where the main thread was (a BaseException, as KeyboardInterrupt is)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def exit_status(signum: int) -> int:
    """128 + the signal's number: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP."""
    return 128 + int(signum)


def described(signum: int) -> str:
    """The signal in words: 'SIGINT (Ctrl-C)', 'SIGHUP (its terminal went away)', 'SIGTERM'."""
    return HOW.get(signal.Signals(signum), signal.Signals(signum).name)


def install(handler: Callable[[int, Any], None]) -> dict[int, Any]:
    """``handler`` for the stop signals; the handlers it replaced (for :func:`restore`). SIGHUP is
    left ignored when the command was started ignoring it (`nohup`: the user asked it to outlive the
    terminal); on SIGHUP the output leaves the lost terminal first (:func:`leave_lost_terminal`).
    Outside the main thread (a test calling a command's main in a thread) nothing changes."""

    def on_signal(signum: int, frame: Any) -> None:
        if signum == signal.SIGHUP:
            leave_lost_terminal()
        handler(signum, frame)

    previous: dict[int, Any] = {}
    for signum in STOP_SIGNALS:
        if signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN:
            continue
        with contextlib.suppress(ValueError):
            previous[signum] = signal.signal(signum, on_signal)
    return previous


def leave_lost_terminal() -> None:
    """Point stdout and stderr at /dev/null where they are a terminal (after SIGHUP: it is gone, and a
    write would fail with EIO in the middle of the command's clean stop)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if os.isatty(stream.fileno()):
                _to_devnull(stream)


def restore(previous: dict[int, Any]) -> None:
    """Put back the handlers :func:`install` replaced."""
    for signum, handler in previous.items():
        with contextlib.suppress(ValueError):
            signal.signal(signum, handler)


def raise_on_stop() -> dict[int, Any]:
    """Each stop signal raises :class:`Interrupted` in the main thread; the handlers replaced."""

    def raise_it(signum: int, _frame: Any) -> None:
        raise Interrupted(signum)

    return install(raise_it)


def say(line: str) -> None:
    """Print a command's last line on stderr. When the terminal is gone (SIGHUP; a write gives
    EIO), stdout and stderr go to /dev/null instead, so that the interpreter's last flush cannot
    turn the exit status into 120."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        for stream in (sys.stdout, sys.stderr):
            _to_devnull(stream)


def _to_devnull(stream: Any) -> None:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        fd = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
