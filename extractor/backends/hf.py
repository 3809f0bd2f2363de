"""Backend `hf`: any local Hugging Face causal LM (or a multimodal wrapper's text decoder, e.g.
Kimi-K2.5: ``hf_load.py``), run in-process with transformers.

Rows are right-padded into one batch. With causal attention a valid position never attends to
a later one, so right padding cannot change the valid positions; the attention mask is passed
anyway so that the result equals an unbatched forward for any architecture. Only the decoder
runs (no LM head): the vocabulary projection is not needed for hidden states.

Capture points are read with forward hooks on the decoder layers (point ``p`` = output of
layer ``p - 1`` = ``hidden_states[p]``), so the other layers' outputs are never kept.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from extractor.backends.base import Backend, ModelInfo, RowRejected, RowStates
from hsmon.contracts.rejects import BACKEND_FAILED

# tests: an engine slow on purpose (seconds per forward), so that a signal sent once the first rows
# are written always lands mid-run, whatever the machine's speed
FORWARD_DELAY_ENV = "HSMON_HF_FORWARD_DELAY_S"
PROBE_TOKENS = 8  # a row that fails alone is rejected only if its first tokens go through

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when a GPU is visible, else 'cpu'."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA device is visible (use --device cpu)")
    return device


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """'auto' -> bfloat16 on a GPU, float32 on CPU (bf16 matmuls are slow on most CPUs)."""
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: use auto, float32 (fp32), bfloat16 (bf16) or float16")
    return DTYPES[dtype]


def text_config(config: Any) -> Any:
    """The language model's config (multimodal configs nest it)."""
    return getattr(config, "text_config", None) or config


def model_facts(config: Any) -> tuple[int, int, int, int]:
    """(num_layers, hidden_size, vocab_size, max_positions) of a transformers config."""
    cfg = text_config(config)
    return (int(cfg.num_hidden_layers), int(cfg.hidden_size), int(cfg.vocab_size),
            int(getattr(cfg, "max_position_embeddings", 0) or 1 << 20))


class HFBackend(Backend):
    """Transformers in-process, CPU or GPU, any dtype."""

    name = "hf"

    def __init__(self, model_dir: str | Path, capture_points: Sequence[int] | None = None,
                 device: str = "auto", dtype: str = "auto") -> None:
        from extractor.backends.hf_load import load_target
        from hsmon.contracts.capture_points import default_capture_points

        self.device = resolve_device(device)
        self.torch_dtype = resolve_dtype(dtype, self.device)
        model, decoder = load_target(model_dir, self.torch_dtype)
        model.eval().to(self.device)
        self.model = model
        self.decoder = decoder
        num_layers, hidden, vocab, max_pos = model_facts(model.config)
        dtype_name = str(self.torch_dtype).removeprefix("torch.")
        self.info = ModelInfo(num_layers, hidden, vocab, max_pos, dtype_name, self.device)
        self.capture_points = list(capture_points or default_capture_points(num_layers))
        self._captured: dict[int, torch.Tensor] = {}
        layers = self.decoder.layers
        self._hooks = [layers[p - 1].register_forward_hook(self._make_hook(p)) for p in self.capture_points]

    def _make_hook(self, point: int) -> Any:
        def hook(_module: Any, _inputs: Any, output: Any) -> None:
            self._captured[point] = output[0] if isinstance(output, tuple) else output
        return hook

    def _padded(self, batch: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor | None, list[int]]:
        lengths = [len(r) for r in batch]
        longest = max(lengths)
        ids = torch.zeros((len(batch), longest), dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for i, row in enumerate(batch):
            ids[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
            mask[i, : len(row)] = 1
        attention = None if min(lengths) == longest else mask.to(self.device)
        return ids.to(self.device), attention, lengths

    @torch.inference_mode()
    def bare_forward(self, batch: Sequence[Sequence[int]]) -> torch.Tensor:
        """The decoder's forward pass alone (the benchmark's baseline); returns the last layer."""
        ids, attention, _ = self._padded(batch)
        out = self.decoder(input_ids=ids, attention_mask=attention, use_cache=False)
        self._captured.clear()
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        return out.last_hidden_state

    def extract(self, batch: Sequence[Sequence[int]],
                rows: Sequence[int] | None = None) -> list[RowStates | RowRejected]:
        """The batch in one forward; if that raises (e.g. out of memory on one long row), each row
        alone: a row that still fails is rejected when the model demonstrably works (another row
        of the batch went through, or the failing row's first tokens do); else the error is raised
        (a broken model or device is not one row's fault, and rejecting every row loses data)."""
        try:
            return list(self._forward(batch))
        except Exception as exc:
            first = exc
        self._release()
        results: list[RowStates | RowRejected] = []
        failed: list[tuple[int, BaseException]] = []
        for i, row in enumerate(batch):
            try:
                results.extend(self._forward([row]))
            except Exception as exc:
                self._release()
                results.append(RowRejected(""))
                failed.append((i, exc))
        if not failed:
            return results
        if len(failed) == len(batch) and not self._probe(batch[failed[0][0]]):
            raise first
        for i, exc in failed:
            message = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            results[i] = RowRejected(f"{BACKEND_FAILED} ({len(batch[i])} tokens): {message}")
        return results

    def _probe(self, row: Sequence[int]) -> bool:
        """Does the model compute at all? The row's first few tokens, alone."""
        try:
            self._forward([row[: max(1, min(PROBE_TOKENS, len(row) // 2))]])
            return True
        except Exception:
            self._release()
            return False

    def _release(self) -> None:
        """Forget a failed forward's captures and give its memory back (CUDA keeps a cache)."""
        self._captured.clear()
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()

    @torch.inference_mode()
    def _forward(self, batch: Sequence[Sequence[int]]) -> list[RowStates]:
        if delay := float(os.environ.get(FORWARD_DELAY_ENV) or 0):
            time.sleep(delay)
        ids, attention, lengths = self._padded(batch)
        self._captured.clear()
        out = self.decoder(input_ids=ids, attention_mask=attention, use_cache=False)
        last = out.last_hidden_state
        captures = [self._captured[p] for p in self.capture_points]
        self._captured.clear()
        rows = []
        for i, n in enumerate(lengths):
            # clone: a slice would keep (and torch.save would write) the whole batch's storage
            hidden = last[i, :n].to("cpu", copy=True)
            aux = torch.cat([c[i, :n] for c in captures], dim=-1).to("cpu")
            rows.append(RowStates(hidden, aux))
        return rows

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
