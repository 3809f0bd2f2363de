"""The hooks inside SGLang 0.5.23 (registered by ``install``, applied by SGLang's plugin loader).

Where the data is: with ``--enable-return-aux-hidden-states`` the logits processor's output
carries ``hidden_states`` (the captured layers, ``[batch tokens, K*H]``) and
``last_hidden_states`` (the last layer after the final norm, ``[batch tokens, H]``; SGLang keeps
it for in-process consumers and never sends it). ``_append_prefill_hidden_states`` in the
scheduler's batch-result processor is the first place where one request's rows meet its rid;
the AROUND hook there reads both tensors for requests that opted in and leaves everything else
to SGLang.

Opt-in, per request, through ``sampling_params.custom_params["hsmon"]``:
- ``{"dump_dir": DIR}``: buffer every chunked-prefill piece (stock SGLang discards the middle
  chunks), then write ``DIR/<rid>.safetensors`` (``dump.write_dump``); nothing big goes back
  over ZMQ/HTTP.
- ``{"pack_last": true}``: ``meta_info.hidden_states[0]`` becomes ``[rows, K*H + H]``, the
  captured layers then the last layer; otherwise stock (chunked prefill still drops rows).
Each opted-in request gets ``meta_info["hsmon"] = [marker]`` through SGLang's customized-info
channel: the file, or the error that prevented it.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from hsmon_sglang_plugin import PLUGIN_VERSION, dump_root, pp_refusal
from hsmon_sglang_plugin.dump import DumpRefused, check_dump_dir, check_rid, write_dump

logger = logging.getLogger("hsmon_sglang_plugin")

_BRP = "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor"
APPEND_PREFILL = f"{_BRP}._append_prefill_hidden_states"
SERVER_INFO = "sglang.srt.utils.common.build_server_info"
# ServerArgs is a msgspec Struct: its __post_init__ is bound when the class is made, so the check
# hooks resolve_once, which every launcher calls before anything is started.
SERVER_ARGS_RESOLVE = "sglang.srt.server_args.ServerArgs.resolve_once"

# rid -> (req, [(aux piece, last piece), ...]): chunked-prefill pieces of dump-mode requests
# still prefilling, on the CPU (one scheduler process owns a request; this dict is per process).
_pending: dict[str, tuple[Any, list[tuple[torch.Tensor, torch.Tensor]]]] = {}
_process_facts: dict[str, Any] = {}


def install() -> None:
    """Register the hooks with SGLang's HookRegistry (called from ``register``)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(SERVER_ARGS_RESOLVE, _refuse_pipeline_parallel, HookType.BEFORE)
    HookRegistry.register(SERVER_INFO, _add_server_info, HookType.AFTER)
    HookRegistry.register(APPEND_PREFILL, _append_prefill_hidden_states, HookType.AROUND)


def _refuse_pipeline_parallel(server_args: Any, *args: Any, **kwargs: Any) -> None:
    refusal = pp_refusal(int(getattr(server_args, "pp_size", 1) or 1))
    if refusal:
        raise SystemExit(refusal)


def _add_server_info(result: dict, *args: Any, **kwargs: Any) -> dict:
    import sglang

    result["hsmon_plugin_version"] = PLUGIN_VERSION
    result["hsmon_plugin"] = {
        "version": PLUGIN_VERSION,
        "sglang_version": sglang.__version__,
        "modes": ["dump", "pack"],
        "dump_root": dump_root(),
    }
    return result


def request_options(req: Any) -> dict | None:
    """The request's ``custom_params["hsmon"]`` dict, or None (the fast path for other traffic)."""
    params = getattr(req.sampling_params, "custom_params", None)
    if not params:
        return None
    options = params.get("hsmon") if isinstance(params, dict) else None
    return options if isinstance(options, dict) else None


def _set_marker(req: Any, marker: dict) -> None:
    # One value per output token is SGLang's convention for customized info; the prefill
    # produces the first output token, so the marker is element 0 of meta_info["hsmon"].
    if req.customized_info is None:
        req.customized_info = {}
    req.customized_info["hsmon"] = [marker]


def _facts() -> dict[str, Any]:
    """Per-process facts, read once: whether this rank writes, the captured layer ids."""
    if not _process_facts:
        import sglang
        from sglang.srt.runtime_context import get_exec, get_parallel

        parallel = get_parallel()
        writer = getattr(parallel, "attn_tp_rank", 0) == 0 and getattr(parallel, "attn_cp_rank", 0) == 0
        layer_ids = get_exec().features.return_aux_hidden_state_layer_ids
        _process_facts.update(
            writer=writer,
            layer_ids=",".join(str(i) for i in layer_ids) if layer_ids else "",
            sglang_version=sglang.__version__,
        )
    return _process_facts


