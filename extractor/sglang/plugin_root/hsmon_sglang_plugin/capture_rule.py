"""The capture turned on with the ids the loaded model class needs (``layer_rule.py``), and said.

``hsmon sglang-serve`` passes the capture points in ``HSMON_PLUGIN_CAPTURE_POINTS``. Where SGLang
turns the model's capture on, the plugin asks the model which ids capture exactly those points
and hands SGLang those ids instead of the ones on its command line (which sglang-serve already
chose by hsmon's table of rules: they agree unless the table is out of date); a class that cannot
capture them stops the server with one line. Without the variable (a plain launch) SGLang's own
ids stay. Either way the points the model really captures are read back from the model and
published: ``/server_info``'s ``hsmon_plugin`` (``model_class``, ``layer_ids``,
``captured_points``, from the scheduler's start-up info) and each dump file's metadata.

- adapter ``aux-return`` (0.5.23): AROUND ``configure_aux_hidden_state_capture``, where the model
  runner calls ``set_eagle3_layers_to_capture`` before any CUDA graph is captured;
- adapter ``layer-capture``: ``layer_capture._after_load_model`` calls ``apply`` itself.
"""

from __future__ import annotations

import os
from typing import Any

from hsmon_sglang_plugin.layer_rule import CAPTURE_POINTS_ENV, Capture, RuleRefused, apply, parse_ints

CONFIGURE = ("sglang.srt.model_executor.model_runner_components.attention_backend_setup."
             "configure_aux_hidden_state_capture")
INIT_INFO = "sglang.srt.managers.scheduler.Scheduler.get_init_info"
INFO_KEY = "hsmon_capture_layers"  # the scheduler's start-up info -> /server_info's hsmon_plugin

_state: dict[str, Capture] = {}


def requested_points(env: dict[str, str] | None = None) -> list[int]:
    return parse_ints((os.environ if env is None else env).get(CAPTURE_POINTS_ENV))


def turn_on(model: Any, ids: list[int] | None) -> Capture:
    """Capture the requested points (or ``ids`` when none were requested); SystemExit in one
    line when the class cannot. Remembers what the model captures for this process."""
    try:
        capture = apply(model, requested_points() or None, ids)
    except RuleRefused as exc:
        raise SystemExit(str(exc)) from None
    _state["capture"] = capture
    return capture


def remember(capture: Capture) -> None:
    _state["capture"] = capture


def current() -> Capture | None:
    return _state.get("capture")


def install(register: Any, hook_types: Any) -> None:
    """The ``aux-return`` hooks (``layer-capture`` calls ``turn_on`` from its own load hook)."""
    register(CONFIGURE, _configure, hook_types.AROUND)
    register(INIT_INFO, add_init_info, hook_types.AFTER)


def _configure(original: Any, *args: Any, **kwargs: Any) -> Any:
    """SGLang's call, with the model's ``set_eagle3_layers_to_capture`` going through ``turn_on``."""
    if not kwargs.get("eagle_use_aux_hidden_state") or "model" not in kwargs:
        return original(*args, **kwargs)
    model = kwargs["model"]

    class _Asked:
        def __getattr__(self, name: str) -> Any:
            return getattr(model, name)

        def set_eagle3_layers_to_capture(self, ids: Any = None) -> None:
            turn_on(model, list(ids) if ids is not None else None)

    return original(*args, **{**kwargs, "model": _Asked()})


def add_init_info(result: Any, *args: Any, **kwargs: Any) -> Any:
    capture = current()
    if isinstance(result, dict) and capture is not None:
        result[INFO_KEY] = capture.as_info()
    return result


def fold_into(section: dict[str, Any], info: dict[str, Any]) -> None:
    """Put the captured layers (this process's, or the scheduler's in ``info``) into the
    plugin's ``/server_info`` section."""
    capture = current()
    facts = capture.as_info() if capture is not None else info.pop(INFO_KEY, None)
    if isinstance(facts, dict):
        section.update(facts)
