"""Greedy speculative decoding with chain drafting, the target in-process (transformers).

Each round the drafter proposes tokens, one target forward verifies them, and the round yields the
accepted drafts plus the target's own next token. `ngram_draft` is the prompt-lookup baseline;
`Target` keeps a KV cache of the prefix it shares with its previous forward.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class DecodeResult:
    tokens: list[int]  # generated tokens (the target's greedy continuation)
    rounds: int  # verifying target forwards
    accepted: int  # drafted tokens accepted


def ngram_draft(tokens: list[int], depth: int, max_n: int) -> list[int]:
    """Prompt lookup: find the latest earlier occurrence of the longest suffix n-gram (n = max_n..1)
    and copy what followed it. The copy may run on into the tokens it is proposing, so a repeating
    pattern is continued to full depth. Empty when no suffix occurred before."""
    size = len(tokens)
    for n in range(min(max_n, size - 1), 0, -1):
        suffix = tokens[size - n :]
        for start in range(size - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                extended = list(tokens)
                for k in range(depth):
                    extended.append(extended[start + n + k])
                return extended[size:]
    return []


class Target:
    """The target in-process: greedy next tokens and the capture-point features of a sequence.

    A KV cache keeps the longest prefix shared with the previous call (a verifying forward after a
    rejected draft crops it back), so each round computes only the tokens it adds, as a serving
    engine does: a 30-layer target then costs a few tokens a round instead of the whole sequence.
    """

    def __init__(self, path: Path, capture_points: list[int]) -> None:
        import torch
        from transformers import AutoModelForCausalLM, DynamicCache

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.points = capture_points
        self.forwards = 0
        self._new_cache = lambda: DynamicCache(config=self.model.config)
        # transformers >= 5.24 names the cache argument `cache` (`past_key_values` is deprecated there)
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._cache: Any = None
        self._tokens: list[int] = []
        self._greedy: Any = None
        self._features: Any = None

    def run(self, tokens: list[int]) -> tuple[Any, Any]:
        """(greedy next token at every position [L], features [1, L, K*H])."""
        torch = self.torch
        self.forwards += 1
        keep = 0
        for a, b in zip(self._tokens, tokens[:-1], strict=False):  # the last token is always computed
            if a != b:
                break
            keep += 1
        if keep == 0 or self._cache is None:
            keep, self._cache = 0, self._new_cache()
        elif keep < len(self._tokens):
            self._cache.crop(keep - len(self._tokens))  # negative: drop that many (transformers 4 and 5)
        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([tokens[keep:]]), use_cache=True,
                             output_hidden_states=True, **{self._cache_arg: self._cache})  # fmt: skip
        features = torch.cat([out.hidden_states[p] for p in self.points], dim=-1)
        greedy = out.logits[0].argmax(-1)
        if keep:
            features = torch.cat([self._features[:, :keep], features], dim=1)
            greedy = torch.cat([self._greedy[:keep], greedy])
        self._tokens, self._greedy, self._features = list(tokens), greedy, features
        return greedy, features


def speculative_decode(
    target: Target, prompt: list[int], max_new: int, draft: Callable[[list[int], Any], list[int]]
) -> DecodeResult:
    """Greedy decoding where ``draft(tokens, features)`` proposes tokens and the target verifies.

    ``tokens`` ends with the target's newest token (its features not computed yet); ``features``
    cover every earlier position.
    """
    greedy, features = target.run(prompt)
    tokens = [*prompt, int(greedy[-1])]
    generated, rounds, accepted = 1, 0, 0
    while generated < max_new:
        proposal = draft(tokens, features[:, : len(tokens) - 1])[: max_new - generated]
        greedy, features = target.run(tokens + proposal)
        base = len(tokens) - 1
        agree = 0
        while agree < len(proposal) and int(greedy[base + agree]) == proposal[agree]:
            agree += 1
        tokens += [*proposal[:agree], int(greedy[base + agree])]
        rounds += 1
        accepted += agree
        generated += agree + 1
    return DecodeResult(tokens[len(prompt) :][:max_new], rounds, accepted)
