"""The hooks inside SGLang (registered by ``install``, applied by SGLang's plugin loader).

This module's hooks are adapter ``aux-return`` (0.5.23); adapter ``layer-capture`` (0.5.18,
``layer_capture.py``) makes the logits output carry the same two tensors, then shares
``_append_prefill_hidden_states`` and everything after it.

Where the data is: with ``--enable-return-aux-hidden-states`` the logits processor's output
carries ``hidden_states`` (the captured layers, ``[batch tokens, K*H]``) and
``last_hidden_states`` (the last layer after the final norm, ``[batch tokens, H]``; SGLang keeps
it for in-process consumers and never sends it). ``_append_prefill_hidden_states`` in the
scheduler's batch-result processor is the first place where one request's rows meet its rid;
the AROUND hook there reads both tensors for requests that opted in and leaves everything else
to SGLang.

Opt-in, per request, through ``sampling_params.custom_params["hsmon"]``:
- ``{"dump_dir": DIR}``: hold every chunked-prefill piece as it passes (views on CPU, copies
  on CUDA; stock SGLang discards the middle chunks); when the last piece is in, hand the request
  to the writer thread (``writer.py``), which writes ``DIR/<rid>.safetensors`` (or
  ``DIR/<rid>.error``) off the scheduler's thread. The response may come before the file: the
  marker says where it will be.
- ``{"pack_last": true}``: every piece is kept too; ``meta_info.hidden_states[0]`` becomes the
  whole row, ``[rows, K*H + H]``, the captured layers then the last layer.
Each opted-in request gets ``meta_info["hsmon"] = [marker]`` through SGLang's customized-info
channel: the file (to come), or the error that prevented it. The time spent in the hook per
request and the writer's counters are in /server_info (``internal_states[i]["hsmon_capture"]``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from hsmon_sglang_plugin import PLUGIN_VERSION, TESTED_SGLANG_VERSIONS, dump_root, pp_refusal
from hsmon_sglang_plugin.dump import DumpRefused, check_rid, error_path, final_path, held_dump_dir
from hsmon_sglang_plugin.features import AUX_RETURN, LAYER_CAPTURE, WHOLE_PREFILL
from hsmon_sglang_plugin.writer import Job, Piece, get_writer

logger = logging.getLogger("hsmon_sglang_plugin")

_BRP = "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor"
APPEND_PREFILL = f"{_BRP}._append_prefill_hidden_states"
SERVER_INFO = "sglang.srt.utils.common.build_server_info"
INTERNAL_STATE = (
    "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController.get_internal_state"
)
# ServerArgs is a msgspec Struct: its __post_init__ is bound when the class is made, so the check
# hooks resolve_once, which every launcher calls before anything is started.
SERVER_ARGS_RESOLVE = "sglang.srt.server_args.ServerArgs.resolve_once"


@dataclass
class Pending:
    """The pieces of one request still prefilling (one scheduler process owns a request)."""

    req: Any
    pieces: list[Piece] = field(default_factory=list)
    hook_s: float = 0.0  # time spent in the hook for this request so far (wall)
    hook_cpu_s: float = 0.0  # of which on this thread's CPU (the rest: waiting for the GIL or a core)


_pending: dict[str, Pending] = {}
_process_facts: dict[str, Any] = {}


def install(adapter: str = AUX_RETURN) -> None:
    """Register the hooks with SGLang's HookRegistry (called from ``register``): the adapter's
    own (``layer_capture.py`` for ``layer-capture``), then the batch-result hook both share."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    _process_facts["adapter"] = adapter
    if adapter in (LAYER_CAPTURE, WHOLE_PREFILL):
        from hsmon_sglang_plugin import layer_capture, whole_prefill

        whole = adapter == WHOLE_PREFILL
        layer_capture.install(HookRegistry.register, HookType, _add_server_info, _add_internal_state,
                              whole_prefill.refuse_setup(_refuse_pipeline_parallel) if whole
                              else _refuse_pipeline_parallel)
        HookRegistry.register(APPEND_PREFILL, whole_prefill.adapt(_append_prefill_hidden_states) if whole
                              else _append_prefill_hidden_states, HookType.AROUND)
        if whole:
            HookRegistry.register(whole_prefill.PREFILL_RESULT, whole_prefill.record_starts, HookType.BEFORE)
        return
    from hsmon_sglang_plugin import capture_rule

    capture_rule.install(HookRegistry.register, HookType)
    HookRegistry.register(SERVER_ARGS_RESOLVE, _refuse_pipeline_parallel, HookType.BEFORE)
    HookRegistry.register(SERVER_INFO, _add_server_info, HookType.AFTER)
    HookRegistry.register(INTERNAL_STATE, _add_internal_state, HookType.AFTER)
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
        "adapter": _process_facts.get("adapter", AUX_RETURN),
        "tested": sglang.__version__ in TESTED_SGLANG_VERSIONS,
        "dump_root": dump_root(),
    }
    dtype = _model_dtype()
    if dtype is not None:  # server_info's own "dtype" is the flag ("auto"), not what it resolved to
        result["hsmon_plugin"]["dtype"] = dtype
    if _process_facts.get("adapter") in (LAYER_CAPTURE, WHOLE_PREFILL):  # no SGLang flag holds them
        from hsmon_sglang_plugin.layer_capture import layer_ids

        result["hsmon_plugin"]["layer_ids"] = ",".join(str(i) for i in layer_ids())
    from hsmon_sglang_plugin.capture_rule import fold_into

    fold_into(result["hsmon_plugin"], result)  # model_class, layer_ids, captured_points
    return result


