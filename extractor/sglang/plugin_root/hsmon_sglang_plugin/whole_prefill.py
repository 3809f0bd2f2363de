"""Adapter ``whole-prefill`` (SGLang 0.5.14, the release SpecForge pins): ``layer-capture`` with
chunked prefill off.

0.5.14's scheduler calls ``_append_prefill_hidden_states(req, logits_output, hidden_state_offset)``
only for a finished prefill (``managers/scheduler_components/batch_result_processor.py``); the
middle pieces of a chunked prefill go down its "being chunked" branch past every hook, so rows
== tokens holds only when no prompt is chunked. The server therefore refuses to start unless
``--chunked-prefill-size -1`` (SpecForge's own recipes for the largest targets run so); then
every prompt is one piece, and this hook hands it to the shared one with the arguments that
0.5.18's per-piece hook passes (the piece is the whole prompt, stored, in full capture mode).
"""

from __future__ import annotations

from typing import Any

REFUSAL = ("hsmon capture plugin: SGLang {version} drops the middle pieces of a chunked prefill before "
           "any hook; serve it with chunked prefill off: --chunked-prefill-size -1 (hsmon sglang-serve ... "
           "-- --chunked-prefill-size -1), or use SGLang 0.5.18 or later (chunked prefill {size} given)")


class _Full:
    """The capture mode 0.5.14 does not pass: it calls the hook only when hidden states are kept."""

    @staticmethod
    def is_full() -> bool:
        return True


def refusal(chunked_prefill_size: Any, version: str) -> str | None:
    """One line refusing a server that may chunk a prompt, or None (``-1``: chunked prefill off)."""
    if chunked_prefill_size is not None and int(chunked_prefill_size) <= 0:
        return None
    return REFUSAL.format(version=version, size=chunked_prefill_size if chunked_prefill_size else "unset")


def refuse_setup(refuse_pp: Any) -> Any:
    """The start-up check of ``layer-capture`` (pipeline parallelism) plus chunked prefill off."""
    def check(server_args: Any) -> None:
        import sglang

        refuse_pp(server_args)
        line = refusal(getattr(server_args, "chunked_prefill_size", None), sglang.__version__)
        if line:
            raise SystemExit(line)
    return check


PREFILL_RESULT = ("sglang.srt.managers.scheduler_components.batch_result_processor."
                  "SchedulerBatchResultProcessor.process_batch_result_prefill")
_starts: dict[int, int] = {}  # id(req) -> its first row in the batch's hidden states (one scheduler thread)


def record_starts(processor: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``process_batch_result_prefill(batch, result)``: where each request's rows start.

    0.5.14 moves ``hidden_state_offset`` on only past requests that return hidden states, while
    the batch's hidden states hold every request's rows (full capture mode): a request without
    them earlier in the batch would shift the rows of every one after it. Each request's start
    is the sum of the extend lengths before it (``req.extend_input_len``, set when the batch was
    scheduled: the whole prompt, with no prefix cache and no chunking)."""
    batch = kwargs.get("batch", args[0] if args else None)
    _starts.clear()
    offset = 0
    for req in getattr(batch, "reqs", None) or []:
        _starts[id(req)] = offset
        offset += getattr(req, "extend_input_len", 0) or len(req.origin_input_ids)


def adapt(hook: Any) -> Any:
    """The shared AROUND hook, called with what 0.5.14's call lacks (the piece is the prompt) and
    the request's own start (``record_starts``)."""
    def whole(original: Any, processor: Any, **kwargs: Any) -> int:
        req = kwargs["req"]
        kwargs = {**kwargs, "hidden_state_offset": _starts.get(id(req), kwargs["hidden_state_offset"])}
        full = {**kwargs, "extend_input_len": len(req.origin_input_ids), "capture_hidden_mode": _Full(),
                "store": True, "whole_prefill": True}
        return hook(lambda proc, **kw: original(proc, **kwargs), processor, **full)
    return whole
