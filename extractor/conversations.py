"""Conversations as the model sees them: messages in OpenAI or ShareGPT names normalized, rendered
with the tokenizer's chat template (or the plain fallback format), and the loss mask over the
assistant turns' tokens. Nothing here imports torch: the tokenizer is passed in.
"""

from __future__ import annotations

import bisect
import itertools
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


Spans = list[tuple[int, int]]


class RowError(ValueError):
    """A row is bad; the message is the reason written to rejects.jsonl."""


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
        if isinstance(content, list) and any(isinstance(part, dict) and str(part.get("type", "")).startswith(
                ("image", "video")) for part in content):
            raise RowError(f"message {n}: image or video content is not extracted (only the target's text "
                           "decoder runs); give text content")
        if not isinstance(content, str):
            raise RowError(f"message {n}: field '{names[1]}' must be a string")
        canonical = ROLE_NAMES.get(role.lower())
        if canonical is None:
            raise RowError(f"unknown role {role!r} in message {n} "
                           "(use system, user/human, assistant/gpt, tool)")
        out.append({"role": canonical, "content": content})
    return out


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
        return list(enc["input_ids"]), span_mask(enc["offset_mapping"], spans)
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


def span_mask(offsets: Any, spans: Spans) -> list[int]:
    """1 for each (start, end) character range that overlaps a span, else 0 (empty ranges: 0)."""
    ordered = all(a <= b for a, b in spans) and all(x[1] <= y[0] for x, y in itertools.pairwise(spans))
    if not ordered:
        return [1 if end > start and any(start < b and end > a for a, b in spans) else 0
                for start, end in offsets]
    ends = [b for _, b in spans]
    mask = []
    for start, end in offsets:
        j = bisect.bisect_right(ends, start)  # the first span ending after this token starts
        mask.append(1 if end > start and j < len(spans) and spans[j][0] < end else 0)
    return mask
