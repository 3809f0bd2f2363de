"""Reading and validating an extraction dataset (JSON Lines).

Each non-blank line is one row; rows are numbered from 0 in file order (blank lines are
ignored and take no number). A row is one of:

- ``{"text": "..."}``: tokenized with the tokenizer's special tokens (e.g. BOS); every token
  counts for the loss.
- ``{"conversations": [...]}`` (or ``"messages"``): messages with OpenAI names
  (``role``/``content``) or ShareGPT names (``from``/``value``). The loss mask covers the
  assistant turns (their content and end-of-turn markup). Rendered with the tokenizer's chat
  template when it has one (see :func:`render_conversation`), else with the fallback format
  ``<|role|>\\n{content}\\n`` per message after the tokenizer's BOS.
- ``{"input_ids": [...], "loss_mask": [...]}``: pre-tokenized; ``loss_mask`` is optional
  (all ones) and must have the same length, values 0/1.

A bad row becomes a :class:`Reject` with a reason; good rows become :class:`Row`. Nothing here
imports torch: the tokenizer is passed in (anything with the Hugging Face tokenizer methods).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extractor.conversations import (
    RowError,
    Spans,
    Tokenizer,
    normalize_messages,
    render_conversation,
    tokenize_with_spans,
)


@dataclass
class Row:
    """A valid row, tokenized."""

    index: int
    input_ids: list[int]
    loss_mask: list[int]
    truncated: bool = False
    line: int = 0


@dataclass
class Reject:
    """A row that cannot be used, and why."""

    index: int
    reason: str
    line: int = 0


@dataclass(frozen=True)
class Limits:
    """What makes a tokenized row acceptable."""

    vocab_size: int
    max_length: int
    truncate: bool = True



def iter_lines(path: str | Path, hasher: Any = None) -> Iterator[tuple[int, int, bytes]]:
    """(row index, 1-based line number, raw line) for each non-blank line of a file.

    When ``hasher`` is given, every byte of the file is fed to it (the dataset's fingerprint).
    """
    index = 0
    with open(path, "rb") as fh:
        for line_no, raw in enumerate(fh, start=1):
            if hasher is not None:
                hasher.update(raw)
            if not raw.strip():
                continue
            yield index, line_no, raw
            index += 1


def parse_row(raw: bytes, index: int, tokenizer: Tokenizer, limits: Limits, line: int = 0) -> Row | Reject:
    """Turn one raw JSONL line into a Row, or a Reject that says why not."""
    try:
        item = render_line(raw, tokenizer, limits)
        ids, mask = item if isinstance(item, tuple) else tokenize_rendered(item, tokenizer)
        truncated = False
        if len(ids) > limits.max_length:
            if not limits.truncate:
                raise RowError(too_long(len(ids), limits))
            ids, mask, truncated = ids[: limits.max_length], mask[: limits.max_length], True
    except RowError as exc:
        return Reject(index, str(exc), line)
    return Row(index, ids, mask, truncated, line)


def too_long(tokens: int, limits: Limits) -> str:
    return f"too long: {tokens} tokens > max length {limits.max_length}"


@dataclass
class Rendered:
    """A row's text as the model will see it, before tokenization."""

    text: str
    spans: Spans | None  # character spans the loss covers; None: every token counts (a text row)
    add_special_tokens: bool


def render_line(raw: bytes, tokenizer: Tokenizer, limits: Limits) -> Rendered | tuple[list[int], list[int]]:
    """A raw line's text to tokenize, or the (ids, mask) of a pre-tokenized row; raises RowError."""
    obj = json_object(raw)
    if "input_ids" in obj:
        return _pretokenized(obj, limits)
    for key in ("conversations", "messages"):
        if key in obj:
            msgs = normalize_messages(obj[key], key)
            if not any(m["content"].strip() for m in msgs):
                raise RowError("empty text")
            text, spans, special = render_conversation(msgs, tokenizer)
            return Rendered(text, spans, special)
    if "text" in obj:
        text = obj["text"]
        if not isinstance(text, str):
            raise RowError(f"field 'text' must be a string, got {type(text).__name__}")
        if not text.strip():
            raise RowError("empty text")
        return Rendered(text, None, True)
    raise RowError("missing field: a row needs 'text', 'conversations' (or 'messages') or 'input_ids'")


def json_object(raw: bytes) -> dict[str, Any]:
    """A raw line's JSON object; RowError says why it is not one."""
    try:
        obj = json.loads(raw)
    except UnicodeDecodeError:
        raise RowError("invalid JSON: not UTF-8") from None
    except ValueError as exc:
        raise RowError(f"invalid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise RowError(f"row must be a JSON object, got {type(obj).__name__}")
    return obj


def tokenize_rendered(item: Rendered, tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of a rendered row; raises RowError when it has no token."""
    if item.spans is None:
        ids = list(tokenizer(item.text, add_special_tokens=item.add_special_tokens)["input_ids"])
        mask = [1] * len(ids)
    else:
        ids, mask = tokenize_with_spans(item.text, item.spans, tokenizer, item.add_special_tokens)
    if not ids:
        raise RowError("empty text")
    return ids, mask


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _pretokenized(obj: dict[str, Any], limits: Limits) -> tuple[list[int], list[int]]:
    ids = obj["input_ids"]
    if not isinstance(ids, list) or not all(_is_int(i) for i in ids):
        raise RowError("field 'input_ids' must be a list of integers")
    if not ids:
        raise RowError("empty input_ids")
    bad = next((i for i in ids if not 0 <= i < limits.vocab_size), None)
    if bad is not None:
        raise RowError(f"token id {bad} outside the vocabulary (0..{limits.vocab_size - 1})")
    mask = obj.get("loss_mask")
    if mask is None:
        return list(ids), [1] * len(ids)
    if not isinstance(mask, list) or not all(m in (0, 1) and not isinstance(m, float) for m in mask):
        raise RowError("field 'loss_mask' must be a list of 0/1 values")
    if len(mask) != len(ids):
        raise RowError(f"loss_mask has {len(mask)} values for {len(ids)} input_ids")
    return list(ids), [int(m) for m in mask]


@dataclass
class ScanResult:
    """What a first pass over the dataset found, for the rows one shard owns."""

    lines: int = 0  # non-blank lines in the whole file
    rows: list[int] | None = None  # valid row indices owned, ascending
    lengths: list[int] | None = None  # their token counts (after truncation)
    rejects: list[Reject] | None = None
    truncated: int = 0
    sha256: str = ""

    @property
    def tokens(self) -> int:
        return sum(self.lengths or ())


SCAN_BATCH = 64  # rows tokenized in one call during the scan (a fast tokenizer spreads them over cores)
ScanProgress = Callable[[int, int], None]  # (rows seen, bytes read)


def scan(path: str | Path, tokenizer: Tokenizer, limits: Limits, owns: Any = None,
         progress: ScanProgress | None = None) -> ScanResult:
    """Validate every owned row (``owns(index) -> bool``, default all) and fingerprint the file.

    Keeps only lengths, not token ids, so memory stays small for any dataset size. Rows are
    tokenized in batches and without offsets (the lengths are those ``parse_row`` gives);
    ``progress`` is called after each batch.
    """
    from array import array

    hasher = hashlib.sha256()
    result = ScanResult(rows=array("q"), lengths=array("q"), rejects=[])  # type: ignore[arg-type]
    pending: list[tuple[int, int, Rendered | tuple[list[int], list[int]] | RowError]] = []
    read = 0
    for index, line_no, raw in iter_lines(path, hasher):
        result.lines = index + 1
        read += len(raw)
        if owns is not None and not owns(index):
            continue
        try:
            pending.append((index, line_no, render_line(raw, tokenizer, limits)))
        except RowError as exc:
            pending.append((index, line_no, exc))
        if len(pending) >= SCAN_BATCH:
            _scan_batch(pending, tokenizer, limits, result)
            pending.clear()
            if progress is not None:
                progress(index + 1, read)
    _scan_batch(pending, tokenizer, limits, result)
    result.sha256 = hasher.hexdigest()
    return result


def _scan_batch(batch: list[tuple[int, int, Any]], tokenizer: Tokenizer, limits: Limits,
                result: ScanResult) -> None:
    """Count the tokens of a batch of rendered rows and file each row as a row or a reject."""
    assert result.rows is not None and result.lengths is not None and result.rejects is not None
    counted: dict[int, int] = {}
    fast = getattr(tokenizer, "is_fast", False)
    for special in (True, False):
        texts = [(i, item.text) for i, (_, _, item) in enumerate(batch)
                 if isinstance(item, Rendered) and item.add_special_tokens == special
                 and (fast or item.spans is None)]
        if texts:
            encoded = tokenizer([t for _, t in texts], add_special_tokens=special)["input_ids"]
            counted.update((i, len(ids)) for (i, _), ids in zip(texts, encoded, strict=True))
    for i, (index, line_no, item) in enumerate(batch):
        try:
            if isinstance(item, RowError):
                raise item
            if isinstance(item, tuple):
                n = len(item[0])
            else:
                n = counted[i] if i in counted else len(tokenize_rendered(item, tokenizer)[0])
            if n == 0:
                raise RowError("empty text")
            if n > limits.max_length and not limits.truncate:
                raise RowError(too_long(n, limits))
        except RowError as exc:
            result.rejects.append(Reject(index, str(exc), line_no))
            continue
        result.rows.append(index)
        result.lengths.append(min(n, limits.max_length))
        result.truncated += n > limits.max_length


def iter_rows(path: str | Path, tokenizer: Tokenizer, limits: Limits, wanted: Any) -> Iterator[Row]:
    """Valid rows whose index is in ``wanted`` (a container), tokenized again, in file order."""
    for index, line_no, raw in iter_lines(path):
        if index in wanted:
            parsed = parse_row(raw, index, tokenizer, limits, line_no)
            if isinstance(parsed, Row):
                yield parsed
