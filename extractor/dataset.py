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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

USER_ROLES = {"user", "human"}
ASSISTANT_ROLES = {"assistant", "gpt", "chatgpt", "bot", "model"}
SYSTEM_ROLES = {"system"}
TOOL_ROLES = {"tool", "function", "observation"}
ROLE_NAMES = {
    **{r: "user" for r in USER_ROLES},
    **{r: "assistant" for r in ASSISTANT_ROLES},
    **{r: "system" for r in SYSTEM_ROLES},
    **{r: "tool" for r in TOOL_ROLES},
}


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer this module uses."""

    chat_template: Any
    is_fast: bool

    def __call__(self, text: str, **kwargs: Any) -> Any: ...

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> Any: ...


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


class RowError(ValueError):
    """A row is bad; the message is the reason written to rejects.jsonl."""


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
        obj = json.loads(raw)
    except UnicodeDecodeError:
        return Reject(index, "invalid JSON: not UTF-8", line)
    except ValueError as exc:
        return Reject(index, f"invalid JSON: {exc}", line)
    try:
        ids, mask = _tokenize_object(obj, tokenizer, limits)
        truncated = False
        if len(ids) > limits.max_length:
            if not limits.truncate:
                raise RowError(f"too long: {len(ids)} tokens > max length {limits.max_length}")
            ids, mask, truncated = ids[: limits.max_length], mask[: limits.max_length], True
    except RowError as exc:
        return Reject(index, str(exc), line)
    return Row(index, ids, mask, truncated, line)


def _tokenize_object(obj: Any, tokenizer: Tokenizer, limits: Limits) -> tuple[list[int], list[int]]:
    if not isinstance(obj, dict):
        raise RowError(f"row must be a JSON object, got {type(obj).__name__}")
    if "input_ids" in obj:
        return _pretokenized(obj, limits)
    for key in ("conversations", "messages"):
        if key in obj:
            return _conversation(obj[key], key, tokenizer)
    if "text" in obj:
        text = obj["text"]
        if not isinstance(text, str):
            raise RowError(f"field 'text' must be a string, got {type(text).__name__}")
        if not text.strip():
            raise RowError("empty text")
        ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
        if not ids:
            raise RowError("empty text")
        return ids, [1] * len(ids)
    raise RowError("missing field: a row needs 'text', 'conversations' or 'input_ids'")


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


def normalize_messages(messages: Any, key: str = "conversations") -> list[dict[str, str]]:
    """Messages in OpenAI or ShareGPT names -> [{"role": system|user|assistant|tool, "content"}]."""
    if not isinstance(messages, list):
        raise RowError(f"field '{key}' must be a list of messages, got {type(messages).__name__}")
    if not messages:
        raise RowError(f"empty {key}")
    out = []
    for n, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise RowError(f"message {n} must be an object")
        if "role" in msg or "content" in msg:
            role, content, names = msg.get("role"), msg.get("content"), ("role", "content")
        elif "from" in msg or "value" in msg:
            role, content, names = msg.get("from"), msg.get("value"), ("from", "value")
        else:
            raise RowError(f"message {n} needs 'role'/'content' (OpenAI) or 'from'/'value' (ShareGPT)")
        if not isinstance(role, str):
            raise RowError(f"message {n}: field '{names[0]}' must be a string")
        if not isinstance(content, str):
            raise RowError(f"message {n}: field '{names[1]}' must be a string")
        canonical = ROLE_NAMES.get(role.lower())
        if canonical is None:
            raise RowError(f"unknown role {role!r} in message {n} "
                           "(use system, user/human, assistant/gpt, tool)")
        out.append({"role": canonical, "content": content})
    return out


def _conversation(messages: Any, key: str, tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    msgs = normalize_messages(messages, key)
    if not any(m["content"].strip() for m in msgs):
        raise RowError("empty text")
    text, spans, special = render_conversation(msgs, tokenizer)
    ids, mask = tokenize_with_spans(text, spans, tokenizer, add_special_tokens=special)
    if not ids:
        raise RowError("empty text")
    return ids, mask


Spans = list[tuple[int, int]]


def render_conversation(msgs: list[dict[str, str]], tokenizer: Tokenizer) -> tuple[str, Spans, bool]:
    """(text, assistant character spans, add_special_tokens) for a normalized conversation.

    With a chat template, the span of assistant turn k is what rendering ``msgs[:k+1]`` adds to
    rendering ``msgs[:k]`` with the generation prompt (the assistant's content and end-of-turn
    markup). A template that does not render prefixes stably falls back to the plain format.
    """
    if getattr(tokenizer, "chat_template", None):
        rendered = _render_with_template(msgs, tokenizer)
        if rendered is not None:
            return rendered[0], rendered[1], False
    return (*_render_fallback(msgs), True)


def _render_with_template(msgs: list[dict[str, str]], tokenizer: Tokenizer) -> tuple[str, Spans] | None:
    def render(part: list[dict[str, str]], generation_prompt: bool) -> str:
        if not part:
            return ""
        return str(tokenizer.apply_chat_template(part, tokenize=False,
                                                 add_generation_prompt=generation_prompt))

    try:
        full = render(msgs, False)
        spans = []
        for k, msg in enumerate(msgs):
            if msg["role"] != "assistant":
                continue
            before = render(msgs[:k], True)
            upto = render(msgs[: k + 1], False)
            if not upto.startswith(before) or not full.startswith(upto):
                return None
            spans.append((len(before), len(upto)))
    except Exception:  # a template that cannot render this conversation: use the fallback format
        return None
    return full, spans


def _render_fallback(msgs: list[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
    parts: list[str] = []
    spans = []
    pos = 0
    for msg in msgs:
        header = f"<|{msg['role']}|>\n"
        body = msg["content"] + "\n"
        parts += [header, body]
        pos += len(header)
        if msg["role"] == "assistant":
            spans.append((pos, pos + len(body)))
        pos += len(body)
    return "".join(parts), spans


def tokenize_with_spans(text: str, spans: list[tuple[int, int]], tokenizer: Tokenizer,
                        add_special_tokens: bool) -> tuple[list[int], list[int]]:
    """Token ids of ``text`` and a mask that is 1 on tokens overlapping any span.

    Fast tokenizers tokenize the whole text once (as the serving engine will) and map spans
    through character offsets; slow ones tokenize span by span.
    """
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        mask = []
        for start, end in enc["offset_mapping"]:
            inside = end > start and any(start < b and end > a for a, b in spans)
            mask.append(1 if inside else 0)
        return ids, mask
    ids, mask, pos = [], [], 0
    pieces = []
    for a, b in spans:
        pieces += [(text[pos:a], 0), (text[a:b], 1)]
        pos = b
    pieces.append((text[pos:], 0))
    if add_special_tokens:
        ids = list(tokenizer("", add_special_tokens=True)["input_ids"])
        mask = [0] * len(ids)
    for piece, flag in pieces:
        if piece:
            piece_ids = list(tokenizer(piece, add_special_tokens=False)["input_ids"])
            ids += piece_ids
            mask += [flag] * len(piece_ids)
    return ids, mask


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


def scan(path: str | Path, tokenizer: Tokenizer, limits: Limits, owns: Any = None) -> ScanResult:
    """Validate every owned row (``owns(index) -> bool``, default all) and fingerprint the file.

    Keeps only lengths, not token ids, so memory stays small for any dataset size.
    """
    from array import array

    hasher = hashlib.sha256()
    rows, lengths = array("q"), array("q")
    rejects: list[Reject] = []
    result = ScanResult()
    for index, line_no, raw in iter_lines(path, hasher):
        result.lines = index + 1
        if owns is not None and not owns(index):
            continue
        parsed = parse_row(raw, index, tokenizer, limits, line_no)
        if isinstance(parsed, Reject):
            rejects.append(parsed)
        else:
            rows.append(index)
            lengths.append(len(parsed.input_ids))
            result.truncated += parsed.truncated
    result.rows, result.lengths, result.rejects = rows, lengths, rejects  # type: ignore[assignment]
    result.sha256 = hasher.hexdigest()
    return result


def iter_rows(path: str | Path, tokenizer: Tokenizer, limits: Limits, wanted: Any) -> Iterator[Row]:
    """Valid rows whose index is in ``wanted`` (a container), tokenized again, in file order."""
    for index, line_no, raw in iter_lines(path):
        if index in wanted:
            parsed = parse_row(raw, index, tokenizer, limits, line_no)
            if isinstance(parsed, Row):
                yield parsed
