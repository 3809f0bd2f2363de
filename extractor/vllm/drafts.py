"""`hsmon vllm-serve --draft DIR`: vLLM's EAGLE-3 speculative decoding from an hsmon export.

vLLM loads a SpecForge-layout drafter as it is (``LlamaForCausalLMEagle3``, ``d2t``/``t2d``) and reads
``eagle_config.eagle_aux_hidden_state_layer_ids`` in its own convention (point = id): an export
written for SGLang (``hsmon_capture.engine``) is served from a converted copy
(extractor/drafter_ids.py), so vLLM feeds the drafter the points it was trained on.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from extractor.drafter_ids import DrafterIdsError, for_engine
from extractor.sglang.speculative import DraftError, check_draft

DEFAULT_DRAFT_TOKENS = 4

__all__ = ["DEFAULT_DRAFT_TOKENS", "DraftError", "speculative_config"]


def speculative_config(draft: Path, draft_tokens: int, target: Path) -> dict[str, Any]:
    """vLLM's ``--speculative-config`` for ``draft`` at ``draft_tokens`` tokens per verify (a chain of
    ``draft_tokens - 1`` drafts); DraftError in one line for a directory vLLM cannot serve."""
    if draft_tokens < 2:
        raise DraftError(f"--draft-tokens {draft_tokens}: at least 2 (the verified token and one draft)")
    check_draft(draft)
    try:
        served, note = for_engine(draft.resolve(), "vllm", target)
    except DrafterIdsError as exc:
        raise DraftError(str(exc)) from None
    if note:
        print(f"hsmon vllm-serve: {note}", file=sys.stderr, flush=True)
    return {"method": "eagle3", "model": str(served), "num_speculative_tokens": draft_tokens - 1}
