"""Adapter ``layer-capture``: SGLang releases with the hook registry but without
``--enable-return-aux-hidden-states`` (0.5.18; see ``features.py`` and docs/extract.md).

SGLang is started with ``--enable-return-hidden-states`` only (no speculative algorithm); the
layer ids come in ``HSMON_PLUGIN_AUX_LAYER_IDS`` (``hsmon sglang-serve`` sets it, with the same
ids 0.5.23 takes in ``--return-aux-hidden-state-layer-ids``). Then:

- after the model loads (``ModelRunner.load_model``), the model's own EAGLE-3 capture is turned
  on (``capture_rule.turn_on``: ``set_eagle3_layers_to_capture`` with the ids that make this class
  capture the points in ``HSMON_PLUGIN_CAPTURE_POINTS``, ``hidden_states + residual`` before each
  captured layer, exactly what 0.5.23 captures); a model class without the method gets forward
  hooks on the decoder layers ``id`` that record the same sum (point ``id + 1``);
- around ``LogitsProcessor.forward``: the model hands the captured layers in as
  ``aux_hidden_states``; the plugin calls the original without them, so the output's
  ``hidden_states`` is the last layer after the final norm for every token (full capture mode),
  and then sets ``hidden_states`` to the packed captured layers and ``last_hidden_states`` to the
  last layer: the two tensors the ``aux-return`` adapter reads, so ``capture.py`` serves both.
  Outside full capture (decode, requests without hidden states) the aux list is dropped: stock.
- ``/server_info``: the plugin's section rides on the scheduler's start-up info
  (``Scheduler.get_init_info``, merged into /server_info by the HTTP server), the counters on
  ``Scheduler.get_internal_state``; pipeline parallelism is refused when the scheduler starts.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import torch

LAYER_IDS_ENV = "HSMON_PLUGIN_AUX_LAYER_IDS"
MODEL_RUNNER = "sglang.srt.model_executor.model_runner.ModelRunner"
LOAD_MODEL = f"{MODEL_RUNNER}.load_model"
LOGITS_FORWARD = "sglang.srt.layers.logits_processor.LogitsProcessor.forward"
SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
INIT_INFO = f"{SCHEDULER}.get_init_info"
INTERNAL_STATE = f"{SCHEDULER}.get_internal_state"
SCHEDULER_INIT = f"{SCHEDULER}.__init__"

_hooked = threading.local()  # the forward-hook fallback's captures, per forward


def layer_ids(env: dict[str, str] | None = None) -> list[int]:
    raw = (os.environ if env is None else env).get(LAYER_IDS_ENV, "")
    return [int(x) for x in raw.replace(",", " ").split()]


def install(register: Any, hook_types: Any, add_server_info: Any, add_internal_state: Any,
            refuse_pp: Any) -> None:
    """Register this adapter's hooks (``register`` is ``HookRegistry.register``)."""
    register(SCHEDULER_INIT, _refuse_pp(refuse_pp), hook_types.BEFORE)
    register(INIT_INFO, add_server_info, hook_types.AFTER)
    register(INTERNAL_STATE, add_internal_state, hook_types.AFTER)
    register(LOAD_MODEL, _after_load_model, hook_types.AFTER)
    register(LOGITS_FORWARD, _logits_forward, hook_types.AROUND)


def _refuse_pp(refuse_pp: Any) -> Any:
    def hook(scheduler: Any, server_args: Any, *args: Any, **kwargs: Any) -> None:
        refuse_pp(server_args)
    return hook


def _after_load_model(result: Any, runner: Any, *args: Any, **kwargs: Any) -> Any:
    from hsmon_sglang_plugin import capture_rule
    from hsmon_sglang_plugin.layer_rule import Capture

    ids = layer_ids()
    model = getattr(runner, "model", None)
    if not ids or model is None:
        return result
    if hasattr(model, "set_eagle3_layers_to_capture"):
        capture_rule.turn_on(model, ids)
    else:
        points = capture_rule.requested_points() or [i + 1 for i in ids]
        ids = [p - 1 for p in points]
        _hook_decoder_layers(model, ids)
        capture_rule.remember(Capture(type(model).__name__, ids, points))
    return result


def _hook_decoder_layers(model: Any, ids: list[int]) -> None:
    """The fallback: record ``hidden_states + residual`` after each layer ``id`` (the input of
    ``id + 1``), as the EAGLE-3 capture does; the logits hook takes them."""
    layers = model.model.layers

    def make(slot: int) -> Any:
        def hook(_module: Any, _args: Any, output: Any) -> None:
            hidden, residual = output[0], output[1]
            store = _hooked.__dict__.setdefault("aux", {})
            store[slot] = hidden + residual if residual is not None else hidden.clone()
        return hook

    for slot, i in enumerate(ids):
        layers[i].register_forward_hook(make(slot))
    model._hsmon_aux_slots = len(ids)


def _logits_forward(original: Any, processor: Any, input_ids: Any, hidden_states: Any, lm_head: Any,
                    metadata: Any, aux_hidden_states: Any = None, *args: Any, **kwargs: Any) -> Any:
    mode = getattr(metadata, "capture_hidden_mode", None)
    full = mode is not None and mode.is_full()
    aux = aux_hidden_states
    store = getattr(_hooked, "aux", None)
    if aux is None and store:
        aux = [store[k] for k in sorted(store)]
    _hooked.aux = {}
    out = original(processor, input_ids, hidden_states, lm_head, metadata, None, *args, **kwargs)
    if full and aux is not None and len(aux) and out.hidden_states is not None:
        out.last_hidden_states = out.hidden_states
        out.hidden_states = aux if isinstance(aux, torch.Tensor) else torch.cat(list(aux), dim=-1)
    return out
