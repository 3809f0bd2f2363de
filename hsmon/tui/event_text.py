"""One human line per progress event (the events contract), and the event log's filters.

Every kind the extractor, the trainer, `hsmon eval-drafter` and the monitor emit has its own
summary (``rows 256/300 (+15, 2,157 tok)``); a kind not known here keeps the raw ``key=value``
form, so nothing a writer sends is hidden. No Textual here: tested without a terminal.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from hsmon.contracts.events import event_number as _n
from hsmon.contracts.units import format_bytes, format_duration
from hsmon.status_doc.figures import fmt_measure
from hsmon.status_doc.numbers import (
    clock_time,
    counted,
    fmt_clock,
    fmt_count,
    fmt_num,
    fmt_pct_of,
    shorten_path,
)

ERROR_KINDS = frozenset({"error", "retry"})
REJECT_KINDS = frozenset({"reject"})
HIDDEN_BY_DEFAULT = frozenset({"heartbeat"})
# "all" is every event but heartbeats (one every few seconds would push the rest out).
EVENT_FILTERS = ("all", "errors", "rejects", "+heartbeats")
PATH_WIDTH = 32
_SKIP_FIELDS = frozenset({"v", "ts", "job", "kind"})


def event_matches(event: dict[str, Any], which: str) -> bool:
    kind = event.get("kind")
    if which == "errors":
        return kind in ERROR_KINDS or (
            kind == "state" and (event.get("state") or event.get("to")) in ("dead", "stalled")
        )
    if which == "rejects":
        return kind in REJECT_KINDS
    if which == "all":
        return kind not in HIDDEN_BY_DEFAULT
    return True


def filtered_events(events: Iterable[dict[str, Any]] | None, which: str, limit: int,
                    search: str = "", summary: Callable[[dict[str, Any]], str] | None = None,
                    ) -> list[dict[str, Any]]:
    """The last ``limit`` events that pass the filter, oldest first; with ``search``, only those
    whose line (its clock time, kind and summary) holds it, whatever the case."""
    chosen = [e for e in events or [] if event_matches(e, which)]
    if search:
        needle = search.casefold()
        line = summary or event_summary
        chosen = [e for e in chosen if needle in f"{event_clock(e)} {e.get('kind')} {line(e)}".casefold()]
    return chosen[-limit:] if limit > 0 else []


def _of(done: float | None, total: float | None) -> str:
    if done is None:
        raise ValueError("no count: the raw form says more")
    return f"{fmt_count(done)}/{fmt_count(total)}" if total else fmt_count(done)


def _path(value: Any) -> str:
    return shorten_path(str(value), PATH_WIDTH)


def _join(*parts: str | None) -> str:
    return ", ".join(p for p in parts if p)


def _into(e: dict[str, Any]) -> str:
    out = e.get("out_dir") or e.get("output_dir")
    return f" → {_path(out)}" if out else ""


def _start(e: dict[str, Any]) -> str:
    if e.get("backend") == "train" or _n(e, "total_steps") is not None:
        held = _n(e, "eval_rows")
        return (
            "start training: "
            + _join(
                counted(_n(e, 'total_rows', 'rows_total'), "row")
                + (f" (+{fmt_count(held)} held out)" if held else ""),
                counted(_n(e, 'total_steps'), "step") if _n(e, "total_steps") is not None else None,
                f"unroll {e['ttt_length']}" if "ttt_length" in e else None,
                f"arch {e['arch']}" if e.get("arch") else None,
            )
            + _into(e)
        )
    if e.get("backend") == "eval-drafter" or "drafter" in e:
        return "start eval-drafter: " + _join(
            counted(_n(e, 'prompts'), "prompt") if _n(e, "prompts") is not None else None,
            f"depths 1..{e['depth']}" if "depth" in e else None,
            counted(_n(e, 'rows_total'), "decode") if _n(e, "rows_total") is not None else None,
            f"drafter {_path(e['drafter'])}" if e.get("drafter") else None,
        )
    rows_done = _n(e, "rows_done")
    return (
        "start: "
        + _join(
            counted(_n(e, 'rows_total', 'total_rows', 'rows'), "row")
            if _n(e, "rows_total", "total_rows", "rows") is not None
            else None,
            f"{fmt_count(_n(e, 'tokens_total', 'total_tokens'))} tok"
            if _n(e, "tokens_total", "total_tokens") is not None
            else None,
            counted(_n(e, 'chunks_total'), "chunk") if _n(e, "chunks_total") is not None else None,
            f"resuming at {fmt_count(rows_done)}" if rows_done else None,
            str(e["backend"]) if e.get("backend") else None,
        )
        + _into(e)
    )


def _rows(e: dict[str, Any]) -> str:
    added = _n(e, "rows", "count")
    tokens = _n(e, "tokens")
    extra = _join(
        f"+{fmt_count(added)}" if added is not None else None,
        f"{fmt_count(tokens)} tok" if tokens is not None else None,
    )
    return f"rows {_of(_n(e, 'rows_done'), _n(e, 'rows_total'))}" + (f" ({extra})" if extra else "")


def _row(e: dict[str, Any]) -> str:
    tokens = _n(e, "tokens")
    return f"row {e.get('row', '?')}" + (f" ({fmt_count(tokens)} tok)" if tokens is not None else "")


def _chunk(e: dict[str, Any]) -> str:
    rejects = _n(e, "rejects")
    return f"chunk {e.get('chunk', '?')} closed: " + _join(
        counted(_n(e, 'rows'), "row"),
        f"{fmt_count(_n(e, 'tokens'))} tok" if _n(e, "tokens") is not None else None,
        format_bytes(_n(e, "bytes")) if _n(e, "bytes") is not None else None,
        f"{fmt_count(rejects)} rejected" if rejects else None,
    )


def _heartbeat(e: dict[str, Any]) -> str:
    if _n(e, "step") is not None:
        return "heartbeat: " + _join(
            f"step {fmt_count(_n(e, 'step'))}",
            f"{fmt_count(_n(e, 'tokens'))} tok" if _n(e, "tokens") is not None else None,
        )
    if _n(e, "rows_done") is not None:
        return f"heartbeat: {_of(_n(e, 'rows_done'), _n(e, 'rows_total'))} rows" + (
            f", paused ({e['paused']})" if e.get("paused") else ""
        )
    return "heartbeat"


def _pause(e: dict[str, Any]) -> str:
    return f"paused ({e.get('reason', '?')}): " + _join(
        f"{format_bytes(_n(e, 'free_bytes'))} free" if _n(e, "free_bytes") is not None else None,
        f"needs {format_bytes(_n(e, 'need_bytes'))}" if _n(e, "need_bytes") is not None else None,
        _path(e["path"]) if e.get("path") else None,
    )


def _resume(e: dict[str, Any]) -> str:
    waited = _n(e, "paused_seconds")
    return (
        f"resumed ({e.get('reason', '?')})"
        + (f" after {format_duration(waited)}" if waited is not None else "")
        + (f", {format_bytes(_n(e, 'free_bytes'))} free" if _n(e, "free_bytes") is not None else "")
    )


def _reject(e: dict[str, Any]) -> str:
    return f"reject row {e.get('row', '?')}: {e.get('reason', '?')}"


def _retry(e: dict[str, Any]) -> str:
    attempt = e.get("attempt")
    return (
        f"retry row {e.get('row', '?')}"
        + (f" (attempt {attempt})" if attempt is not None else "")
        + (f": {e.get('error') or e.get('reason')}" if e.get("error") or e.get("reason") else "")
    )


def _error(e: dict[str, Any]) -> str:
    return f"error: {e.get('message') or e.get('error') or '?'}"


def _done(e: dict[str, Any]) -> str:
    seconds = _n(e, "seconds")
    took = f" in {format_duration(seconds)}" if seconds is not None else ""
    if _n(e, "step") is not None:
        accs = e.get("eval_accs")
        return (
            f"done: step {fmt_count(_n(e, 'step'))}"
            + took
            + ", "
            + _join(
                f"{fmt_count(_n(e, 'tokens'))} tok" if _n(e, "tokens") is not None else None,
                "time limit reached" if e.get("time_limit_reached") else None,
                f"held-out acc {fmt_pct_of(accs[0])} (pos 0)" if isinstance(accs, list) and accs else None,
                e["advice"] if isinstance(e.get("advice"), str) else None,
            )
        )
    if isinstance(e.get("acceptance_length"), dict):
        return "done: " + acceptance_summary(e) + took
    return (
        "done: "
        + _join(
            f"{_of(_n(e, 'rows_done'), _n(e, 'rows_total'))} rows"
            if _n(e, "rows_done") is not None
            else None,
            f"{fmt_count(_n(e, 'tokens_done'))} tok" if _n(e, "tokens_done") is not None else None,
            format_bytes(_n(e, "bytes_done")) if _n(e, "bytes_done") is not None else None,
        )
        + took
    )


def _stopped(e: dict[str, Any]) -> str:
    step, total = _n(e, "step"), _n(e, "total_steps")
    where = (
        f"step {fmt_count(step)}" + (f" of {fmt_count(total)}" if total else "")
        if step is not None
        else f"{_of(_n(e, 'rows_done'), _n(e, 'rows_total'))} rows"
        if _n(e, "rows_done") is not None
        else None
    )
    why = e.get("signal") if isinstance(e.get("signal"), str) else e.get("reason", "?")
    return f"stopped ({why})" + (f" at {where}" if where else "")


def _state(e: dict[str, Any]) -> str:
    new = e.get("state") or e.get("to") or "?"
    old = e.get("previous") or e.get("from")
    head = f"state {old} → {new}" if old else f"state {new}"
    return f"{head}: {e['reason']}" if e.get("reason") else head


def _first(e: dict[str, Any], per_position: str, single: str) -> float | None:
    """The first draft position's figure (``losses``/``accs``: hsmon train), else the one value."""
    values = e.get(per_position)
    value = values[0] if isinstance(values, list) and values else e.get(single)
    if isinstance(value, list):
        value = value[0] if value else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _step(e: dict[str, Any]) -> str:
    """'step 29/76: loss 4.936, acc 26.5% (pos 0), 2,123 tok/s': the loss and accuracy at the first
    draft position, the figures the training tab, `hsmon status` and `hsmon train`'s line show
    (hsmon train's ``loss`` field, the weighted sum over the positions, is in the whole event)."""
    loss, acc = _first(e, "losses", "loss"), _first(e, "accs", "acc")
    where = " (pos 0)" if isinstance(e.get("losses") or e.get("accs"), list) else ""
    rate = _n(e, "tokens_s", "tokens_per_s")
    figures = _join(f"loss {fmt_measure(loss)}" if loss is not None else None,
                    f"acc {fmt_pct_of(acc)}" if acc is not None else None)
    return f"step {_of(_n(e, 'step'), _n(e, 'total_steps'))}: " + _join(
        figures + where if figures else None,
        f"{fmt_num(rate)} tok/s" if rate is not None else None,
    )


