"""An exported drafter drafts the same in SGLang's own model class as in hsmon, per architecture."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from sglang_helpers import sglang_draft_logits

from trainer.export import export_checkpoint
from trainer.model import ARCHS, DrafterConfig, Eagle3Drafter

SEQ, DEPTH = 9, 4


def random_drafter(arch: str) -> Eagle3Drafter:
    """A small drafter with random weights (norms off 1, a draft vocabulary that is a subset)."""
    cfg = DrafterConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=8, vocab_size=50, draft_vocab_size=40, num_aux=3)
    cfg.set_arch(arch)
    torch.manual_seed(1)
    drafter = Eagle3Drafter(cfg)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
        keep = torch.arange(50)[torch.randperm(50)[:40]].sort().values
        t2d = torch.zeros(50, dtype=torch.bool)
        t2d[keep] = True
        drafter.set_vocab(keep - torch.arange(40), t2d)
    return drafter.eval()


@pytest.fixture(scope="module")
def drafted(tmp_path_factory):
    """Per architecture: (hsmon's drafter, its inputs, SGLang's logits per step from its export),
    both exports drafted by one SGLang process."""
    base = tmp_path_factory.mktemp("forward")
    generator = torch.Generator().manual_seed(2)
    cases, runs = {}, []
    for arch in sorted(ARCHS):
        drafter = random_drafter(arch)
        state = {"model": drafter.state_dict(), "drafter_config": drafter.cfg.to_dict()}
        torch.save(state, base / f"{arch}.pt")
        export = export_checkpoint(base / f"{arch}.pt", base / arch, "float32")
        scale = torch.tensor([1.0, 4.0, 20.0]).repeat_interleave(32)  # upper layers larger, as in a target
        inputs = {"aux": torch.randn(SEQ, 96, generator=generator) * scale,
                  "ids": torch.randint(0, 50, (SEQ + DEPTH - 1,), generator=generator),
                  "embed": drafter.embed_tokens.weight.detach()}
        cases[arch] = (drafter, export, inputs)
        runs.append((export, inputs))
    logits = sglang_draft_logits(runs, base)
    return {arch: (*cases[arch], theirs) for arch, theirs in zip(sorted(ARCHS), logits, strict=True)}


@pytest.mark.sglang
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_sglang_forward_of_the_export_equals_hsmons(arch, drafted):
    drafter, export, inputs, theirs = drafted[arch]
    config = json.loads((export / "config.json").read_text())
    assert (config["fc_norm"], config["norm_output"]) == ARCHS[arch]
    with safe_open(str(export / "model.safetensors"), framework="pt") as fh:
        assert ("fc_norm.0.weight" in fh.keys()) is ARCHS[arch][0]  # noqa: SIM118 (no dict)
    aux, ids = inputs["aux"], inputs["ids"]
    # hsmon's decode: the same draft extend, then one position at a time
    index = torch.arange(SEQ)
    cache: list = []
    with torch.no_grad():
        hidden, logits = drafter.step(ids[None, :SEQ], drafter.project(aux[None]), index, index, cache)
        ours = [logits[0]]
        hidden, last = hidden[:, -1:], index[-1:]
        for i in range(1, DEPTH):
            hidden, logits = drafter.step(ids[SEQ - 1 + i].view(1, 1), hidden, last + i, last, cache)
            ours.append(logits[0])
        unrolled = drafter.ttt_logits(aux[None], ids[None], DEPTH)  # what training optimises
    assert len(theirs) == DEPTH
    for i in range(DEPTH):
        torch.testing.assert_close(theirs[i], ours[i], atol=1e-4, rtol=0)
        torch.testing.assert_close(unrolled[i][0, -1], ours[i][-1], atol=1e-4, rtol=0)
    # the check can fail: fed the other state (pre- vs post-norm), hsmon's third step would differ
    drafter.cfg.norm_output = not drafter.cfg.norm_output
    with torch.no_grad():
        flipped = drafter.ttt_logits(aux[None], ids[None], DEPTH)
    drafter.cfg.norm_output = not drafter.cfg.norm_output
    assert (flipped[2][0, -1] - theirs[2][0]).abs().max() > 1e-3
