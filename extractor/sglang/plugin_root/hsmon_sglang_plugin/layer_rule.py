"""Which layers an SGLang model class captures for a list of EAGLE-3 layer ids, asked of the class.

SGLang's model classes do not count alike: ``set_eagle3_layers_to_capture(ids)`` stores
``id + 1`` in llama.py, ``id + 1`` only when the first id is 1 in deepseek_v2.py, the ids as
they are when the largest is the layer count in gpt_oss.py, and other classes may differ again.
Rather than reading their source, the plugin calls the loaded model's own method and reads
back what it stored: the ``layers_to_capture`` list of the first module that has one (the
decoder stack), and the decoder layers flagged ``_is_layer_to_capture`` (the classes whose
forward checks a flag per layer). An entry ``L`` there means "the input of decoder layer ``L``",
i.e. the residual stream after layer ``L - 1``: capture point ``L`` (transformers'
``hidden_states[L]``), hsmon's unit. Every probe puts the model's attributes back as they were
(a second call does not clear the flags of the first one in every class).

Imports only torch (SGLang's environment); used inside the server after the model loads and,
on models shaped enough for the method, by the tests that derive each class's rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

CAPTURE_POINTS_ENV = "HSMON_PLUGIN_CAPTURE_POINTS"
# The candidate ids for points P, tried in this order: P - 1 (most classes), then P.
SHIFTS = (1, 0)
_MODULE_SLOTS = frozenset(vars(torch.nn.Module()))


class RuleRefused(ValueError):
    """The class cannot capture the requested points: one line naming the class and the fix."""


@dataclass(frozen=True)
class Capture:
    """What one model captures: its class, the ids it was given, the points it captures."""

    model_class: str
    layer_ids: list[int]
    captured_points: list[int]

    def as_info(self) -> dict[str, Any]:
        return {"model_class": self.model_class, "layer_ids": ",".join(map(str, self.layer_ids)),
                "captured_points": ",".join(map(str, self.captured_points))}


def parse_ints(text: str | None) -> list[int]:
    return [int(x) for x in (text or "").replace(",", " ").split()]


def captured_points(model: Any) -> list[int]:
    """The capture points the model's forward will capture now, in the order it captures them."""
    for module in _modules(model):
        stored = getattr(module, "layers_to_capture", None)
        layers = getattr(module, "layers", None)
        flagged = [i for i, layer in enumerate(layers or []) if getattr(layer, "_is_layer_to_capture", False)]
        if stored or flagged:
            return sorted({int(i) for i in stored or []} | set(flagged))
    return []


def probe(model: Any, ids: list[int]) -> list[int]:
    """The points ``model.set_eagle3_layers_to_capture(ids)`` would capture; the model is left as it was."""
    saved = _snapshot(model)
    try:
        model.set_eagle3_layers_to_capture(list(ids))
        return captured_points(model)
    finally:
        _restore(saved)


def choose_ids(model: Any, points: list[int]) -> list[int]:
    """The layer ids that make this model capture exactly ``points``; RuleRefused when none does."""
    tried = []
    for shift in SHIFTS:
        ids = [p - shift for p in points]
        if any(i < 0 for i in ids):
            continue
        try:
            got = probe(model, ids)
        except (IndexError, ValueError, AttributeError) as exc:
            tried.append(f"ids {ids} fail ({type(exc).__name__})")
            continue
        if got == list(points):
            return ids
        tried.append(f"ids {ids} capture points {got}")
    order = ("" if list(points) == sorted(points)
             else " (in increasing order: forward captures in layer order)")
    raise RuleRefused(
        f"hsmon capture plugin: SGLang's {type(model).__name__} cannot capture points {list(points)} exactly "
        f"({'; '.join(tried)}); pass other --layers{order}, e.g. with a first point other than 1")


def apply(model: Any, points: list[int] | None, ids: list[int] | None) -> Capture:
    """Turn the capture on: for ``points``, with the ids this class needs (RuleRefused when it
    cannot); else with ``ids`` as given. Returns what the model really captures."""
    if points:
        ids = choose_ids(model, points)
    model.set_eagle3_layers_to_capture(list(ids) if ids else None)
    return Capture(type(model).__name__, list(ids or []), captured_points(model))


def _modules(model: Any) -> list[Any]:
    if isinstance(model, torch.nn.Module):
        return list(model.modules())
    return [model]


def _snapshot(model: Any) -> list[tuple[Any, dict[str, Any]]]:
    """Every module's plain attributes (lists copied), to put back after a probe."""
    saved = []
    for module in _modules(model):
        plain = {k: (list(v) if isinstance(v, list) else v) for k, v in vars(module).items()
                 if k not in _MODULE_SLOTS}
        saved.append((module, plain))
    return saved


def _restore(saved: list[tuple[Any, dict[str, Any]]]) -> None:
    for module, plain in saved:
        for key in [k for k in vars(module) if k not in _MODULE_SLOTS and k not in plain]:
            delattr(module, key)
        for key, value in plain.items():
            if vars(module).get(key, _MISSING) is not value:
                object.__setattr__(module, key, value)


_MISSING = object()
