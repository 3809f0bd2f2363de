"""A source row as `hsmon regenerate` sees it: its conversation, where answers are generated, the
prompts the target reads (its own chat template) and the row it becomes.

A row is ``{"conversations": [...]}`` (or ``"messages"``) with OpenAI or ShareGPT names, as `hsmon
extract` reads it (extractor/conversations.py). Each assistant turn is answered again, in order,
given the target's own earlier answers; system turns are kept; a conversation that ends with a user
turn gets an answer appended. Rejected with a reason: a row that is not JSON, that has no user turn,
that starts with an assistant turn, that has tool turns (a new answer would not match the tool
results after it), and text or pre-tokenized rows (no turns to answer). Nothing here imports torch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from extractor.conversations import RowError, Tokenizer, normalize_messages
from extractor.dataset import json_object

THINK_END = "</think>"
THINK_START = "<think>"
REASONING_MODES = ("save", "drop", "disable")


@dataclass
class Source:
    """A source row that can be regenerated."""

    index: int
    line: int
    row_id: str  # the row's "id" when it has one, else its index: the seed is derived from it
    messages: list[dict[str, str]]  # normalized (role: system | user | assistant)
    answer_at: list[int]  # where answers go: an assistant turn's position, or len(messages) (appended)
    extra: dict[str, Any] = field(default_factory=dict)  # the row's other fields, kept as they are


def parse_source(raw: bytes, index: int) -> Source:
    """The row of one raw line; RowError says why it cannot be regenerated."""
    obj = json_object(raw)
    key = next((k for k in ("conversations", "messages") if k in obj), None)
    if key is None:
        what = ("a pre-tokenized row (input_ids)" if "input_ids" in obj
                else "a text row" if "text" in obj else "a row without 'conversations' or 'messages'")
        raise RowError(f"no user turn: {what} has no turns to answer; give "
                       '{"conversations": [{"role": "user", "content": ...}, ...]}')
    messages = normalize_messages(obj[key], key)
    answer_at = answer_places(messages)
    extra = {k: v for k, v in obj.items() if k not in ("conversations", "messages")}
    row_id = obj.get("id")
    return Source(index, 0, str(row_id) if isinstance(row_id, (str, int)) else str(index), messages,
                  answer_at, extra)


def answer_places(messages: list[dict[str, str]]) -> list[int]:
    """Where the answers go (each assistant turn; after a last user turn); RowError for a
    conversation that cannot be answered turn by turn."""
    roles = [m["role"] for m in messages]
    if "tool" in roles:
        raise RowError(f"tool turn at message {roles.index('tool')}: a regenerated answer would not "
                       "match the tool results after it; give conversations without tool turns")
    if "user" not in roles:
        raise RowError("no user turn: nothing to answer")
    first = next(i for i, role in enumerate(roles) if role != "system")
    if roles[first] == "assistant":
        raise RowError(f"starts with an assistant turn (message {first}) before any user turn")
    places = [i for i, role in enumerate(roles) if role == "assistant"]
    if roles[-1] == "user":
        places.append(len(messages))
    return places


def render_prompt(history: list[dict[str, str]], tokenizer: Tokenizer,
                  template_kwargs: dict[str, Any]) -> list[int]:
    """The token ids the target reads before its answer: ``history`` in its chat template, with
    the generation prompt (as `hsmon extract` renders it: the template's own special tokens)."""
    text = tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=True,
                                         **template_kwargs)
    return list(tokenizer(str(text), add_special_tokens=False)["input_ids"])


def source_tokens(source: Source, place: int, tokenizer: Tokenizer) -> int | None:
    """Tokens of the source's answer at ``place`` (None: an appended answer, the source had none)."""
    if place >= len(source.messages):
        return None
    return len(tokenizer(source.messages[place]["content"], add_special_tokens=False)["input_ids"])


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning, answer) of a generated text: what comes before ``</think>`` is the reasoning
    (its ``<think>`` removed); None when the text has no reasoning block."""
    if THINK_END not in text:
        return None, text
    reasoning, answer = text.split(THINK_END, 1)
    return reasoning.replace(THINK_START, "", 1).strip(), answer.lstrip("\n")


def turn_seed(base: int, row_id: str, place: int) -> int:
    """The seed of one answer: from ``--seed``, the row's id and the answer's place (63 bits, what
    torch and SGLang's ``sampling_seed`` both take): a resumed or repeated row draws the same."""
    digest = hashlib.sha256(f"{base}:{row_id}:{place}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def output_row(source: Source, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The regenerated row: the source's other fields (its id first), then the conversation."""
    row = dict(source.extra)
    row["conversations"] = messages
    return row


def end_of_turn_ids(tokenizer: Any, eos: Any) -> list[int]:
    """The ids that end an answer: the model's end-of-sequence id(s) (``eos``: its generation
    config's, an int or a list), the tokenizer's, and the special token the chat template closes an
    assistant turn with (Llama 3's <|eot_id|>, ChatML's <|im_end|>, the embedded target's <|end|>)."""
    ids: list[int] = []
    for value in (eos if isinstance(eos, list) else [eos]) + [getattr(tokenizer, "eos_token_id", None)]:
        if isinstance(value, int) and value not in ids:
            ids.append(value)
    mark = "\u2063hsmon\u2063"
    try:
        text = str(tokenizer.apply_chat_template(
            [{"role": "user", "content": "?"}, {"role": "assistant", "content": mark}], tokenize=False))
    except Exception:  # a template that cannot render this: the eos ids alone
        return ids
    after = text.split(mark, 1)[1] if mark in text else ""
    closing = list(tokenizer(after, add_special_tokens=False)["input_ids"])[:1] if after else []
    special = set(getattr(tokenizer, "all_special_ids", []) or []) | set(
        getattr(tokenizer, "added_tokens_decoder", {}) or {})
    ids += [i for i in closing if i in special and i not in ids]
    return ids
