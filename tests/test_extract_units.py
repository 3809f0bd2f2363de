"""In-process tests of the extractor's parts: row validation, loss masks, planning, stats, backend."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from extract_helpers import tiny_chat_model, tiny_model  # noqa: F401 (fixtures)

from extractor import dataset as ds
from extractor.plan import Shard, parse_layers, plan_batches, row_bytes
from extractor.row_stats import finish_stats, layer_sums
from extractor.writer import ChunkBook
from hsmon.contracts import layout
from hsmon.contracts.capture_points import default_capture_points


@pytest.fixture(scope="module")
def tokenizer(tiny_model):  # noqa: F811
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


@pytest.fixture(scope="module")
def chat_tokenizer(tiny_chat_model):  # noqa: F811
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_chat_model))


LIMITS = ds.Limits(vocab_size=512, max_length=256, truncate=True)

BAD_ROWS = [
    (b"{not json", "invalid JSON"),
    (b"\xff\xfe", "invalid JSON"),
    (b"[1, 2, 3]", "must be a JSON object"),
    (b'{"prompt": "hi"}', "missing field"),
    (b'{"text": 42}', "field 'text' must be a string"),
    (b'{"text": "   "}', "empty text"),
    (b'{"text": ""}', "empty text"),
    (b'{"conversations": "hello"}', "must be a list of messages"),
    (b'{"conversations": []}', "empty conversations"),
    (b'{"conversations": ["hi"]}', "message 0 must be an object"),
    (b'{"conversations": [{"speaker": "x"}]}', "needs 'role'/'content'"),
    (b'{"conversations": [{"role": "user", "content": 5}]}', "field 'content' must be a string"),
    (b'{"conversations": [{"from": 1, "value": "x"}]}', "field 'from' must be a string"),
    (b'{"conversations": [{"role": "alien", "content": "x"}]}', "unknown role 'alien'"),
    (b'{"messages": [{"role": "user", "content": ""}]}', "empty text"),
    (b'{"input_ids": "1 2 3"}', "must be a list of integers"),
    (b'{"input_ids": [1, 2.5]}', "must be a list of integers"),
    (b'{"input_ids": [1, true]}', "must be a list of integers"),
    (b'{"input_ids": []}', "empty input_ids"),
    (b'{"input_ids": [1, 512]}', "token id 512 outside the vocabulary"),
    (b'{"input_ids": [-1, 2]}', "token id -1 outside the vocabulary"),
    (b'{"input_ids": [1, 2], "loss_mask": [1]}', "loss_mask has 1 values for 2"),
    (b'{"input_ids": [1, 2], "loss_mask": [1, 2]}', "list of 0/1 values"),
]


@pytest.mark.parametrize(("raw", "reason"), BAD_ROWS)
def test_every_bad_row_kind_is_rejected_with_its_reason(tokenizer, raw, reason):
    result = ds.parse_row(raw, 7, tokenizer, LIMITS, line=9)
    assert isinstance(result, ds.Reject), result
    assert reason in result.reason and result.index == 7 and result.line == 9


def test_too_long_rejected_without_truncation_and_cut_with_it(tokenizer):
    raw = json.dumps({"input_ids": list(range(100)), "loss_mask": [1] * 100}).encode()
    strict = ds.parse_row(raw, 0, tokenizer, ds.Limits(512, 64, truncate=False))
    assert isinstance(strict, ds.Reject) and "too long: 100 tokens > max length 64" in strict.reason
    cut = ds.parse_row(raw, 0, tokenizer, ds.Limits(512, 64))
    assert isinstance(cut, ds.Row) and cut.truncated and cut.input_ids == list(range(64))
    assert len(cut.loss_mask) == 64


def test_text_row_gets_bos_and_full_mask(tokenizer):
    row = ds.parse_row(b'{"text": "def main():\\n    return 0"}', 0, tokenizer, LIMITS)
    assert isinstance(row, ds.Row)
    assert row.input_ids[0] == tokenizer.bos_token_id and set(row.loss_mask) == {1}
    assert tokenizer.decode(row.input_ids[1:]) == "def main():\n    return 0"


def _masked_text(tok, row):
    return tok.decode([i for i, m in zip(row.input_ids, row.loss_mask, strict=True) if m])


def test_sharegpt_and_openai_names_give_the_same_tokens(tokenizer, chat_tokenizer):
    share = {
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "a question"},
            {"from": "gpt", "value": "the answer"},
        ]
    }
    openai = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "a question"},
            {"role": "assistant", "content": "the answer"},
        ]
    }
    for tok in (tokenizer, chat_tokenizer):
        a = ds.parse_row(json.dumps(share).encode(), 0, tok, LIMITS)
        b = ds.parse_row(json.dumps(openai).encode(), 0, tok, LIMITS)
        assert isinstance(a, ds.Row) and (a.input_ids, a.loss_mask) == (b.input_ids, b.loss_mask)


def test_loss_mask_covers_assistant_turns_only_fallback(tokenizer):
    conv = {
        "conversations": [
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "first answer"},
            {"role": "user", "content": "second question"},
            {"role": "assistant", "content": "second answer"},
        ]
    }
    row = ds.parse_row(json.dumps(conv).encode(), 0, tokenizer, LIMITS)
    assert isinstance(row, ds.Row)
    text = tokenizer.decode(row.input_ids, skip_special_tokens=True)
    assert (
        text == "<|user|>\nfirst question\n<|assistant|>\nfirst answer\n<|user|>\nsecond question\n"
        "<|assistant|>\nsecond answer\n"
    )
    assert _masked_text(tokenizer, row) == "first answer\nsecond answer\n"


def test_loss_mask_through_chat_template_includes_end_of_turn(chat_tokenizer):
    conv = {
        "conversations": [
            {"role": "user", "content": "ask"},
            {"role": "assistant", "content": "reply one"},
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": "reply two"},
        ]
    }
    row = ds.parse_row(json.dumps(conv).encode(), 0, chat_tokenizer, LIMITS)
    assert isinstance(row, ds.Row)
    rendered = chat_tokenizer.apply_chat_template(
        ds.normalize_messages(conv["conversations"]), tokenize=False
    )
    assert chat_tokenizer.decode(row.input_ids) == rendered
    assert _masked_text(chat_tokenizer, row) == "reply one</s>reply two</s>"


def test_shard_parsing_and_ownership():
    assert Shard.parse("1/3").owns_row(2000, 2000) and not Shard.parse("1/3").owns_row(0, 2000)
    for bad in ("3/3", "x", "1/0", "-1/2"):
        with pytest.raises(ValueError, match="--shard"):
            Shard.parse(bad)
    owners = [[s for s in range(3) if Shard(s, 3).owns_row(r, 10)] for r in range(100)]
    assert all(len(o) == 1 for o in owners)


def test_layers_default_and_checks():
    assert default_capture_points(61) == [2, 30, 58] and parse_layers(None, 8) == [2, 4, 5]
    assert parse_layers("1,3,7", 8) == [1, 3, 7]
    for bad in ("0,2", "2,8", "a,b", "2,2"):
        with pytest.raises(ValueError, match="--layers"):
            parse_layers(bad, 8)


def test_batches_respect_budget_and_chunks_and_depend_only_on_rows():
    rows = list(range(40))
    lengths = [(r * 7) % 23 + 1 for r in rows]
    batches = plan_batches(rows, lengths, chunk_size=10, batch_tokens=40)
    assert sorted(p for b in batches for p in b) == list(range(40))
    for batch in batches:
        assert len({rows[p] // 10 for p in batch}) == 1
        assert len(batch) == 1 or max(lengths[p] for p in batch) * len(batch) <= 40
    # the rows of one chunk are batched the same whatever else is in the plan (shards, resume)
    sub = [r for r in rows if r // 10 in (1, 3)]
    sub_batches = plan_batches(sub, [lengths[r] for r in sub], 10, 40)
    as_rows = {tuple(rows[p] for p in b) for b in batches}
    assert {tuple(sub[p] for p in b) for b in sub_batches} <= as_rows
    assert row_bytes(10, 64, 3, 4) == 10 * 16 + 10 * 64 * 4 * 4 + 3000


def test_layer_stats_count_nonfinite_and_combine():
    x = torch.tensor([[3.0, 4.0], [float("nan"), 1.0], [0.0, float("inf")]])
    sums = layer_sums(x)
    assert sums[0] == 1 and math.isclose(sums[1], 5.0) and sums[6] == 2 and sums[5] == 4.0
    stats = finish_stats([sums, layer_sums(torch.tensor([[6.0, 8.0]]))])
    assert math.isclose(stats["mean_l2"], 7.5) and stats["nonfinite"] == 2 and stats["max_abs"] == 8.0
    values = torch.tensor([3.0, 4.0, 1.0, 0.0, 6.0, 8.0], dtype=torch.float64)
    assert math.isclose(stats["std"], float(values.std(unbiased=False)), rel_tol=1e-9)


def test_chunk_book_completes_a_chunk_once_with_rejects():
    book = ChunkBook(chunk_size=4, expected={0: 4, 4: 2})
    stats = {"final": [1, 1.0, 2, 0.0, 2.0, 1.0, 0]}
    for row in (0, 2):
        book.add_row({"row": row, "tokens": 3, "bytes": 10, "sha256": f"{row:064x}", "stats": stats})
    book.add_reject(1)
    assert book.completed() == []
    book.add_row({"row": 3, "tokens": 3, "bytes": 10, "sha256": f"{3:064x}", "stats": stats})
    (record,) = book.completed()
    assert record["chunk"] == "rows_0-4" and record["rows"] == 3 and record["rejects"] == 1
    assert record["tokens"] == 9 and book.completed() == []


def test_manifest_tail_repair_and_rollback(tmp_path):
    path = tmp_path / "m.jsonl"
    layout.append_jsonl(path, [{"a": 1}])
    with open(path, "ab") as fh:
        fh.write(b'{"a": 2, "par')
    assert layout.repair_jsonl_tail(path) == len(b'{"a": 2, "par')
    layout.append_jsonl(path, [{"a": 3}])
    assert [r["a"] for r in layout.iter_jsonl(path)] == [1, 3]
    assert layout.repair_jsonl_tail(path) == 0 and layout.repair_jsonl_tail(tmp_path / "none") == 0


def test_batched_forward_equals_unbatched_and_is_deterministic(tiny_model):  # noqa: F811
    from extractor.backends.hf import HFBackend

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    backend = HFBackend(tiny_model, device="cpu", dtype="float32")
    assert backend.capture_points == [2, 4, 5] and backend.info.hidden_size == 64
    rows = [[1, 5, 9, 200, 7], [1, 40], [1, 300, 301, 302, 303, 304, 305, 306, 307]]
    batched = backend.extract(rows)
    again = backend.extract(rows)
    for row, got, rep in zip(rows, batched, again, strict=True):
        (alone,) = backend.extract([row])
        assert got.hidden_state.shape == (len(row), 64) and got.aux_hidden_state.shape == (len(row), 3 * 64)
        assert torch.allclose(got.hidden_state, alone.hidden_state, atol=1e-5)
        assert torch.allclose(got.aux_hidden_state, alone.aux_hidden_state, atol=1e-5)
        assert torch.equal(got.hidden_state, rep.hidden_state)
    # the capture points are transformers' hidden_states indices; the final one is after the norm
    out = backend.model(torch.tensor([rows[2]]), output_hidden_states=True)
    hs = out.hidden_states
    want_aux = torch.cat([hs[2][0], hs[4][0], hs[5][0]], dim=-1)
    (single,) = backend.extract([rows[2]])
    assert torch.allclose(single.aux_hidden_state, want_aux, atol=1e-6)
    assert torch.allclose(single.hidden_state, hs[-1][0], atol=1e-6)
    backend.close()


def test_hf_batch_that_raises_is_retried_row_by_row_and_only_the_failing_row_is_rejected(tiny_model):  # noqa: F811
    """FAILURE INJECTION (named as such): a forward pre-hook on the real model's decoder raises a
    CUDA-style out-of-memory error for any input longer than 40 tokens, as a GPU would on one very
    long row; everything else runs the real model."""
    from extractor.backends.base import RowRejected
    from extractor.backends.hf import HFBackend
    from hsmon.contracts.rejects import classify

    backend = HFBackend(tiny_model, device="cpu", dtype="float32")
    rows = [[1, 5, 9, 200, 7], list(range(3, 60)), [1, 40, 41]]
    want = [backend.extract([row])[0] for row in (rows[0], rows[2])]

    def fake_oom(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[1] > 40:
            raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB (injected by the test)")

    hook = backend.decoder.register_forward_pre_hook(fake_oom, with_kwargs=True)
    got = backend.extract(rows)
    assert isinstance(got[1], RowRejected)
    assert got[1].reason.startswith("the model failed on this row alone (57 tokens): RuntimeError: "
                                    "CUDA out of memory")
    assert classify(got[1].reason) == "out_of_memory"
    for alone, states in zip(want, (got[0], got[2]), strict=True):  # computed alone: equal to alone
        assert torch.equal(alone.hidden_state, states.hidden_state)
        assert torch.equal(alone.aux_hidden_state, states.aux_hidden_state)
    hook.remove()
    # A model that fails on every input is not one row's fault: the error is raised, nothing rejected.
    hook = backend.decoder.register_forward_pre_hook(
        lambda *_a, **_k: (_ for _ in ()).throw(RuntimeError("device lost (injected)")), with_kwargs=True)
    with pytest.raises(RuntimeError, match="device lost"):
        backend.extract(rows)
    hook.remove()
    backend.close()
