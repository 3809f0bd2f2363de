"""Every SGLang model class with ``set_eagle3_layers_to_capture``, asked which points ids capture.

``python -m hsmon_sglang_plugin.rule_probe [MODULE CLASS IDS]`` (in SGLang's environment, CPU
engine; with arguments: that one class asked about those ids) imports
SGLang's model modules as its registry does, and for each class that has the method calls it on
an object shaped just enough for it (the class made without ``__init__``, given a config, a
pipeline group and a decoder stack of ``N`` empty layers), reading back what it stores
(``layer_rule.probe``). It prints one JSON document: per class, the points each probe list of
ids captures and the ids ``layer_rule.choose_ids`` picks for a few point lists; per module that
cannot be imported here, why. hsmon names the rules from it (hsmon/contracts/capture_points.py)
and writes docs/extract.md's table (``python -m extractor.sglang.rule_table``).
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
from types import SimpleNamespace
from typing import Any

import torch

from hsmon_sglang_plugin.layer_rule import captured_points, choose_ids, probe

METHOD = "set_eagle3_layers_to_capture"
NUM_LAYERS = 8
PROBE_IDS = ([1, 3, 4], [0, 3, 4], [2, 4, 5], [3, 5, 6], [2, 4, 7], [1, 4, 8])
CHOICE_POINTS = ([2, 4, 5], [3, 5, 6], [1, 4, 5], [2, 5, 7])
# Wrappers that delegate to a text model held in ``language_model``: the class it holds.
DELEGATES = {
    "KimiK25ForConditionalGeneration": "DeepseekV3ForCausalLM",
    "Gemma3ForConditionalGeneration": "Gemma3ForCausalLM",
    "Llama4ForConditionalGeneration": "Llama4ForCausalLM",
}


def _classes() -> tuple[dict[str, type], dict[str, str]]:
    """Every registered architecture's class, and the model modules that fail to import here."""
    import sglang.srt.models as package

    classes: dict[str, type] = {}
    failed: dict[str, str] = {}
    for info in pkgutil.iter_modules(package.__path__):
        name = f"{package.__name__}.{info.name}"
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            path = f"{package.__path__[0]}/{info.name}.py"
            try:
                with open(path) as source:
                    has = f"def {METHOD}" in source.read()
            except OSError:
                has = False
            if has:
                failed[info.name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            continue
        entry = getattr(module, "EntryClass", None)
        for cls in entry if isinstance(entry, list) else [entry] if entry is not None else []:
            classes.setdefault(cls.__name__, cls)
    return classes, failed


class _Stack(torch.nn.Module):
    """A decoder stack: ``N`` empty layers and an empty capture list."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Module() for _ in range(NUM_LAYERS))
        self.layers_to_capture: list[int] = []


def _config() -> SimpleNamespace:
    text = SimpleNamespace(num_hidden_layers=NUM_LAYERS, num_loops=1)
    return SimpleNamespace(num_hidden_layers=NUM_LAYERS, text_config=text, num_loops=1)


def _inner_stack_class(cls: type) -> type | None:
    """The decoder stack class of ``cls``'s module that has the method itself (some classes hand the
    ids to ``self.model.set_eagle3_layers_to_capture``), else None."""
    module = sys.modules[cls.__module__]
    for value in vars(module).values():
        if (isinstance(value, type) and issubclass(value, torch.nn.Module)
                and value.__name__.endswith("Model") and "For" not in value.__name__
                and hasattr(value, METHOD)):
            return value
    return None


def _blank(cls: type) -> Any:
    obj = cls.__new__(cls)
    torch.nn.Module.__init__(obj)
    return obj


def shaped(cls: type, classes: dict[str, type]) -> Any:
    """An instance of ``cls`` shaped enough for its ``set_eagle3_layers_to_capture``."""
    pp = SimpleNamespace(is_last_rank=True, is_first_rank=True, world_size=1, rank_in_group=0)
    obj = _blank(cls)
    object.__setattr__(obj, "config", _config())
    object.__setattr__(obj, "pp_group", pp)
    inner = _inner_stack_class(cls)
    stack = _Stack() if inner is None else _blank(inner)
    if inner is not None:
        stack.layers = torch.nn.ModuleList(torch.nn.Module() for _ in range(NUM_LAYERS))
        object.__setattr__(stack, "layers_to_capture", [])
        object.__setattr__(stack, "pp_group", pp)
        object.__setattr__(stack, "config", _config())
    obj.model = stack
    delegate = DELEGATES.get(cls.__name__)
    obj.language_model = shaped(classes[delegate], classes) if delegate in classes else _Stack()
    return obj


def _with_parallel(cls: type) -> list[tuple[Any, Any]]:
    """``get_parallel()`` (and older releases' ``get_pp_group()``) in the class's modules answer a
    last pipeline rank; the old values."""
    group = SimpleNamespace(is_last_rank=True, is_first_rank=True, world_size=1, rank_in_group=0)
    answers = {"get_parallel": SimpleNamespace(pp_group=group), "get_pp_group": group}
    old = []
    for klass in cls.__mro__:
        module = sys.modules.get(klass.__module__)
        for name, answer in answers.items():
            if module is not None and hasattr(module, name):
                old.append((module, name, getattr(module, name)))
                setattr(module, name, lambda answer=answer: answer)
    return old


def derive(cls: type, classes: dict[str, type]) -> dict[str, Any]:
    old = _with_parallel(cls)
    try:
        obj = shaped(cls, classes)
        probes = {}
        for ids in PROBE_IDS:
            try:
                probes[",".join(map(str, ids))] = probe(obj, ids)
            except Exception as exc:
                probes[",".join(map(str, ids))] = f"error: {type(exc).__name__}"
        choices: dict[str, Any] = {}
        for points in CHOICE_POINTS:
            try:
                choices[",".join(map(str, points))] = choose_ids(obj, points)
            except Exception:  # no ids work on the shaped object (RuleRefused, or the method fails)
                choices[",".join(map(str, points))] = None
        return {"module": cls.__module__.rsplit(".", 1)[-1], "probes": probes, "choices": choices,
                "left_capturing": captured_points(obj)}  # [] when every probe put the model back
    finally:
        for module, name, value in old:
            setattr(module, name, value)


def one(module: str, name: str, ids: list[int]) -> list[int]:
    """The points SGLang's class ``name`` (in ``sglang.srt.models.MODULE``) captures for ``ids``."""
    loaded = importlib.import_module(f"sglang.srt.models.{module}")
    cls = getattr(loaded, name)
    # a wrapper's text-model class, as its module imported it (kimi_k25: DeepseekV3ForCausalLM)
    delegate = DELEGATES.get(name)
    classes = {delegate: getattr(loaded, delegate)} if delegate and hasattr(loaded, delegate) else {}
    old = [pair for klass in (cls, *classes.values()) for pair in _with_parallel(klass)]
    try:
        return probe(shaped(cls, classes), ids)
    finally:
        for mod, name, value in reversed(old):
            setattr(mod, name, value)


def main() -> int:
    import logging

    import sglang

    logging.disable(logging.WARNING)
    if len(sys.argv) == 4:  # MODULE CLASS IDS: one class asked about one list of ids
        print(json.dumps(one(sys.argv[1], sys.argv[2], [int(i) for i in sys.argv[3].split(",")])))
        return 0
    classes, failed = _classes()
    found = {name: derive(cls, classes) for name, cls in sorted(classes.items()) if hasattr(cls, METHOD)}
    print(json.dumps({"sglang_version": sglang.__version__, "num_layers": NUM_LAYERS, "classes": found,
                      "not_importable": failed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
