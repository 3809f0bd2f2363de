"""The row times of bench/soak.py's writers (bench/_soak_writer.py ``--workload``).

- ``easy``: lengths uniform over 200-4000 tokens and a row's time its tokens over the rate (+-30 %
  noise): a token-rate ETA's best case.
- ``real``: the length mix of a real dataset and the row time of a real engine. Lengths: the
  demo's sample (`hsmon.demo.prepare`: Python standard-library functions as chat rows, tokenized
  by the embedded target's tokenizer), scaled to the soak's mean of 2,100 tokens (the mix's shape
  kept: its long tail and its short rows). Time: a prefill that grows faster than the tokens (x
  (1 + n/4096), attention's share; normalised so that the mean rate stays the rate), +-30 %
  noise, and slowdowns: after any row a 3 % chance of 5-40 s in which every row takes 2-4x as
  long (another tenant on the accelerator, a cache eviction storm, a preempted server).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

MEAN_TOKENS = 2100
ATTENTION_TOKENS = 4096


def real_lengths(path: Path) -> Path:
    """Write the real mix (one length a line) to ``path`` once; returns it."""
    if path.exists():
        return path
    import json

    from transformers import AutoTokenizer

    from hsmon.demo.prepare import prepare

    setup = prepare(path.parent / "soak-demo-sample", "embedded")
    tokenizer = AutoTokenizer.from_pretrained(setup["model"])
    raw = []
    for line in Path(setup["data"]).read_text().splitlines():
        text = "\n".join(m["content"] for m in json.loads(line)["messages"])
        raw.append(len(tokenizer(text).input_ids))
    mean = sum(raw) / len(raw)
    path.write_text("".join(f"{max(16, round(n * MEAN_TOKENS / mean))}\n" for n in raw))
    return path


class RowTimes:
    """Lengths and per-row seconds of one writer (seeded: the same job, the same rows)."""

    def __init__(self, workload: str, rows: int, seed: int, rate: float, lengths_file: str | None) -> None:
        self.rng, self.rate, self.workload = random.Random(seed), rate, workload
        if workload == "real":
            assert lengths_file, "--workload real needs --lengths FILE"
            mix = [int(x) for x in Path(lengths_file).read_text().split()]
            self.lengths = [self.rng.choice(mix) for _ in range(rows)]
            mean = sum(mix) / len(mix)
            self.norm = sum(n * (1 + n / ATTENTION_TOKENS) for n in mix) / len(mix) / mean
        else:
            self.lengths = [self.rng.randint(200, 4000) for _ in range(rows)]
            self.norm = 1.0
        self.slow_until, self.slow_factor = 0.0, 1.0

    def seconds(self, tokens: int) -> float:
        noise = self.rng.uniform(0.7, 1.3)
        if self.workload != "real":
            return tokens / self.rate * noise
        now = time.monotonic()
        if now >= self.slow_until and self.rng.random() < 0.03:
            self.slow_until, self.slow_factor = now + self.rng.uniform(5, 40), self.rng.uniform(2, 4)
        slow = self.slow_factor if now < self.slow_until else 1.0
        return tokens * (1 + tokens / ATTENTION_TOKENS) / self.norm / self.rate * noise * slow
