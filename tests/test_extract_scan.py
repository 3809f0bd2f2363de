"""The dataset scan that plans an extraction: batched and length-only, it must file every row exactly
as ``parse_row`` (what the extraction itself uses) does; the loss mask over spans is unchanged."""

from __future__ import annotations

import json
import random

import pytest
from extract_helpers import tiny_chat_model, tiny_model  # noqa: F401 (fixtures)

from extractor import dataset as ds
from extractor.conversations import span_mask


@pytest.fixture(scope="module", params=["plain", "chat"])
def tokenizer(request, tiny_model, tiny_chat_model):  # noqa: F811
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model if request.param == "plain" else tiny_chat_model))


def mixed_rows(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["def", "return", "self", "import", "class", "for", "in", "x", "value", "(", ")", ":"]

    def text(k: int) -> str:
        return " ".join(rng.choice(words) for _ in range(k))

    lines = []
    for i in range(n):
        kind = i % 9
        if kind == 0:
            lines.append(json.dumps({"text": text(rng.randint(1, 90))}))
        elif kind == 1:
            lines.append(json.dumps({"conversations": [{"from": "human", "value": text(20)},
                                                       {"from": "gpt", "value": text(rng.randint(1, 60))}]}))
        elif kind == 2:
            lines.append(json.dumps({"messages": [{"role": "system", "content": text(5)},
                                                  {"role": "user", "content": text(8)},
                                                  {"role": "assistant", "content": text(9)},
                                                  {"role": "user", "content": text(3)},
                                                  {"role": "assistant", "content": text(30)}]}))
        elif kind == 3:
            lines.append(json.dumps({"input_ids": [rng.randint(0, 100) for _ in range(rng.randint(1, 80))]}))
        elif kind == 4:
            lines.append(rng.choice(['{"text": ""}', "not json", "[1, 2]", '{"input_ids": [99999]}',
                                     '{"conversations": []}', '{"other": 1}']))
        else:
            lines.append(json.dumps({"text": text(rng.randint(30, 70))}))
    return lines


@pytest.mark.parametrize("truncate", [True, False])
def test_scan_files_every_row_as_parse_row_does(tmp_path, tokenizer, truncate):
    limits = ds.Limits(vocab_size=512, max_length=64, truncate=truncate)
    path = tmp_path / "data.jsonl"
    lines = mixed_rows(300)
    path.write_text("\n".join(lines[:150]) + "\n\n" + "\n".join(lines[150:]) + "\n")
    seen = []
    result = ds.scan(path, tokenizer, limits, owns=lambda i: i % 5 != 3, progress=lambda n, b: seen.append(n))
    rows, lengths, rejects, truncated = [], [], [], 0
    for index, line_no, raw in ds.iter_lines(path):
        if index % 5 == 3:
            continue
        parsed = ds.parse_row(raw, index, tokenizer, limits, line_no)
        if isinstance(parsed, ds.Reject):
            rejects.append((parsed.index, parsed.line, parsed.reason))
        else:
            rows.append(index)
            lengths.append(len(parsed.input_ids))
            truncated += parsed.truncated
    assert list(result.rows) == rows and list(result.lengths) == lengths
    assert [(r.index, r.line, r.reason) for r in result.rejects] == rejects
    assert result.truncated == truncated and result.lines == 300
    assert (truncated > 0) == truncate and any("too long" in r[2] for r in rejects) == (not truncate)
    assert seen and seen == sorted(seen)


def test_span_mask_equals_the_overlap_rule():
    rng = random.Random(5)
    for _ in range(300):
        cuts = sorted(rng.sample(range(200), 6))
        spans = [(cuts[0], cuts[1]), (cuts[2], cuts[3]), (cuts[4], cuts[5])][: rng.randint(0, 3)]
        pos, offsets = 0, []
        while pos < 210:
            step = rng.randint(0, 4)
            offsets.append((pos, pos + step))
            pos += step
        want = [1 if e > s and any(s < b and e > a for a, b in spans) else 0 for s, e in offsets]
        assert span_mask(offsets, spans) == want
        assert span_mask(offsets, list(reversed(spans))) == want  # unordered spans: the plain rule


def test_a_repeated_scan_comes_from_the_cache_and_a_changed_dataset_does_not(tmp_path, tokenizer):
    from extractor.scan_cache import cached_scan

    limits = ds.Limits(vocab_size=512, max_length=64)
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(mixed_rows(120, seed=3)) + "\n")
    kwargs = {"fingerprint": "model-a", "owner": "shard 0/1", "owns": None, "cache_dir": tmp_path / "cache"}
    first, cached = cached_scan(path, tokenizer, limits, **kwargs)
    assert not cached
    again, cached = cached_scan(path, tokenizer, limits, **kwargs)
    assert cached and list(again.rows) == list(first.rows) and list(again.lengths) == list(first.lengths)
    assert (again.lines, again.truncated, again.sha256) == (first.lines, first.truncated, first.sha256)
    assert [(r.index, r.reason, r.line) for r in again.rejects] == [
        (r.index, r.reason, r.line) for r in first.rejects]
    _, cached = cached_scan(path, tokenizer, ds.Limits(vocab_size=512, max_length=32), **kwargs)
    assert not cached  # other limits, another scan
    _, cached = cached_scan(path, tokenizer, limits, **{**kwargs, "fingerprint": "model-b"})
    assert not cached  # another tokenizer
    path.write_text("\n".join(mixed_rows(120, seed=4)) + "\n")
    changed, cached = cached_scan(path, tokenizer, limits, **kwargs)
    assert not cached and changed.sha256 != first.sha256
    from extractor.scan_cache import _prune

    assert len(list((tmp_path / "cache").glob("*.scan"))) == 4
    _prune(tmp_path / "cache", keep=1)
    assert len(list((tmp_path / "cache").glob("*.scan"))) == 1
