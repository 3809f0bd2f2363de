"""Real SGLang servers on CPU that decode speculatively (`hsmon sglang-serve --draft`), for tests.

The CPU path runs SGLang's EAGLE worker on hsmon's sgl-kernel stand-in (tests/sglang_stubs); it is
a test device only. Drafters: the shipped reference drafter (EAGLE 3, hsmon/demo/reference-drafter),
an EAGLE 3.1 export of the same recipe (tests/fixtures/eagle31-drafter), and a degraded copy of
the reference (its weights scrambled, its recorded training-time estimate kept: a drafter swapped
for a worse one under the same export). Module-scoped: one of each per test module that asks.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from sglang_server import EMBEDDED_MODEL, SGLangServer

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_DRAFTER = ROOT / "hsmon" / "demo" / "reference-drafter"
EAGLE31_DRAFTER = ROOT / "tests" / "fixtures" / "eagle31-drafter"
DRAFT_TOKENS = 4  # 3 drafted per verify: the depth the figures are stated at


def scrambled_copy(source: Path, out: Path, seed: int = 0) -> Path:
    """``source`` with every weight matrix's rows permuted (same shapes, same config.json and
    estimate, the vocabulary maps kept): it loads and drafts, but drafts badly."""
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(source / "config.json", out / "config.json")
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, tensor in load_file(source / "model.safetensors").items():
        if tensor.dim() == 2 and name not in ("d2t", "t2d"):
            tensor = tensor[torch.randperm(tensor.shape[0], generator=gen)].contiguous()
        tensors[name] = tensor
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def spec_server(workdir: Path, drafter: Path, model: Path = EMBEDDED_MODEL,
                extra: tuple[str, ...] = ()) -> SGLangServer:
    """A speculative server (not started): the drafter, DRAFT_TOKENS per verify, /metrics on."""
    return SGLangServer(Path(model), workdir, serve_args=("--draft", str(drafter), "--draft-tokens",
                                                          str(DRAFT_TOKENS)), extra_args=extra)


def greedy_ids(server: SGLangServer, prompt_ids: list[int], max_new: int) -> tuple[list[int], dict]:
    """The server's greedy continuation of ``prompt_ids`` (token ids) and its meta_info."""
    out = server.generate({"input_ids": prompt_ids, "sampling_params": {
        "temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}}, timeout=300)
    return list(out["output_ids"]), out["meta_info"]


def drafter_estimate(drafter: Path, depth: int) -> float:
    """The export's recorded training-time acceptance estimate at ``depth``."""
    estimate = json.loads((drafter / "config.json").read_text())["hsmon_estimate"]
    return float(estimate["accept_length"][str(depth)])


class ServerPool:
    """Named servers started on first use and stopped when released (or at the end): a module's
    tests share them, and no more run at once than the tests in progress need (each is ~2 GB)."""

    def __init__(self, factories: dict) -> None:
        self.factories, self.running = factories, {}

    def get(self, name: str) -> SGLangServer:
        if name not in self.running:
            self.running[name] = self.factories[name]().start()
        return self.running[name]

    def start_together(self, *names: str) -> list[SGLangServer]:
        """Launch the missing ones side by side, then wait for each (their start-ups overlap)."""
        fresh = {n: self.factories[n]().launch() for n in names if n not in self.running}
        for name, server in fresh.items():
            self.running[name] = server.wait_ready()
        return [self.running[n] for n in names]

    def release(self, *names: str) -> None:
        for name in names:
            server = self.running.pop(name, None)
            if server is not None:
                server.stop()

    def close(self) -> None:
        self.release(*list(self.running))
