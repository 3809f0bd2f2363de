"""The SGLang layer ids ``hsmon sglang-serve`` puts on the command line, by the class's rule.

The class is config.json's ``architectures[0]``; its rule comes from hsmon's table
(``hsmon.contracts.sglang_classes``, derived by calling every class). The capture plugin asks the
loaded class again when the model loads, and stops the server if the table was wrong.
"""

from __future__ import annotations

import json
from pathlib import Path

from hsmon.contracts.capture_points import layer_ids_for, rule_of


class LayerIdsError(ValueError):
    """The class cannot capture the points: one line naming them, the class and the fix."""


def serving_ids(points: list[int], model_path: Path) -> tuple[list[int], str]:
    """The SGLang layer ids that make the model's class capture ``points``, and that class (by
    hsmon's table of rules, docs/extract.md; the plugin asks the loaded class again); LayerIdsError
    in one line when the class cannot capture them."""
    config = json.loads((model_path / "config.json").read_text())
    arch = str((config.get("architectures") or ["LlamaForCausalLM"])[0])
    try:
        rule = rule_of(arch)
    except ValueError:
        rule = "llama"  # a class hsmon's table does not list: the plugin asks it when it loads
    num_layers = int(config.get("text_config", config).get("num_hidden_layers", 0))
    try:
        return layer_ids_for(points, rule, num_layers), arch
    except ValueError as exc:
        raise LayerIdsError(f"--layers {','.join(map(str, points))}: SGLang's {arch} cannot capture "
                            f"them: {exc}") from None