def _model_dtype() -> str | None:
    """The dtype the server computes in, as SGLang resolved it (``--dtype auto`` of a float32
    config is float16): the HTTP server's model config; None where this release keeps it elsewhere."""
    try:
        from sglang.srt.entrypoints.http_server import _global_state

        dtype = _global_state.tokenizer_manager.model_config.dtype
    except Exception:  # an older or newer release: the client falls back to the rule
        return None
    return str(dtype).removeprefix("torch.") if dtype is not None else None


def _add_internal_state(result: Any, *args: Any, **kwargs: Any) -> Any:
    """This scheduler's capture counters, under ``internal_states[i]["hsmon_capture"]``.

    Every TP rank answers the request, but only the rank that sends output reaches
    /server_info: with ``HSMON_PLUGIN_RANK_STATS=DIR`` (bench/plugin_hook.py) each rank also
    writes its counters to ``DIR/tp<rank>.json``, so the ranks that do not write can be read."""
    state = getattr(result, "internal_state", None)
    if isinstance(state, dict):
        state["hsmon_capture"] = snapshot = get_writer().snapshot()
        stats_dir = os.environ.get(RANK_STATS_ENV)
        if stats_dir:
            _write_rank_stats(stats_dir, snapshot)
    return result


RANK_STATS_ENV = "HSMON_PLUGIN_RANK_STATS"


def _write_rank_stats(stats_dir: str, snapshot: dict) -> None:
    facts = _facts()
    path = os.path.join(stats_dir, f"tp{facts['tp_rank']}.json")
    with contextlib.suppress(OSError):
        with open(path + ".tmp", "w") as fh:
            json.dump({"tp_rank": facts["tp_rank"], "writer": facts["writer"], **snapshot}, fh)
        os.replace(path + ".tmp", path)


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
    if "writer" not in _process_facts:
        import sglang
        from sglang.srt.runtime_context import get_parallel

        parallel = get_parallel()
        writer = getattr(parallel, "attn_tp_rank", 0) == 0 and getattr(parallel, "attn_cp_rank", 0) == 0
        from hsmon_sglang_plugin.capture_rule import current

        capture = current()
        if capture is not None:  # what the model was given and really captures
            layer_ids, points = capture.layer_ids, capture.captured_points
        elif _process_facts.get("adapter") in (LAYER_CAPTURE, WHOLE_PREFILL):
            from hsmon_sglang_plugin.layer_capture import layer_ids as env_layer_ids

            layer_ids, points = env_layer_ids(), []
        else:
            from sglang.srt.runtime_context import get_exec  # 0.5.18 on

            layer_ids, points = get_exec().features.return_aux_hidden_state_layer_ids, []
        logger.warning("hsmon capture plugin: tp rank %s %s", getattr(parallel, "tp_rank", "?"),
                       "writes the dumps" if writer else "does not write (attention-TP rank 0 does)")
        _process_facts.update(
            writer=writer,
            tp_rank=getattr(parallel, "tp_rank", 0),
            layer_ids=",".join(str(i) for i in layer_ids) if layer_ids else "",
            captured_points=",".join(str(p) for p in points),
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
        or (req.output_ids and not kwargs.get("whole_prefill"))  # a decode step in a mixed batch: stock
    ):
        return original(processor, **kwargs)
    if options.get("dump_dir") is not None:
        mode = "dump"
    elif options.get("pack_last") is True and req.return_hidden_states is True:
        mode = "pack"
    else:
        return original(processor, **kwargs)
    started = (time.perf_counter(), time.thread_time())
    try:
        return _capture(mode, options, started, **kwargs)
    except Exception as exc:  # a plugin bug must fail one request, never the scheduler
        logger.exception("hsmon capture plugin: %s mode failed for request %s", mode, req.rid)
        _drop(req.rid)
        _set_marker(req, {"mode": mode, "ok": False, "error": f"plugin error: {exc!r}", "errno": None})
        return kwargs["hidden_state_offset"] + kwargs["extend_input_len"]


