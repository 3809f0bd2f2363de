"""Pure functions from the status document's ``output.data`` to the data panel: per captured layer a
sparkline of its mean L2 norm over the newest chunks, its NaN/Inf rows, and the last engine-verify
verdict (docs/status-api.md, "output.data"). No Textual here: tested without a terminal.

Nothing here is relative to the clock (no "checked 3m ago"): the panel changes only when a chunk
completes or a check ends, so it adds nothing to an idle dashboard.
"""

from __future__ import annotations

from msgspec import UNSET
from rich.text import Text

from hsmon.status_doc import DataSection, JobStatus
from hsmon.status_doc.numbers import counted, fmt_count, fmt_num
from hsmon.tui.engine_view import SPARKS

VERDICT_STYLES = {"agree": "bold green", "disagree": "bold white on red", "error": "bold yellow",
                  "timeout": "bold yellow", "running": "cyan"}
LABEL = 6


def data_section(job: JobStatus) -> DataSection | None:
    """``output.data`` when the job's output has one (hsmon layout), else None."""
    data = job.output.data if job.output is not None else None
    return None if data is UNSET else data


def spark_range(values: list[float], width: int) -> str:
    """The last ``width`` values as block characters between their minimum and maximum: a norm's
    movement from chunk to chunk is what shows (a flat run is a flat middle line)."""
    values = values[-width:] if width > 0 else []
    if not values:
        return ""
    low, high = min(values), max(values)
    if high - low <= 1e-9 * max(abs(high), 1.0):
        return SPARKS[3] * len(values)
    top = len(SPARKS) - 1
    return "".join(SPARKS[min(top, int((v - low) / (high - low) * top + 0.5))] for v in values)


def _layer_order(name: str) -> tuple[int, int | str]:
    return (0, int(name)) if name.isdigit() else (1, name)  # 2, 4, 5 ... then final


def layer_lines(data: DataSection, width: int) -> list[Text]:
    """One line per layer: name, norm sparkline over chunks, newest chunk's norm, NaN/Inf rows."""
    layers = data.layers
    lines = []
    for name in sorted(layers, key=_layer_order):
        layer = layers[name]
        history = [float(v) for v in layer.history]
        newest = layer.chunk.mean_l2 if layer.chunk is not None else layer.mean_l2
        bad = layer.nonfinite_rows
        tail = f" {fmt_num(newest):>7}  "
        nan = f"NaN/Inf {fmt_count(bad)}"
        room = max(4, width - LABEL - 1 - len(tail) - len(nan))
        line = Text(f"{name[:LABEL]:>{LABEL}} ", style="bold")
        line.append(f"{spark_range(history, room):<{room}}", style="bright_blue")
        line.append(tail)
        line.append(nan, style="bold white on red" if bad else "grey50")
        lines.append(line)
    return lines


def nonfinite_line(data: DataSection) -> Text | None:
    """'NaN/Inf in 2 rows: 3, 9' in red, or None for a clean run."""
    rows = data.nonfinite_rows
    if not rows:
        return None
    first = ", ".join(str(r) for r in data.first_nonfinite_rows)
    more = ", …" if rows > len(data.first_nonfinite_rows) else ""
    return Text(f"NaN/Inf in {fmt_count(rows)} row{'s' if rows != 1 else ''}: rows {first}{more}",
                style="bold red")


def drift_line(data: DataSection) -> Text | None:
    """'drift: 2 chunks beyond 25 % of the reference (newest rows_12-15, layer 2)', or None."""
    count = data.drifted_chunks
    if not count:
        return None
    chunk, layer = (data.drifts[-1].chunk, data.drifts[-1].layer) if data.drifts else ("?", "?")
    tolerance = float(data.drift_tolerance) * 100
    return Text(f"drift: {count} chunk{'s' if count != 1 else ''} beyond {tolerance:.0f} % of the reference "
                f"(newest {chunk}, layer {layer})", style="bold yellow")


def verify_lines(data: DataSection, width: int) -> list[Text]:
    """The last engine check: 'verify:  AGREE  rows_0-2000, 64 rows, cos 1.0000, max diff 0.00031 (10
    checks, 0 disagreed)', and on a line of its own why it did not agree."""
    verify = data.verify
    if verify is None:
        return [Text("verify: off", style="grey50")]
    verdict = verify.verdict
    line = Text("verify: ")
    if verdict is None:
        line.append("no check yet", style="grey50")
    else:
        line.append(f" {str(verdict).upper()} ", style=VERDICT_STYLES.get(str(verdict), "bold"))
    parts = []
    if verify.chunk:
        parts.append(verify.chunk)
    if verdict != "running":
        parts.append(counted(verify.rows_checked, "row"))
    if verify.worst_cosine is not None:
        parts.append(f"cos {verify.worst_cosine:.4f}")
    if verify.max_abs_diff is not None:
        parts.append(f"max diff {fmt_num(verify.max_abs_diff, 2)}")
    if verify.running_chunk and verdict != "running":
        parts.append(f"checking {verify.running_chunk}…")
    if parts:
        line.append(" " + ", ".join(parts))
    lines = [line]
    totals = verify.checks_total
    if totals:
        bad = verify.disagreements_total
        count = f"{totals} check{'s' if totals != 1 else ''}, {bad} disagreed"
        style = "bold red" if bad else "grey50"
        if len(line) + len(count) + 3 <= width:
            line.append(f" ({count})", style=style)
        else:  # narrow: on a line of its own rather than cut
            lines.append(Text(f"  {count}", style=style))
    if verify.reason and verdict not in ("agree", None):
        lines.append(Text(f"  {verify.reason}", style="red" if verdict == "disagree" else "yellow"))
    return lines


def data_alarm(data: DataSection | None) -> bool:
    """Whether the panel shows an alarm (NaN/Inf, or the engine disagreed)."""
    if data is None:
        return False
    return bool(data.nonfinite_rows) or (data.verify is not None and data.verify.verdict == "disagree")


def data_text(data: DataSection, width: int) -> Text:
    """The whole panel."""
    lines = layer_lines(data, width) or [Text("no chunk statistics yet", style="grey50")]
    lines += [line for line in (nonfinite_line(data), drift_line(data)) if line is not None]
    lines += verify_lines(data, width)
    text = Text("\n").join(lines)
    text.no_wrap = True
    text.overflow = "ellipsis"
    return text
