"""The hsmon capture plugin's counters as a server's ``/server_info`` reports them (pure).

The plugin (extractor/sglang/plugin_root/hsmon_sglang_plugin/writer.py, ``Stats``) publishes one
``hsmon_capture`` dict per scheduler process under ``internal_states[k]``; the server tracker sums
them into one ``Capture`` (hsmon.status_doc), the ``capture`` section of the server's status entry
(docs/status-api.md). No plugin (no ``hsmon_plugin`` section, or no scheduler reporting): None.
"""

from __future__ import annotations

import math
from typing import Any

from hsmon.status_doc import Capture

# counters summed over the schedulers: status key -> the plugin's key
_SUMMED = {
    "requests": "requests",
    "files_written": "files_written",
    "write_errors": "write_errors",
    "sync_fallbacks": "sync_fallbacks",
    "buffer_reuses": "buffer_reuses",
    "queue_depth": "queue_depth",
    "pool_bytes_in_use": "pool_bytes_in_use",
    "pool_bytes_max": "pool_limit_bytes",
}


def parse_capture(info: Any, now: float) -> Capture | None:
    """The summed counters of a ``/server_info`` answer, or None when it has no capture plugin."""
    if not isinstance(info, dict) or not isinstance(info.get("hsmon_plugin"), dict):
        return None
    states = info.get("internal_states")
    parts = [s["hsmon_capture"] for s in states if isinstance(s, dict) and isinstance(
        s.get("hsmon_capture"), dict)] if isinstance(states, list) else []
    if not parts:
        return None
    sums = {key: sum(_int(p.get(src)) for p in parts) for key, src in _SUMMED.items()}
    hook_ms = sorted(float(s[1]) for p in parts for s in p.get("hook_samples") or []
                     if isinstance(s, list | tuple) and len(s) >= 2 and _number(s[1]))
    plugin = info["hsmon_plugin"]
    version = plugin.get("version")
    release, adapter = plugin.get("sglang_version"), plugin.get("adapter")
    model_class = plugin.get("model_class")
    return Capture(
        sglang_version=str(release) if release is not None else None,
        adapter=str(adapter) if adapter is not None else None,
        model_class=str(model_class) if model_class else None,
        tp_size=_size(info.get("tp_size")), dp_size=_size(info.get("dp_size")),
        ep_size=_size(info.get("ep_size")),
        capture_rule=_rule(model_class),
        captured_points=_points(plugin.get("captured_points")),
        writer="attention-TP rank 0" if model_class else None,
        schedulers=len(parts),
        plugin_version=str(version) if version is not None else None,
        write_seconds=sum(_float(p.get("write_seconds")) for p in parts),
        hook_seconds=sum(_float(p.get("hook_seconds")) for p in parts),
        hook_seconds_p50=_quantile(hook_ms, 0.5),
        hook_seconds_p99=_quantile(hook_ms, 0.99),
        read_ts=now,
        **sums,
    )


def _size(value: Any) -> int | None:
    return int(value) if _number(value) and value >= 1 else None


def _rule(model_class: Any) -> str | None:
    """The class's layer rule by hsmon's table (None: no class, or one the table does not list)."""
    from hsmon.contracts.capture_points import rule_of

    if not model_class:
        return None
    try:
        return rule_of(str(model_class))
    except ValueError:
        return None


def _points(text: Any) -> list[int] | None:
    try:
        points = [int(p) for p in str(text).replace(",", " ").split()] if text else []
    except ValueError:
        return None
    return points or None


def _quantile(sorted_ms: list[float], q: float) -> float | None:
    """The nearest-rank quantile of milliseconds, in seconds (None for no samples)."""
    if not sorted_ms:
        return None
    return sorted_ms[max(0, math.ceil(q * len(sorted_ms)) - 1)] / 1e3


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _int(value: Any) -> int:
    return int(value) if _number(value) else 0


def _float(value: Any) -> float:
    return float(value) if _number(value) else 0.0