def _rows(logits_output: Any, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    last = getattr(logits_output, "last_hidden_states", None)  # set by layer_capture on 0.5.18
    return logits_output.hidden_states[start:end], None if last is None else last[start:end]


_NO_LAST = (
    "the server keeps no last-layer hidden states: start it with --enable-return-aux-hidden-states "
    "--speculative-algorithm EAGLE3 --return-aux-hidden-state-layer-ids ... (hsmon sglang-serve does)"
)


def _drop(rid: str) -> None:
    pending = _pending.pop(rid, None)
    if pending is not None:
        get_writer().release(pending.pieces)


def _capture(mode: str, options: dict, started: tuple[float, float], **kwargs: Any) -> int:
    """Copy this piece to the host; on the last piece, finish the request (dump or pack)."""
    req = kwargs["req"]
    start = kwargs["hidden_state_offset"]
    end = start + kwargs["extend_input_len"]
    if not _facts()["writer"]:
        # another rank sends this request's output (and writes its file, or packs its rows):
        # nothing is read or copied here, the time of this early return is all this rank pays
        get_writer().record_hook("not-writer", time.perf_counter() - started[0], 0,
                                 time.thread_time() - started[1])
        return end
    rid = req.rid
    middle = not req.finished() and not req.is_retracted and req.inflight_middle_chunks > 0
    if not kwargs.get("store", True) and not middle:
        _drop(rid)  # aborted, retracted or discarded: its prefill will not complete
        return end
    aux, last = _rows(kwargs["logits_output"], start, end)
    if last is None:
        _drop(rid)
        _set_marker(req, {"mode": mode, "ok": False, "error": _NO_LAST, "errno": None})
        return end
    writer = get_writer()
    if rid not in _pending or _pending[rid].req is not req:  # new, or the rid reused by a retry
        _drop(rid)
        _forget_abandoned()
        _pending[rid] = Pending(req)
    pending = _pending[rid]
    # dump: views on CPU (the pool counts the batch tensors they keep alive), pinned copies on
    # CUDA; pack's rows go into the response on this thread anyway: the synchronous copy
    pending.pieces.append(writer.hold(aux, last, kwargs["logits_output"],
                                      force_sync=mode == "pack" or _old_path(options)))
    if middle:
        pending.hook_s += time.perf_counter() - started[0]
        pending.hook_cpu_s += time.thread_time() - started[1]
        return end
    del _pending[rid]
    if mode == "pack":
        marker, path = _pack(req, pending.pieces), "pack"
        writer.release(pending.pieces)
    else:
        marker, path = _dump(req, options, pending.pieces)
    _set_marker(req, marker)
    writer.record_hook(path, pending.hook_s + time.perf_counter() - started[0],
                       sum(p.nbytes for p in pending.pieces),
                       pending.hook_cpu_s + time.thread_time() - started[1])
    return end


def _pack(req: Any, pieces: list[Piece]) -> dict:
    aux = torch.cat([p.aux for p in pieces]) if len(pieces) > 1 else pieces[0].aux
    last = torch.cat([p.last for p in pieces]) if len(pieces) > 1 else pieces[0].last
    packed = torch.cat([aux, last], dim=-1)
    req.hidden_states.append(packed.tolist())
    return {"mode": "pack", "ok": True, "rows": packed.shape[0], "width": packed.shape[1]}


def _old_path(options: dict) -> bool:
    """``{"sync_write": true}``: copy and write on the scheduler's thread, as before the writer
    thread (kept for bench/plugin_hook.py's before/after comparison in one run)."""
    return options.get("sync_write") is True


def _forget_abandoned() -> None:
    """Drop the buffers of requests that ended without passing the hook again (an abort handled
    elsewhere in the scheduler), so they cannot accumulate."""
    for rid, pending in list(_pending.items()):
        if pending.req.finished() or pending.req.is_retracted:
            _drop(rid)


def _dump(req: Any, options: dict, pieces: list[Piece]) -> tuple[dict, str]:
    """The request's marker, and which path took it ("async", "sync" or "fallback")."""
    writer = get_writer()
    try:
        rid = check_rid(req.rid)
        dump_dir, dir_fd = held_dump_dir(options.get("dump_dir"), dump_root())
    except DumpRefused as exc:
        writer.release(pieces)
        return {"mode": "dump", "ok": False, "error": str(exc), "errno": None}, "refused"
    rows = sum(p.aux.shape[0] for p in pieces)
    tokens = len(req.origin_input_ids)
    if rows != tokens:
        writer.release(pieces)
        os.close(dir_fd)
        return {
            "mode": "dump",
            "ok": False,
            "error": f"captured {rows} rows for a {tokens}-token prompt (is the radix cache on? "
            "start the server with --disable-radix-cache); no file written",
            "errno": None,
        }, "refused"
    facts = _facts()
    metadata = {
        "rid": rid,
        "tokens": str(tokens),
        "layer_ids": facts["layer_ids"],
        "captured_points": facts["captured_points"],
        "sglang_version": facts["sglang_version"],
        "plugin_version": PLUGIN_VERSION,
    }
    sync = writer.sync or _old_path(options)
    path = "sync" if sync else ("async" if all(p.pooled for p in pieces) else "fallback")
    done = writer.submit(Job(rid, dump_dir, pieces, metadata, dir_fd), sync=sync)
    if done is not None:
        if not done["ok"]:
            logger.warning("hsmon capture plugin: %s", done["error"])
        return done, path
    return {
        "mode": "dump",
        "ok": True,
        "file": final_path(dump_dir, rid),
        "error_file": error_path(dump_dir, rid),
        "tokens": tokens,
        "tensor_bytes": sum(p.nbytes for p in pieces),
        "queued": True,
    }, path
