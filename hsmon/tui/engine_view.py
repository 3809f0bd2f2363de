"""Pure functions from the status document to the servers/GPUs panel: badges, lines, sparklines.

No Textual here (tested without a terminal); the widget is hsmon/tui/widgets/engine_panel.py.
"""

from __future__ import annotations

from rich.text import Text

from hsmon.contracts.units import format_bytes
from hsmon.status.text import spec_low, spec_text
from hsmon.status_doc import Capture, GpuSection, JobStatus
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
            figures = [srv.detail or ""]
        rest = "  " + "  ".join(figures)
        room = width - len(line.plain)
        line.append(rest if len(rest) <= room else rest[: max(0, room - 1)] + "…")
        lines.append(line)
        capture = capture_line(srv.capture, width)
        if capture is not None:
            lines.append(capture)
        if srv.speculative is not None:
            lines.append(Text(f"   drafter {spec_text(srv.speculative)}"[:width],
                              style="bold red" if spec_low(srv.speculative) else "grey70"))
        half = max(4, (width - 16) // 2)
        queue = list(history.server_queued.get(srv.url, ()))
        rate = list(history.server_tokens_per_s.get(srv.url, ()))
        spark_line = Text("   queue ", style="grey70")
        spark_line.append(f"{spark(queue, half):<{half}}", style="bright_blue")
        spark_line.append(" tok/s ", style="grey70")
        spark_line.append(spark(rate, half), style="green")
        lines.append(spark_line)
    return lines


def capture_line(capture: Capture | None, width: int) -> Text | None:
    """The hsmon capture plugin's counters (``servers[i].capture``): 'capture q 2  pool
    120.0 MB of 512.0 MB  files 1,234  sync 0  err 0'; None without the plugin. Red on write errors
    or reused buffers, yellow on sync fallbacks (the host pool was full)."""
    if capture is None:
        return None
    errors, reuses, syncs = capture.write_errors, capture.buffer_reuses, capture.sync_fallbacks
    line = Text("   capture", style="grey70")
    line.append(f" q {fmt_count(capture.queue_depth)}")
    line.append(f"  pool {format_bytes(capture.pool_bytes_in_use)} of {format_bytes(capture.pool_bytes_max)}")
    line.append(f"  files {fmt_count(capture.files_written)}")
    line.append(f"  sync {fmt_count(syncs)}", style="bold yellow" if syncs else "")
    line.append(f"  err {fmt_count(errors)}", style="bold red" if errors else "")
    if reuses:
        line.append(f"  buffer reuses {fmt_count(reuses)}", style="bold red")
    if capture.hook_seconds_p99 is not None:
        line.append(f"  hook p99 {1000 * float(capture.hook_seconds_p99):.1f} ms", style="grey70")
    if capture.sglang_version:  # which release, which adapter
        line.append(f"  SGLang {capture.sglang_version} {capture.adapter or 'aux-return'}", style="grey70")
    if capture.model_class:  # the class loaded, its parallel sizes, its layer rule, the points captured
        tp = f" tp{capture.tp_size}" if capture.tp_size and capture.tp_size > 1 else ""
        points = ",".join(map(str, capture.captured_points or [])) or "?"
        line.append(f"  {capture.model_class}{tp} rule {capture.capture_rule or '?'} points {points}",
                    style="grey70")
    line.truncate(width, overflow="ellipsis")
    return line


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
