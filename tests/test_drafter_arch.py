"""EAGLE 3 and EAGLE 3.1 drafters (trainer/model.py): the training unroll drafts as decode does."""

from __future__ import annotations

import pytest
import torch

from trainer.model import ARCHS, DrafterConfig, Eagle3Drafter


def tiny(arch: str) -> Eagle3Drafter:
    cfg = DrafterConfig(hidden_size=16, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=4, vocab_size=40, draft_vocab_size=40, num_aux=3)
    cfg.set_arch(arch)
    torch.manual_seed(0)
    drafter = Eagle3Drafter(cfg).double()
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name.endswith("norm.weight") or ".fc_norm." in name or "layernorm" in name:
                p.uniform_(0.5, 1.5)  # norms that are not the identity
    return drafter


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_ttt_unroll_equals_the_decode_chain(arch):
    """Step i of the unroll at the last position equals drafting i tokens past that prefix one
    step at a time (the post-norm state fed on with eagle3.1's norm_output)."""
    drafter = tiny(arch)
    assert drafter.cfg.arch == arch
    seq, length = 6, 4
    aux = torch.randn(1, seq, 48, dtype=torch.float64) * 3
    next_ids = torch.randint(0, 40, (1, seq + length - 1))
    unrolled = drafter.ttt_logits(aux, next_ids, length)
    index = torch.arange(seq)
    cache: list = []
    hidden, logits = drafter.step(next_ids[:, :seq], drafter.project(aux), index, index, cache)
    chain = [logits[:, -1]]
    hidden, last = hidden[:, -1:], index[-1:]
    for i in range(1, length):
        hidden, logits = drafter.step(next_ids[:, seq - 1 + i].view(1, 1), hidden, last + i, last, cache)
        chain.append(logits[:, -1])
    for i in range(length):
        torch.testing.assert_close(unrolled[i][:, -1], chain[i])
    if arch == "eagle3.1":
        raw = drafter.midlayer(drafter.embed_tokens(next_ids[:, :1]).double(), drafter.project(aux[:, :1]),
                               index[:1], index[:1], [])
        out, _ = drafter.step(next_ids[:, :1], drafter.project(aux[:, :1]), index[:1], index[:1], [])
        torch.testing.assert_close(out, drafter.norm(raw))
        assert len(drafter.fc_norm) == 3


def test_fc_norm_makes_the_projection_scale_free_per_layer():
    """eagle3.1 normalises each captured layer before fc: scaling one layer's slice changes
    nothing; eagle3's projection follows the scale."""
    aux = torch.randn(2, 5, 48, dtype=torch.float64)
    scaled = aux.clone()
    scaled[..., 32:] *= 50.0  # the upper layer's residual stream grown large
    new, old = tiny("eagle3.1"), tiny("eagle3")
    torch.testing.assert_close(new.project(aux), new.project(scaled), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(old.project(aux), old.project(scaled))


def test_the_launch_fields_know_the_trainers_architectures():
    from hsmon.launch.training import ARCHS as LAUNCH_ARCHS

    assert tuple(ARCHS) == LAUNCH_ARCHS


def test_eval_drafter_table_names_the_architecture_it_measured(capsys):
    """An EAGLE 3.1 drafter's column reads eagle3.1, not eagle3 (the JSON keeps its `eagle3` key and
    says the architecture in `arch`)."""
    from trainer.evaluate import print_tables

    lengths = {"eagle3": {"1": 1.9, "2": 2.5}, "ngram": {"1": 1.4, "2": 1.6}}
    res = {"arch": "eagle3.1", "prompts": 4, "max_new_tokens": 24, "acceptance_length": lengths,
           "outputs_match_greedy": True}
    print_tables({"prompts": res}, 2)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("prompts (eagle3.1 drafter)")
    assert lines[1].split() == ["depth", "eagle3.1", "ngram"] and lines[3].split() == ["2", "2.500", "1.600"]
