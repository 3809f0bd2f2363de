"""An online job's two sides together: the spool's fill against its limit, the extractor
and the following trainer (state, why, rate, share of the last 10 min waited) and the bottleneck in
words. Hidden for any other job; the wording is hsmon/status/text.py's, as `hsmon status` says it."""

from __future__ import annotations

from rich.text import Text

from hsmon.status.text import spool_fill
from hsmon.status_doc import JobStatus, OnlineSection, OnlineSide, online_of
from hsmon.status_doc.numbers import counted, fmt_clock
from hsmon.tui.widgets.quiet import QuietStatic, set_display

STATE_STYLES = {"running": "green", "paused": "yellow", "waiting": "yellow", "stalled": "bold red",
                "dead": "bold red", "done": "cyan", "starting": "dim",
                "stopped": "khaki1"}
LABEL = 11
ENDED = ("done", "stopped", "dead")
BAR = 20


def fill_bar(online: OnlineSection, width: int = BAR) -> str:
    """The spool's fill as a bar of ``width`` cells (empty when the limit is not known)."""
    if not online.limit_bytes:
        return ""
    full = min(width, round(width * online.spool_bytes / online.limit_bytes))
    return "█" * full + "░" * (width - full)


def _side(text: Text, label: str, side: OnlineSide) -> None:
    text.append(f"{label:<{LABEL}}", style="bold")
    text.append(f"{side.state.upper():<9}", style=STATE_STYLES.get(side.state, ""))
    verb = "written" if side.role == "extractor" else "consumed"
    rate = f"{side.rows_per_s:.2f} rows/s {verb}" if side.rows_per_s is not None else f"- rows/s {verb}"
    waited = f", waited {100 * side.wait_frac:.0f} %" if side.wait_frac is not None else ""
    eta = f", ETA {fmt_clock(side.eta_s)}" if side.eta_s is not None and side.state not in ENDED else ""
    pid = f", PID {side.pid}" if side.pid else ""
    text.append(f"{rate}{waited}{eta}{pid}\n{'':<{LABEL}}")
    reason = side.reason
    if reason.startswith("spool full: "):  # its figures are the spool's line above
        reason = "spool full: waiting for the trainer to consume rows"
    text.append(reason, style="dim")


def online_text(online: OnlineSection, width: int | None = None) -> Text:
    """The panel's lines; the fill bar shrinks so that the spool's line fits ``width`` cells."""
    text = Text()
    fill = f"{spool_fill(online)}, {counted(online.rows_waiting, 'row')} waiting"
    bar = BAR if width is None else max(5, min(BAR, width - LABEL - 1 - len(fill)))
    text.append(f"{'spool':<{LABEL}}", style="bold")
    text.append(f"{fill_bar(online, bar)} ", style="yellow" if online.producer.state == "paused" else "green")
    text.append(fill + "\n")
    passes = f"{online.passes} passes a row" if online.passes else "passes unknown"
    step = f", trainer step {online.trainer_step}" if online.trainer_step is not None else ""
    consumed = f"{online.rows_consumed} of {online.rows_written} rows consumed"
    text.append(f"{'':<{LABEL}}{consumed}, {passes}{step}\n", style="dim")
    _side(text, "extractor", online.producer)
    text.append("\n")
    _side(text, "trainer", online.consumer)
    if online.trainer_arch:  # the drafter it trains, as the training panel shows it
        text.append(f"  ({online.trainer_arch})")
    text.append("\n")
    style = "bold red" if online_alarm(online) else "bold"
    head, sep, tail = online.bottleneck.partition(": ")  # the verdict, then its evidence below it
    text.append(head + sep.rstrip(), style=style)
    if tail:
        text.append(f"\n{'':<{LABEL}}{tail}", style="dim")
    text.no_wrap = True
    text.overflow = "ellipsis"
    return text


def online_alarm(online: OnlineSection) -> bool:
    """Either side dead or stalled."""
    return any(s.state in ("dead", "stalled") for s in (online.producer, online.consumer))


class OnlinePanel(QuietStatic):
    """Both sides of an online job; red-bordered when a side is dead or stalled. Repainted only when
    its text changed."""

    DEFAULT_CSS = "OnlinePanel { text-wrap: nowrap; text-overflow: ellipsis; }"

    def show(self, job: JobStatus) -> None:
        online = online_of(job)
        set_display(self, online is not None)
        if online is None:
            return
        self.set_class(online_alarm(online), "-alarm")
        width = self.content_size.width
        text = online_text(online, width if width > 0 else None)
        self.show_text(text)