def _append_prefill_hidden_states(original: Any, processor: Any, **kwargs: Any) -> int:
    req = kwargs["req"]
    options = request_options(req)
    if (
        options is None
        or not req.return_hidden_states
        or not kwargs["capture_hidden_mode"].is_full()
        or req.output_ids  # a decode step of this request in a mixed batch: stock
    ):
        return original(processor, **kwargs)
    if options.get("dump_dir") is not None:
        mode = "dump"
    elif options.get("pack_last") is True:
        mode = "pack"
    else:
        return original(processor, **kwargs)
    try:
        if mode == "dump":
            return _dump(options, **kwargs)
        return _pack(original, processor, **kwargs)
    except Exception as exc:  # a plugin bug must fail one request, never the scheduler
        logger.exception("hsmon capture plugin: %s mode failed for request %s", mode, req.rid)
        _pending.pop(req.rid, None)
        _set_marker(req, {"mode": mode, "ok": False, "error": f"plugin error: {exc!r}", "errno": None})
        return kwargs["hidden_state_offset"] + kwargs["extend_input_len"]


def _rows(logits_output: Any, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    last = logits_output.last_hidden_states
    return logits_output.hidden_states[start:end], None if last is None else last[start:end]


_NO_LAST = (
    "the server keeps no last-layer hidden states: start it with --enable-return-aux-hidden-states "
    "--speculative-algorithm EAGLE3 --return-aux-hidden-state-layer-ids ... (hsmon sglang-serve does)"
)


def _pack(original: Any, processor: Any, **kwargs: Any) -> int:
    req = kwargs["req"]
    start = kwargs["hidden_state_offset"]
    end = start + kwargs["extend_input_len"]
    if not kwargs.get("store", True) or req.return_hidden_states is not True:
        return original(processor, **kwargs)  # a middle chunk, or return_hidden_states="last"
    aux, last = _rows(kwargs["logits_output"], start, end)
    if last is None:
        _set_marker(req, {"mode": "pack", "ok": False, "error": _NO_LAST})
        return original(processor, **kwargs)
    packed = torch.cat([aux, last], dim=-1)
    req.hidden_states.append(packed.cpu().tolist())
    _set_marker(req, {"mode": "pack", "ok": True, "rows": packed.shape[0], "width": packed.shape[1]})
    return end


def _dump(options: dict, **kwargs: Any) -> int:
    req = kwargs["req"]
    start = kwargs["hidden_state_offset"]
    end = start + kwargs["extend_input_len"]
    facts = _facts()
    if not facts["writer"]:
        return end  # another rank sends this request's output and writes its file
    rid = req.rid
    middle = not req.finished() and not req.is_retracted and req.inflight_middle_chunks > 0
    if not kwargs.get("store", True) and not middle:
        _pending.pop(rid, None)  # aborted, retracted or discarded: its prefill will not complete
        return end
    aux, last = _rows(kwargs["logits_output"], start, end)
    if last is None:
        _pending.pop(rid, None)
        _set_marker(req, {"mode": "dump", "ok": False, "error": _NO_LAST, "errno": None})
        return end
    # Copies on the CPU: a slice would keep the whole batch's tensor alive (and on the GPU).
    piece = (aux.to("cpu", copy=True), last.to("cpu", copy=True))
    if middle:
        if rid not in _pending or _pending[rid][0] is not req:  # new, or the rid reused by a retry
            _forget_abandoned()
            _pending[rid] = (req, [])
        _pending[rid][1].append(piece)
        return end
    earlier = _pending.pop(rid, (req, []))
    pieces = [*(earlier[1] if earlier[0] is req else []), piece]
    _set_marker(req, _write(req, options, pieces, facts))
    return end


def _forget_abandoned() -> None:
    """Drop the buffers of requests that ended without passing the hook again (an abort handled
    elsewhere in the scheduler), so they cannot accumulate."""
    for rid, (req, _pieces) in list(_pending.items()):
        if req.finished() or req.is_retracted:
            del _pending[rid]


def _write(req: Any, options: dict, pieces: list, facts: dict) -> dict:
    try:
        rid = check_rid(req.rid)
        dump_dir = check_dump_dir(options.get("dump_dir"), dump_root())
    except DumpRefused as exc:
        return {"mode": "dump", "ok": False, "error": str(exc), "errno": None}
    aux = torch.cat([p[0] for p in pieces]) if len(pieces) > 1 else pieces[0][0]
    last = torch.cat([p[1] for p in pieces]) if len(pieces) > 1 else pieces[0][1]
    tokens = len(req.origin_input_ids)
    if aux.shape[0] != tokens:
        return {
            "mode": "dump",
            "ok": False,
            "error": f"captured {aux.shape[0]} rows for a {tokens}-token prompt (is the radix cache on? "
            "start the server with --disable-radix-cache); no file written",
            "errno": None,
        }
    metadata = {
        "rid": rid,
        "tokens": str(tokens),
        "layer_ids": facts["layer_ids"],
        "sglang_version": facts["sglang_version"],
        "plugin_version": PLUGIN_VERSION,
    }
    marker = write_dump(dump_dir, rid, {"hidden_state": last, "aux_hidden_state": aux}, metadata)
    if not marker["ok"]:
        logger.warning("hsmon capture plugin: %s", marker["error"])
    return marker