def _checkpoint(e: dict[str, Any]) -> str:
    return f"checkpoint at step {fmt_count(_n(e, 'step'))}" + (
        f" → {_path(e.get('path') or e.get('dir'))}" if e.get("path") or e.get("dir") else ""
    )


def _eval(e: dict[str, Any]) -> str:
    if isinstance(e.get("acceptance_length"), dict):
        return "eval: " + acceptance_summary(e)
    accs = e.get("accs")
    return f"eval at step {fmt_count(_n(e, 'step'))}: " + _join(
        f"{fmt_count(_n(e, 'rows'))} held-out rows" if _n(e, "rows") is not None else None,
        "acc " + " ".join(fmt_pct_of(a) for a in accs) if isinstance(accs, list) and accs else None,
        f"est. acceptance {fmt_num(_n(e, 'accept_len_est'))}"
        if _n(e, "accept_len_est") is not None
        else None,
    )


def acceptance_summary(e: dict[str, Any]) -> str:
    """'acceptance at depth 7: drafter 2.377, n-gram 4.885 tok/forward' from eval-drafter's result."""
    lengths = e.get("acceptance_length") or {}
    depths = sorted({int(d) for per in lengths.values() if isinstance(per, dict) for d in per})
    if not depths:
        return "acceptance: no figures"
    deepest = str(depths[-1])
    names = {"eagle3": "drafter", "ngram": "n-gram"}
    parts = [
        f"{names.get(name, name)} {fmt_num(per.get(deepest))}"
        for name, per in lengths.items()
        if isinstance(per, dict) and deepest in per
    ]
    return f"acceptance at depth {deepest}: {', '.join(parts)} tok/forward"


