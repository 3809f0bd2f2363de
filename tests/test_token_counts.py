"""The dataset's token counts that `hsmon extract` writes from its scan (hsmon.contracts.token_counts):
a following trainer's draft vocabulary is the one the offline trainer picks over the finished data."""

from __future__ import annotations

import json
from collections import Counter

from extract_helpers import make_dataset, run_extract, tiny_model  # noqa: F401

from extractor.token_counts import spread
from hsmon.contracts import token_counts as tc
from trainer.data import build_draft_vocab, build_index


def test_the_scan_counts_equal_the_offline_trainers_counts_over_the_finished_data(tmp_path, tiny_model):  # noqa: F811
    """Every row format (text, ShareGPT, OpenAI, pre-tokenized with a loss mask) and rejected rows:
    the counts written before the first row equal what trainer/data.py counts over the row files,
    so the draft vocabulary is the same; a second run over the same output keeps the file."""
    data = make_dataset(tmp_path / "data.jsonl", 30, bad_every=7)
    out = tmp_path / "out"
    proc = run_extract(data, out, tiny_model, "--chunk-size", "8", "--threads", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = tc.read_token_counts(out)
    assert written is not None and written.files == 1
    offline = build_index(out)
    assert written.rows_sampled == len(offline.rows) == 30 - 30 // 7
    assert written.counts == offline.token_counts and sum(written.counts.values()) > 0
    vocab = 40  # smaller than the data's distinct tokens: the choice matters
    assert len(offline.token_counts) > vocab
    online_d2t, _ = build_draft_vocab(written.counts, 512, vocab)
    offline_d2t, _ = build_draft_vocab(offline.token_counts, 512, vocab)
    assert online_d2t.tolist() == offline_d2t.tolist()
    before = (out / tc.token_counts_name()).read_bytes()
    again = run_extract(data, out, tiny_model, "--chunk-size", "8", "--threads", "1")
    assert again.returncode == 0, again.stderr[-2000:]
    assert (out / tc.token_counts_name()).read_bytes() == before


def test_shards_are_summed_and_an_unreadable_file_is_left_out(tmp_path):
    tc.write_token_counts(tmp_path, (0, 2), Counter({5: 2, 7: 1}), 3, 3, "abc")
    tc.write_token_counts(tmp_path, (1, 2), Counter({5: 1, 9: 4}), 2, 2, "abc")
    (tmp_path / "hsmon-token-counts.shard-2-of-3.json").write_text('{"counts": [1, 2')  # torn: skipped
    got = tc.read_token_counts(tmp_path)
    assert got is not None
    assert got.counts == Counter({5: 3, 7: 1, 9: 4}) and got.rows_sampled == 5 and got.files == 2
    assert json.loads((tmp_path / "hsmon-token-counts.shard-1-of-2.json").read_text())["rows_valid"] == 2
    assert tc.read_token_counts(tmp_path / "missing") is None


def test_the_sample_is_spread_evenly_and_bounded():
    assert spread(list(range(10)), 4000) == list(range(10))
    picked = spread(list(range(10_001)), 4000)
    assert len(picked) <= 4000 and picked[0] == 0 and picked[1] - picked[0] == picked[-1] - picked[-2] == 3
