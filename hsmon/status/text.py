"""Wording shared by `hsmon status` (hsmon/status/cli.py) and the dashboard (hsmon/tui): pure
functions of the typed status document (hsmon/status_doc), so that both say the same thing about
the same figure. No Textual or Rich here: `hsmon status` must not import them."""

from __future__ import annotations

from collections.abc import Callable

from hsmon.contracts.units import format_bytes, format_duration
from hsmon.status_doc import DiskEntry, OnlineSection, OnlineSide, Progress, RegenerateSection, Speculative
from hsmon.status_doc.figures import figure_texts

WONT_FIT = "WILL NOT FIT"
# A served drafter accepting less than this fraction of its own training-time estimate is said in
# red; dashboards/alerts.yml's HsmonServedAcceptanceLow fires when it stays so for 15 minutes.
SPEC_LOW_FRACTION = 0.5
FILLS_FIRST = "fills before done"


def disk_verdict(disk: DiskEntry) -> str:
    """Whether what the job still writes fits on a filesystem: 'WILL NOT FIT', 'fills before done'
    (at the current write rate it is full before the job is done), 'fits' or 'unknown'."""
    ttf, ttd = disk.time_to_full_s, disk.time_to_done_s
    if disk.fits is False:
        return WONT_FIT
    if ttf is not None and ttd is not None and ttf < ttd:
        return FILLS_FIRST
    return "fits" if disk.fits else "unknown"


def verdict_alarming(verdict: str) -> bool:
    """Whether a disk verdict is an alarm (it is said in red or yellow)."""
    return verdict in (WONT_FIT, FILLS_FIRST)


def spool_fill(online: OnlineSection) -> str:
    """'19.9 GB of 20.0 GB (100 %)', or the bytes alone when the limit is not known."""
    if not online.limit_bytes:
        return f"{format_bytes(online.spool_bytes)} (no limit known)"
    pct = 100.0 * online.spool_bytes / online.limit_bytes
    return f"{format_bytes(online.spool_bytes)} of {format_bytes(online.limit_bytes)} ({pct:.0f} %)"


def side_text(side: OnlineSide) -> str:
    """'PAUSED: spool full: ...; 3.10 rows/s written' (the extractor writes, the trainer consumes)."""
    verb = "written" if side.role == "extractor" else "consumed"
    rate = f"; {side.rows_per_s:.2f} rows/s {verb}" if side.rows_per_s is not None else ""
    return f"{side.state.upper()}: {side.reason}{rate}"


def online_rows(online: OnlineSection) -> list[tuple[str, str]]:
    """An online job's (label, text) lines: the spool, each side, the bottleneck."""
    passes = f", {online.passes} passes per row" if online.passes else ""
    step = f", trainer at step {online.trainer_step}" if online.trainer_step is not None else ""
    step += f" ({online.trainer_arch})" if online.trainer_arch else ""
    return [
        ("spool", f"{online.path}: {spool_fill(online)}; {online.rows_waiting} rows waiting, "
                  f"{online.rows_consumed} of {online.rows_written} consumed{passes}{step}"),
        ("extractor", side_text(online.producer)),
        ("trainer", side_text(online.consumer) + (f" (PID {pid})" if (pid := online.consumer.pid) else "")),
        *([("trainer's figures", "; ".join(texts))] if (texts := figure_texts(online.training)) else []),
        ("bottleneck", online.bottleneck),
    ]


def eta_text(progress: Progress | None, eta: float | None, fmt: Callable[[float | None], str]) -> str:
    """The ETA as shown: ``3h25m``, or where the rate is noisy (a range wider than a tenth of it,
    hsmon/core/eta.py) the range a person can plan with, ``3h10m–3h40m``."""
    low = progress.eta_low_s if progress is not None else None
    high = progress.eta_high_s if progress is not None else None
    if eta is None or not isinstance(low, (int, float)) or not isinstance(high, (int, float)) \
            or progress is None or progress.eta_s != eta or high - low <= 0.1 * eta:
        return fmt(eta)
    lo, hi = fmt(low), fmt(high)
    return fmt(eta) if lo == hi else f"{lo}–{hi}"


def spec_accept_length(spec: Speculative) -> float | None:
    """The served acceptance, tokens per verify: over the requests the server finished (its
    generated tokens / verify calls), else SGLang's recent window, else its average since start."""
    if spec.verify_calls_total and spec.generated_tokens_total is not None:
        return spec.generated_tokens_total / spec.verify_calls_total
    return spec.accept_length if spec.accept_length is not None else spec.avg_accept_length


def spec_low(spec: Speculative) -> bool:
    """Whether the served acceptance is below SPEC_LOW_FRACTION of the drafter's own estimate."""
    served = spec_accept_length(spec)
    return served is not None and spec.estimate is not None and served < SPEC_LOW_FRACTION * spec.estimate


def spec_text(spec: Speculative) -> str:
    """'EAGLE3 depth 3: 1.82 tokens per verify (recent 1.75, rate 0.25), the drafter's estimate
    2.63' (what is known)."""
    served = spec_accept_length(spec)
    text = f"{spec.algorithm or 'speculative'} depth {spec.depth if spec.depth is not None else '?'}: "
    text += "no acceptance yet" if served is None else f"{served:.2f} tokens per verify"
    parts = []
    if served is not None and spec.accept_length is not None and served != spec.accept_length:
        parts.append(f"recent {spec.accept_length:.2f}")  # SGLang's last decode window
    if served is not None and spec.accept_rate is not None:
        parts.append(f"rate {spec.accept_rate:.2f}")
    if parts:
        text += f" ({', '.join(parts)})"
    if spec.estimate is not None:
        text += f", the drafter's estimate {spec.estimate:.2f}"
        if spec_low(spec):
            text += f" (below {SPEC_LOW_FRACTION:.0%} of it)"
    return text


def regenerate_rows(regen: RegenerateSection, ended: bool) -> list[tuple[str, str]]:
    """A regeneration's figures as `hsmon status` and the dashboard's panel say them: the answers and
    why they ended, their length against the source's, the token rate and the ETA it gives."""
    finish = ", ".join(f"{reason} {n:,}" for reason, n in sorted(regen.finish.items()))
    cut = regen.truncated_rows
    answers = f"{regen.answers:,}" + (f" ({finish})" if finish else "")
    if cut:
        answers += f"; {cut:,} row{'s' if cut != 1 else ''} cut at --max-new-tokens"
    rows = [("answers", answers)]
    if regen.mean_answer_tokens is not None:
        source = "" if regen.mean_source_tokens is None else f", the source's {regen.mean_source_tokens:,.1f}"
        rows.append(("length", f"mean answer {regen.mean_answer_tokens:,.1f} tokens{source}"))
    rate = f"{regen.tokens_per_s:,.0f} tok/s" if regen.tokens_per_s is not None else "- tok/s"
    eta = "" if ended or regen.eta_s is None else f", ETA {format_duration(regen.eta_s)} at that rate"
    rows.append(("generated", f"{regen.generated_tokens:,} tokens, {rate}{eta}"))
    return rows