SUMMARIES: dict[str, Callable[[dict[str, Any]], str]] = {
    "start": _start,
    "rows": _rows,
    "row": _row,
    "chunk": _chunk,
    "heartbeat": _heartbeat,
    "pause": _pause,
    "resume": _resume,
    "reject": _reject,
    "retry": _retry,
    "error": _error,
    "done": _done,
    "stopped": _stopped,
    "state": _state,
    "step": _step,
    "checkpoint": _checkpoint,
    "eval": _eval,
}


def raw_fields(event: dict[str, Any]) -> str:
    """'kind key=value …': the form of a kind without a summary."""
    details = " ".join(f"{k}={_short(v)}" for k, v in event.items() if k not in _SKIP_FIELDS)
    return f"{event.get('kind', '?')} {details}".rstrip()


def _short(value: Any, width: int = 40) -> str:
    text = fmt_num(value) if isinstance(value, float) else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def event_summary(event: dict[str, Any]) -> str:
    """One human line for ``event``; the raw fields for a kind without a summary (or a malformed one)."""
    summarize = SUMMARIES.get(str(event.get("kind")))
    if summarize is None:
        return raw_fields(event)
    try:
        return summarize(event)
    except (TypeError, ValueError, AttributeError, KeyError):  # a writer's odd field types
        return raw_fields(event)


def event_age(event: dict[str, Any], now_ts: float | None) -> str:
    ts = event.get("ts")
    if not isinstance(ts, (int, float)) or not now_ts:
        return "?"
    return "now" if now_ts - ts < 1 else f"-{fmt_clock(now_ts - ts)}"


def event_clock(event: dict[str, Any]) -> str:
    """The event's local wall-clock time, '14:02:31' ('--:--:--' without a time)."""
    ts = event.get("ts")
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        return "--:--:--"
    return clock_time(ts)


def event_line(event: dict[str, Any]) -> str:
    """'14:02:31 reject row 12: too long': the event's clock time, then the summary."""
    return f"{event_clock(event)} {event_summary(event)}"


def event_detail(event: dict[str, Any], now_ts: float | None) -> str:
    """The whole event, every field, for the detail view."""
    head = (f"{event.get('kind', '?')} event of {event.get('job', '?')} at {event_clock(event)}, "
            f"{event_age(event, now_ts)} ago")
    return f"{head.replace(', -', ', ')}\n{event_summary(event)}\n\n" + json.dumps(
        event, indent=2, ensure_ascii=False, default=str
    )
