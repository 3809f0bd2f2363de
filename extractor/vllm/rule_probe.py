"""Run in vLLM's environment: which layer each of vLLM's classes captures for an EAGLE-3 layer id.

``python -m extractor.vllm.rule_probe`` (vLLM on ``sys.path``, nothing loaded on a device) reads vLLM's
own code: its model registry's classes with ``supports_eagle3``, and the decoders that capture
(``EagleModelMixin`` subclasses), whose forward calls ``_maybe_add_hidden_state(aux, index, hidden,
residual)`` with the index of the residual stream it appends. A call with ``i + 1`` right after the
decoder layer ``i`` ran, or with ``self.start_layer`` (or 0) before the first layer, appends
``hidden_states[index]``: vLLM's id is the point (rule ``vllm``; some decoders count ``i`` from their
pipeline stage's first layer, the same at pipeline size 1). Any other call is reported as it is, with
no rule; a decoder whose forward makes no such call (it delegates) is left out. Prints one JSON object
(the last line): the release, the EAGLE-3 classes with their module, the decoders with their rule or
their unexplained calls, the modules that do not import here.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import sys
import textwrap
from typing import Any

CAPTURE = "_maybe_add_hidden_state"


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == CAPTURE
        and len(n.args) >= 2
    ]


def _after_layer(loop: ast.For, call: ast.Call) -> bool:
    """``call`` (in ``loop``'s body) appends ``<loop index> + 1`` after a statement that ran a layer."""
    target = loop.target.elts[0] if isinstance(loop.target, ast.Tuple) else loop.target
    index = call.args[1]
    if not (
        isinstance(target, ast.Name)
        and isinstance(index, ast.BinOp)
        and isinstance(index.op, ast.Add)
        and isinstance(index.left, ast.Name)
        and index.left.id == target.id
        and isinstance(index.right, ast.Constant)
        and index.right.value == 1
    ):
        return False
    ran_layer = False
    for statement in loop.body:
        if any(c is call for c in ast.walk(statement)):
            return ran_layer
        ran_layer = ran_layer or any(
            isinstance(n, ast.Call) and "layer" in ast.unparse(n.func).lower() for n in ast.walk(statement)
        )
    return False


def _inline(tree: ast.AST) -> list[tuple[str, bool]]:
    """The other capture vLLM's decoders write: ``if X in self.aux_hidden_state_layers: append(hidden +
    residual)`` in the loop over the layers (``i`` counted from ``self.start_layer``): ``X`` is ``i``
    before layer ``i`` runs, or ``i + 1`` after it, both ``hidden_states[X]``. Returns each test as
    written and whether it is one of those two."""
    found = []
    for loop in (n for n in ast.walk(tree) if isinstance(n, ast.For)):
        target = loop.target.elts[0] if isinstance(loop.target, ast.Tuple) else loop.target
        var = target.id if isinstance(target, ast.Name) else "?"
        ran_layer = False
        for statement in loop.body:
            for node in ast.walk(statement):
                if isinstance(node, ast.If) and "aux_hidden_state_layers" in ast.unparse(node.test):
                    test = ast.unparse(node.test)
                    wanted = f"{var} + 1 in " if ran_layer else f"{var} in "
                    found.append((test, test.startswith(wanted + "self.aux_hidden_state_layers")))
            ran_layer = ran_layer or any(
                isinstance(n, ast.Call) and ast.unparse(n.func) == "layer" for n in ast.walk(statement)
            )
    return found


def rule_of(source: str) -> tuple[str | None, list[str]]:
    """(``"vllm"`` when every capture appends the residual stream at its own index, else None; the
    captures as written)."""
    tree = ast.parse(textwrap.dedent(source))
    calls, inline = _calls(tree), _inline(tree)
    loops = [n for n in ast.walk(tree) if isinstance(n, ast.For)]
    written = [ast.unparse(c.args[1]) for c in calls] + [test for test, _ in inline]
    if not calls and not inline:
        return None, written
    if not all(ok for _, ok in inline):
        return None, written
    for call in calls:
        loop = next((lp for lp in loops if any(c is call for c in ast.walk(lp))), None)
        before_first = loop is None and ast.unparse(call.args[1]) in ("self.start_layer", "0")
        if not before_first and not (loop is not None and _after_layer(loop, call)):
            return None, written
    return "vllm", written


def transformers_backend_rule() -> tuple[str | None, list[str]]:
    """vLLM's Transformers backend records, for layer id ``k``, the output of decoder layer ``k - 1``
    (transformers' OutputRecorder): ``hidden_states[k]`` when its set_aux_hidden_state_layers says so."""
    from vllm.model_executor.models.transformers import base

    source = textwrap.dedent(inspect.getsource(base.Base.set_aux_hidden_state_layers))
    recorded = "_layer_names[layer - 1]" in source and "OutputRecorder(" in source
    return ("vllm" if recorded else None), (["OutputRecorder of layer k - 1"] if recorded else [])


def probe() -> dict[str, Any]:
    import vllm
    from vllm.model_executor.models.interfaces import EagleModelMixin, supports_eagle3
    from vllm.model_executor.models.registry import _VLLM_MODELS

    classes: dict[str, str] = {}
    decoders: dict[str, dict[str, Any]] = {}
    not_importable: dict[str, str] = {}
    for arch, (module_name, class_name) in sorted(_VLLM_MODELS.items()):
        try:
            module = importlib.import_module(f"vllm.model_executor.models.{module_name}")
            cls = getattr(module, class_name)
        except Exception as exc:  # a module that needs what this CPU environment lacks
            not_importable[module_name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            continue
        if supports_eagle3(cls):
            classes[arch] = module_name
        for name, member in vars(module).items():
            own = (
                inspect.isclass(member) and member.__module__ == module.__name__ and "forward" in vars(member)
            )
            if (
                own
                and member is not EagleModelMixin
                and (
                    issubclass(member, EagleModelMixin)
                    or "aux_hidden_state_layers" in inspect.getsource(member)
                )
            ):
                rule, calls = rule_of(inspect.getsource(member.forward))
                if calls:
                    decoders[f"{module_name}.{name}"] = {"rule": rule, "calls": calls}
    rule, calls = transformers_backend_rule()
    decoders["transformers.Base"] = {"rule": rule, "calls": calls}
    return {
        "vllm_version": vllm.__version__,
        "classes": classes,
        "decoders": decoders,
        "not_importable": not_importable,
    }


if __name__ == "__main__":
    print(json.dumps(probe()), flush=True)
    sys.exit(0)
