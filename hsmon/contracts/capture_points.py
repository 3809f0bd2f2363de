"""Capture points: which layers' outputs an extraction keeps, and how SGLang names them.

Capture point ``p`` is transformers' ``hidden_states[p]``, the output of decoder layer ``p - 1``
(0-based). The manifest, ``--layers`` and the events speak in capture points; only the SGLang side
(server flags, /server_info, dump files, the exported drafter's config) speaks in layer ids, and
SGLang's model classes do not turn ids into layers alike: each class's ``set_eagle3_layers_to_capture``
has its rule (``RULES``; which class has which is ``sglang_classes.CLASS_RULES``, derived by calling
every class, docs/extract.md "Layer ids per SGLang model class"). Most classes (``llama``) capture
point ``id + 1``, so point ``p`` is id ``p - 1`` there. A contract module: light, imported by the
extractor, the trainer and the server launcher.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


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


def _llama(ids: list[int], num_layers: int) -> list[int]:
    return [i + 1 for i in ids]


def _deepseek(ids: list[int], num_layers: int) -> list[int]:
    return [i + 1 for i in ids] if ids and ids[0] == 1 else list(ids)


def _gpt_oss(ids: list[int], num_layers: int) -> list[int]:
    return list(ids) if ids and max(ids) == num_layers else [i + 1 for i in ids]


# rule name -> (ids, number of layers) -> the capture points that class captures for them
RULES: dict[str, Callable[[list[int], int], list[int]]] = {
    "llama": _llama, "deepseek": _deepseek, "gpt-oss": _gpt_oss}
RULE_TEXT = {
    "llama": "point = id + 1",
    "deepseek": "point = id + 1 when the first id is 1, else point = id",
    "gpt-oss": "point = id when the largest id is the layer count, else id + 1",
}
DEFAULT_RULE = "llama"


def rule_of(name: str) -> str:
    """The rule of an SGLang model class or a rule's own name; ValueError in one line if neither."""
    from hsmon.contracts.sglang_classes import CLASS_RULES

    if name in RULES:
        return name
    if name in CLASS_RULES:
        return CLASS_RULES[name]
    raise ValueError(f"{name!r} is neither an SGLang model class with set_eagle3_layers_to_capture "
                     "nor a rule; "
                     f"give a class from docs/extract.md's table (e.g. DeepseekV3ForCausalLM) or a rule: "
                     f"{', '.join(RULES)}")


def layer_ids_for(points: Iterable[int], rule: str, num_layers: int) -> list[int]:
    """The layer ids that make a class with ``rule`` capture exactly ``points`` (``p - 1``, else
    ``p``: the order the plugin tries them in); ValueError in one line when none does."""
    points = list(points)
    capture = RULES[rule]
    for shift in (1, 0):
        ids = [p - shift for p in points]
        if all(i >= 0 for i in ids) and capture(ids, num_layers) == points:
            return ids
    raise ValueError(f"capture points {points}: no layer ids make a class with SGLang's {rule} rule "
                     f"({RULE_TEXT[rule]}) capture them; choose points whose first is not 1")


def points_for(layer_ids: Iterable[int], rule: str, num_layers: int) -> list[int]:
    """The capture points a class with ``rule`` captures for ``layer_ids``."""
    return RULES[rule](list(layer_ids), num_layers)
