"""The engines that serve a target (SGLang, vLLM) and how each names a capture point by a layer id.

Capture point ``p`` is transformers' ``hidden_states[p]`` everywhere in hsmon. An engine takes layer
ids (a capture server's flags, an exported drafter's ``eagle_aux_hidden_state_layer_ids``) and turns
them into layers by its own rule:
- SGLang: per model class (``capture_points.RULES``; the class table ``sglang_classes``), most
  classes capture ``id + 1``;
- vLLM: every class that captures for EAGLE-3 (``vllm_classes``) appends the residual stream after
  layer ``id - 1``, i.e. ``hidden_states[id]``: point = id, and it captures the ids in ascending
  order whatever order they are given in.
A drafter's ``hsmon_capture`` record (config.json) names the engine, so an export read by the other
engine is converted or refused, never fed points one layer off (docs/serve-drafter.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

SGLANG = "sglang"
VLLM = "vllm"
ENGINES = (SGLANG, VLLM)
VLLM_RULE = "vllm"
VLLM_RULE_TEXT = "point = id (captured in ascending order)"


def vllm_layer_ids(points: Iterable[int]) -> list[int]:
    """vLLM's layer ids for capture points (the same numbers); ValueError in one line when they are
    not ascending: vLLM sorts the ids it captures, so the K layers would come in another order."""
    points = list(points)
    if points != sorted(points):
        raise ValueError(
            f"capture points {points}: vLLM captures layers in ascending order (it sorts "
            f"the ids); give them ascending, e.g. --layers {','.join(map(str, sorted(points)))}"
        )
    return points


def vllm_points(layer_ids: Iterable[int]) -> list[int]:
    """The capture points vLLM captures for ``layer_ids``, in the order it hands them on."""
    return sorted(set(layer_ids))


def capture_record(points: list[int], engine: str, serving_class: str, num_layers: int) -> dict[str, Any]:
    """An export's ``hsmon_capture``: the points, the engine, the serving class, its rule, and the ids
    that make that engine's class capture the points; ValueError in one line when it cannot."""
    from hsmon.contracts.capture_points import layer_ids_for, rule_of

    if engine == VLLM:
        rule, ids = VLLM_RULE, vllm_layer_ids(points)
    elif engine == SGLANG:
        rule = rule_of(serving_class)
        ids = layer_ids_for(points, rule, num_layers)
    else:
        raise ValueError(f"--engine {engine!r}: give one of {', '.join(ENGINES)}")
    return {
        "capture_points": list(points),
        "engine": engine,
        "serving_class": serving_class,
        "rule": rule,
        "layer_ids": ids,
    }


def record_engine(record: dict[str, Any]) -> str:
    """The engine an export's ``hsmon_capture`` was written for (exports older than the field: SGLang)."""
    return str(record.get("engine") or SGLANG)
