"""Where answers come from: transformers' ``generate`` in-process (``hf``, the embedded default) or
SGLang servers (``sglang``, extractor/regenerate/engine_sglang.py). Both take the prompt's token ids
and the answer's seed and give the answer's token ids and why it ended; both sample the same way
(temperature, top-p, no top-k, no repetition penalty, whatever the model's generation config says)
and stop at the same end-of-turn ids.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# tests: a decoding step slow on purpose (seconds per forward, shared with extract's hf backend), so
# that a signal sent once the first rows are written always lands mid-run, whatever the machine
FORWARD_DELAY_ENV = "HSMON_HF_FORWARD_DELAY_S"


@dataclass(frozen=True)
class Sampling:
    """How answers are drawn (the same for every engine)."""

    temperature: float
    top_p: float
    max_new_tokens: int
    stop_ids: tuple[int, ...]

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def record(self) -> dict[str, Any]:
        """For the manifest's provenance and settings."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": None,
                "repetition_penalty": 1.0, "max_new_tokens": self.max_new_tokens,
                "stop_token_ids": list(self.stop_ids)}


@dataclass
class Answer:
    """One generated answer: its token ids (the end-of-turn id included when it stopped there) and
    why it ended: "stop" (an end-of-turn id) or "length" (--max-new-tokens)."""

    ids: list[int]
    finish: str

    def content_ids(self, stop_ids: Sequence[int]) -> list[int]:
        """The answer's own tokens: without the end-of-turn id it stopped at."""
        if self.finish == "stop" and self.ids and self.ids[-1] in stop_ids:
            return self.ids[:-1]
        return self.ids


class HFEngine:
    """transformers in-process: one answer at a time (an answer never depends on which rows were
    batched with it, so a resumed run equals an uninterrupted one)."""

    name = "hf"
    concurrency = 1
    drains_on_stop = True  # a stop waits for the step in progress (extractor/regenerate/run.py)

    def __init__(self, model_dir: Path, sampling: Sampling, device: str, dtype: Any, pad_id: int | None,
                 stop_event: threading.Event) -> None:
        from extractor.backends.hf_load import load_target

        self.sampling, self.device, self.stop_event = sampling, device, stop_event
        model, _ = load_target(model_dir, dtype)
        self.model = model.eval().to(device)
        self.pad_id = pad_id if pad_id is not None else sampling.stop_ids[0]
        self.max_positions = int(getattr(getattr(model.config, "text_config", None) or model.config,
                                         "max_position_embeddings", 0) or 1 << 20)
        self._delay = float(os.environ.get(FORWARD_DELAY_ENV) or 0)

    def generate(self, prompt: list[int], seed: int, row: int) -> Answer | None:
        """The answer to ``prompt``; None when a stop was requested while it was drawn."""
        import torch
        from transformers import GenerationConfig, StoppingCriteriaList

        s = self.sampling
        config = GenerationConfig(
            do_sample=not s.greedy, temperature=s.temperature if not s.greedy else None,
            top_p=s.top_p if not s.greedy else None, top_k=0 if not s.greedy else None,
            repetition_penalty=1.0, max_new_tokens=s.max_new_tokens, eos_token_id=list(s.stop_ids),
            pad_token_id=self.pad_id)
        ids = torch.tensor([prompt], device=self.device)
        if not s.greedy:
            torch.manual_seed(seed)
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                      generation_config=config,
                                      stopping_criteria=StoppingCriteriaList([self._stop_check]))
        if self.stop_event.is_set():
            return None
        new = out[0, len(prompt):].tolist()
        finish = "stop" if new and new[-1] in s.stop_ids else "length"
        return Answer(new, finish)

    def _stop_check(self, input_ids: Any, scores: Any, **_: Any) -> Any:
        """transformers' stopping criterion: a stop request ends the answer at once (it is dropped);
        the tests' slow step (HSMON_HF_FORWARD_DELAY_S) sleeps here, once per forward."""
        import torch

        if self._delay:
            time.sleep(self._delay)
        return torch.full((input_ids.shape[0],), self.stop_event.is_set(), dtype=torch.bool,
                          device=input_ids.device)

    def describe(self) -> dict[str, Any]:
        return {}

    def provenance(self) -> dict[str, Any]:
        import torch
        import transformers

        return {"engine": "transformers", "release": transformers.__version__, "torch": torch.__version__,
                "device": self.device, "dtype": str(self.model.dtype).removeprefix("torch."),
                "deterministic": True}

    def close(self) -> None:
        return None
