"""Pure functions from the status document to the servers/GPUs panel: badges, lines, sparklines.

No Textual here (tested without a terminal); the widget is hsmon/tui/widgets/engine_panel.py.
"""

from __future__ import annotations

from rich.text import Text

from hsmon.contracts.units import format_bytes
from hsmon.status.text import spec_low, spec_text
from hsmon.status_doc import Capture, GpuSection, JobStatus
from hsmon.tui.series import fit
from hsmon.tui.view import JobHistory, fmt_count, fmt_rate

BADGES: dict[str, tuple[str, str]] = {
    "up": ("UP", "bold green"),
    "busy": ("BUSY", "bold yellow"),
    "hung": ("HUNG", "bold white on red"),
    "down": ("DOWN", "bold red"),
    "unknown": ("?", "grey50"),
}
SPARKS = "▁▂▃▄▅▆▇█"


def spark(values: list[float], width: int) -> str:
    """The last ``width`` values as block characters scaled to their maximum ('' for none)."""
    values = values[-width:] if width > 0 else []
    if not values:
        return ""
    top = max(values)
    if top <= 0:
        return SPARKS[0] * len(values)
    return "".join(SPARKS[min(len(SPARKS) - 1, int(v / top * (len(SPARKS) - 1) + 0.5))] for v in values)


def _host(url: str) -> str:
    return url.split("://", 1)[-1]


def server_lines(job: JobStatus, history: JobHistory, width: int) -> list[Text]:
    """Two lines per server: badge, address and figures; then queue and throughput sparklines."""
    lines = []
    for srv in job.servers:
        label, style = BADGES.get(srv.state, BADGES["unknown"])
        load, health = srv.load, srv.health
        line = Text(f" {label:<4} ", style=style)
        line.append(f" {_host(srv.url)}")
        figures = []
        if load.running is not None:
            figures.append(f"run {load.running:.0f} queue {load.queued or 0:.0f}")
        if load.gen_tokens_per_s is not None:
            figures.append(fmt_rate(load.gen_tokens_per_s, " tok/s"))
        if health.latency_s is not None:
            figures.append(f"fwd {health.latency_s:.1f}s")
        if srv.state in ("hung", "down", "unknown") or not figures:
            # the daemon's one-line detail: whole, on the lines it needs below the address
            words = [(word, "") for word in (srv.detail or "").split()]
            lines.append(wrapped(line.append(" "), words, width, 7, sep=" "))
        else:
            lines.append(wrapped(line, [(f, "") for f in figures], width, 7))
        capture = capture_line(srv.capture, width)
        if capture is not None:
            lines.append(capture)
        if srv.speculative is not None:
            lines.append(Text(f"   drafter {spec_text(srv.speculative)}"[:width],
                              style="bold red" if spec_low(srv.speculative) else "grey70"))
        half = max(4, (width - 16) // 2)
        # the server's whole run (hsmon/tui/series.py), each cell the mean of its share
        queue = fit(list(history.server_queued.get(srv.url, ())), half)
        rate = fit(list(history.server_tokens_per_s.get(srv.url, ())), half)
        spark_line = Text("   queue ", style="grey70")
        spark_line.append(f"{spark(queue, half):<{half}}", style="bright_blue")
        spark_line.append(" tok/s ", style="grey70")
        spark_line.append(spark(rate, half), style="green")
        lines.append(spark_line)
    return lines


def wrapped(head: Text, parts: list[tuple[str, str]], width: int, indent: int, sep: str = "  ") -> Text:
    """``head`` then ``parts`` (text, style) after ``sep``, each whole: a part that does not fit on
    the line goes to the next one, indented by ``indent`` (a part longer than a line is cut there)."""
    lines, line = [], head.copy()
    for text, style in parts:
        piece = f"{sep}{text}"
        if line.cell_len + len(piece) > width and line.cell_len > indent:
            lines.append(line)
            line = Text(" " * indent)
            piece = text
        line.append(piece, style=style)
    lines.append(line)
    for each in lines:
        each.truncate(width, overflow="ellipsis")
    return Text("\n").join(lines)


def capture_line(capture: Capture | None, width: int) -> Text | None:
    """The hsmon capture plugin's counters (``servers[i].capture``): 'capture q 2  pool
    120.0 MB of 512.0 MB  files 1,234  sync 0  err 0  hook p99 2.1 ms'; None without the plugin.
    Red on write errors or reused buffers, yellow on sync fallbacks (the host pool was full).
    Where the width is short, the figures go on as many lines as they need, each whole."""
    if capture is None:
        return None
    errors, reuses, syncs = capture.write_errors, capture.buffer_reuses, capture.sync_fallbacks
    parts = [
        (f"q {fmt_count(capture.queue_depth)}", ""),
        (f"pool {format_bytes(capture.pool_bytes_in_use)} of {format_bytes(capture.pool_bytes_max)}", ""),
        (f"files {fmt_count(capture.files_written)}", ""),
        (f"sync {fmt_count(syncs)}", "bold yellow" if syncs else ""),
        (f"err {fmt_count(errors)}", "bold red" if errors else ""),
    ]
    if reuses:
        parts.append((f"buffer reuses {fmt_count(reuses)}", "bold red"))
    if capture.hook_seconds_p99 is not None:
        parts.append((f"hook p99 {1000 * float(capture.hook_seconds_p99):.1f} ms", "grey70"))
    if capture.sglang_version:  # which release, which adapter
        parts.append((f"SGLang {capture.sglang_version} {capture.adapter or 'aux-return'}", "grey70"))
    if capture.model_class:  # the class loaded, its parallel sizes, its layer rule, the points captured
        tp = f" tp{capture.tp_size}" if capture.tp_size and capture.tp_size > 1 else ""
        points = ",".join(map(str, capture.captured_points or [])) or "?"
        rule = capture.capture_rule or "?"
        parts.append((f"{capture.model_class}{tp} rule {rule} points {points}", "grey70"))
    first, *rest = parts
    return wrapped(Text("   capture", style="grey70").append(f" {first[0]}"), rest, width, indent=11)


def gpu_lines(gpus: GpuSection | None, width: int) -> list[Text]:
    """One line per GPU: a utilization bar, memory, power, temperature; or why none are watched."""
    if gpus is None:
        return []
    if not gpus.available:
        reason = gpus.reason or "not watched"
        text = f"GPUs: {reason}"
        return [Text(text if len(text) <= width else text[: width - 1] + "…", style="grey50")]
    lines = []
    for dev in gpus.devices:
        util = dev.utilization
        used, total = dev.memory_used_bytes, dev.memory_total_bytes
        tail = f" {'-' if util is None else f'{100 * util:3.0f}%'}"
        if used is not None and total:
            tail += f" {used / 2**30:5.1f}/{total / 2**30:.0f}G"
        if dev.power_watts is not None:
            tail += f" {dev.power_watts:4.0f}W"
        if dev.temperature_celsius is not None:
            tail += f" {dev.temperature_celsius}C"
        head = f"GPU{dev.index} "
        bar = max(4, width - len(head) - len(tail))
        filled = round((util or 0.0) * bar)
        line = Text(head, style="bold")
        line.append("━" * filled, style="green" if (util or 0) > 0 else "grey37")
        line.append("─" * (bar - filled), style="red" if util == 0 else "grey37")
        line.append(tail)
        lines.append(line)
    return lines


def has_engine(job: JobStatus, gpus: GpuSection | None) -> bool:
    """Whether the panel has anything to show: servers, or GPUs that NVML reports."""
    return bool(job.servers) or bool(gpus is not None and gpus.available and gpus.devices)
