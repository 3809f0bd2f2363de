"""Capture points: which layers' outputs an extraction keeps, and how SGLang names them.

Capture point ``p`` is transformers' ``hidden_states[p]``, the output of decoder layer ``p - 1``
(0-based), which SGLang's ``--return-aux-hidden-state-layer-ids`` calls layer id ``p - 1``. The
manifest, ``--layers`` and the events speak in capture points; only the SGLang side (server flags,
/server_info, dump files, the exported drafter's config) speaks in layer ids. A contract module:
light, imported by the extractor, the trainer and the server launcher.
"""

from __future__ import annotations

from collections.abc import Iterable


def default_capture_points(num_layers: int) -> list[int]:
    """EAGLE-3's convention for an N-layer target: [2, N//2, N-3]."""
    return [2, num_layers // 2, num_layers - 3]


def parse_capture_points(text: str | None, num_layers: int) -> list[int]:
    """``--layers '2,4,5'`` -> [2, 4, 5], checked against an N-layer model (None or '': the default).

    ValueError with one line naming the value and what to give instead.
    """
    shown = repr(text) if text else f"(default {default_capture_points(num_layers)})"
    if not text:
        points = default_capture_points(num_layers)
    else:
        try:
            points = [int(p) for p in text.replace(" ", "").split(",") if p]
        except ValueError:
            raise ValueError(f"--layers {shown}: give comma-separated integers, e.g. 2,4,6") from None
    if not points or len(set(points)) != len(points) or any(not 1 <= p <= num_layers - 1 for p in points):
        raise ValueError(
            f"--layers {shown}: capture points must be distinct and lie in 1..{num_layers - 1} "
            f"for this {num_layers}-layer model (the last layer is always returned after the norm)"
        )
    return points


def sglang_layer_ids(points: Iterable[int]) -> list[int]:
    """SGLang's aux-hidden-state layer ids of capture points (``p - 1``)."""
    return [p - 1 for p in points]


def capture_points_of(layer_ids: Iterable[int]) -> list[int]:
    """The capture points SGLang layer ids stand for (``id + 1``)."""
    return [i + 1 for i in layer_ids]
