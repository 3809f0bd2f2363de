"""A regeneration's own figures (`hsmon regenerate`): the answers and why they ended (stop, or cut at
--max-new-tokens), their length against the source's, the generated tokens, their rate and the ETA
it gives; a bar of the answers' endings. Hidden for any other job; the words are hsmon/status/text.py's,
as `hsmon status` says them."""

from __future__ import annotations

from rich.text import Text

from hsmon.status.text import regenerate_rows
from hsmon.status_doc import ENDED_STATES, JobStatus, RegenerateSection, regenerate_of
from hsmon.tui.widgets.quiet import QuietStatic, set_border_subtitle, set_display

LABEL = 11
BAR = 20
# a share of cut answers above this is said in yellow (dashboards' HsmonRegenerationTruncating)
CUT_WARNING = 0.2


def finish_bar(regen: RegenerateSection, width: int = BAR) -> tuple[str, str]:
    """(the cells of answers that stopped by themselves, the cells of cut ones): ``width`` in all."""
    total = sum(regen.finish.values())
    if not total:
        return "", "░" * width
    cut = round(width * regen.finish.get("length", 0) / total)
    return "█" * (width - cut), "█" * cut


def cut_share(regen: RegenerateSection) -> float:
    total = sum(regen.finish.values())
    return regen.finish.get("length", 0) / total if total else 0.0


def regenerate_text(job: JobStatus, regen: RegenerateSection) -> Text:
    """The panel's lines: the endings' bar, then the figures `hsmon status` gives."""
    text = Text()
    stopped, cut = finish_bar(regen)
    text.append(f"{'endings':<{LABEL}}", style="bold")
    text.append(stopped, style="green")
    text.append(cut, style="yellow" if cut_share(regen) > CUT_WARNING else "dim")
    share = f"{100 * (1 - cut_share(regen)):.0f} % stopped by themselves" if regen.finish else "no answer yet"
    text.append(f" {share}\n")
    for label, value in regenerate_rows(regen, job.state in ENDED_STATES):
        text.append(f"{label:<{LABEL}}", style="bold")
        text.append(value + "\n")
    text.rstrip()
    text.no_wrap = True
    text.overflow = "ellipsis"
    return text


class RegeneratePanel(QuietStatic):
    """A regeneration's figures; repainted only when its text changed."""

    DEFAULT_CSS = "RegeneratePanel { text-wrap: nowrap; text-overflow: ellipsis; }"

    def show(self, job: JobStatus) -> None:
        regen = regenerate_of(job)
        set_display(self, regen is not None)
        if regen is None:
            return
        set_border_subtitle(self, f"from its {regen.source}")
        self.show_text(regenerate_text(job, regen))
