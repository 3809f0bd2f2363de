"""The embedded default target: a small Llama model made from Python's own standard library.

`hsmon extract` uses it when no ``--model`` is given, so that extraction, drafter training and
the demo run on any machine without a model hub. Everything is made here, from local text:

* corpus and tokenizer (`extractor.target_text`): the ``.py`` files of the running interpreter's
  standard library (tests excluded; a tenth held out for evaluation), byte-level BPE of 2048 tokens
  and a chat template whose assistant turns are marked for loss masks;
* model (`extractor.target_training`): `LlamaForCausalLM`, 8 layers (EAGLE-3 capture points 2, 4,
  5), hidden size 128, trained on CPU for a time budget, the schedule following elapsed time.

A built copy ships in ``extractor/embedded/``; `ensure_embedded_target` returns it, or builds one
into a cache directory when it is absent. ``hsmon make-target`` (`extractor.make_target`) rebuilds
on demand.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from extractor.target_text import (
    conversation_texts,
    corpus_files,
    document_stream,
    make_tokenizer_config_portable,
    read_texts,
    spread_order,
    stdlib_dir,
    train_tokenizer,
    wrap_tokenizer,
)
from extractor.target_training import (
    TargetSpec,
    auto_threads,
    bigram_init,
    bigram_loss,
    make_config,
    model_loss,
    predicted_positions,
    train_model,
    unigram_loss,
)

SHIPPED_DIR = Path(__file__).resolve().parent / "embedded"
CACHE_SUBDIR = "embedded-target"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
BUILD_INFO = "build_info.json"


@dataclass
class BuildResult:
    """What a build did and how well the model predicts held-out code."""

    out_dir: str
    seed: int
    seconds_budget: float
    seconds_total: float
    steps: int
    train_tokens_seen: int
    corpus_files_train: int
    corpus_files_heldout: int
    heldout_tokens: int
    heldout_loss: float
    unigram_loss: float
    bigram_loss: float
    python_version: str
    num_threads: int


# ---------------------------------------------------------------------------------------------
# Build and locate.


def build_target(
    out_dir: Path,
    seconds: float = 150.0,
    seed: int = 0,
    spec: TargetSpec | None = None,
    num_threads: int | None = None,
    log: Any = None,
) -> BuildResult:
    """Build the embedded target into ``out_dir`` (replaced atomically) within about ``seconds``.

    ``seconds`` covers the whole build; training gets what corpus reading, tokenizer training,
    evaluation and saving leave of it.
    """
    import torch
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    spec = spec or TargetSpec()
    say = log or (lambda message: None)
    began = time.monotonic()
    num_threads = num_threads or auto_threads()
    torch.set_num_threads(num_threads)
    torch.manual_seed(seed)

    train_files, heldout_files = corpus_files()
    ordered = spread_order(train_files, seed)
    train_texts = read_texts(ordered, spec.train_chars)
    chat_texts = conversation_texts(ordered, spec.chat_chars)
    heldout_texts = read_texts(heldout_files, max_chars=spec.eval_tokens * 8)
    say(f"corpus: {len(train_files)} train files, {len(heldout_files)} held-out files ({stdlib_dir()})")

    tokenizer = train_tokenizer(_prefix_by_chars(train_texts, spec.tokenizer_chars), spec.vocab_size)
    train_stream = document_stream(tokenizer, train_texts + chat_texts)
    eval_ids = document_stream(tokenizer, heldout_texts)[: spec.eval_tokens]
    say(
        f"tokenizer: vocab {tokenizer.get_vocab_size()}, "
        f"{len(train_stream)} train tokens ({len(chat_texts)} chat documents), {len(eval_ids)} held-out"
    )

    config = make_config(spec, tokenizer)
    model = LlamaForCausalLM(config)
    bigram_init(model, train_stream, spec.vocab_size, spec.bigram_prior)
    # Reserve time for evaluation and saving (about 10 % of the budget, at least a few seconds).
    reserve = max(4.0, 0.08 * seconds)
    train_seconds = max(0.0, seconds - (time.monotonic() - began) - reserve)
    say(f"training for {train_seconds:.0f} s on {num_threads} threads")
    steps, seen = train_model(model, train_stream, spec, train_seconds, seed)

    say(f"trained {steps} steps in {time.monotonic() - began:.1f} s since start")
    heldout = model_loss(model, eval_ids, spec.seq_len)
    say(f"evaluated at {time.monotonic() - began:.1f} s")
    scored = predicted_positions(eval_ids, spec.seq_len)
    unigram = unigram_loss(train_stream, scored, spec.vocab_size)
    bigram = bigram_loss(train_stream, eval_ids, spec.seq_len, spec.vocab_size, spec.bigram_prior)

    result = BuildResult(
        out_dir=str(out_dir),
        seed=seed,
        seconds_budget=seconds,
        seconds_total=0.0,
        steps=steps,
        train_tokens_seen=seen,
        corpus_files_train=len(train_files),
        corpus_files_heldout=len(heldout_files),
        heldout_tokens=len(eval_ids),
        heldout_loss=round(heldout, 4),
        unigram_loss=round(unigram, 4),
        bigram_loss=round(bigram, 4),
        python_version=sys.version.split()[0],
        num_threads=num_threads,
    )
    _save(model, tokenizer, spec, result, Path(out_dir), began)
    return result


def _save(model: Any, tokenizer: Any, spec: TargetSpec, result: BuildResult, out_dir: Path,
          began: float) -> None:
    """Write the model, its tokenizer and BUILD_INFO to a staging folder, then replace ``out_dir``."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        wrap_tokenizer(tokenizer, spec.max_positions).save_pretrained(staging)
        make_tokenizer_config_portable(staging)
        result.seconds_total = round(time.monotonic() - began, 1)
        info = {**asdict(result), "spec": asdict(spec)}
        info.pop("out_dir")
        (staging / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")
        # mkdtemp makes the folder private; the model is meant to be readable like any package data.
        staging.chmod(0o755)
        for item in staging.iterdir():
            item.chmod(0o644)
        _replace_dir(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _prefix_by_chars(texts: Sequence[str], max_chars: int) -> Iterator[str]:
    total = 0
    for text in texts:
        if total >= max_chars:
            return
        yield text
        total += len(text)


def _replace_dir(staging: Path, out_dir: Path) -> None:
    """Put ``staging``'s files into ``out_dir`` (renames), keeping other files already there."""
    if not out_dir.is_dir():
        os.replace(staging, out_dir)
        return
    for item in staging.iterdir():
        os.replace(item, out_dir / item.name)
    staging.rmdir()


def is_complete(directory: Path) -> bool:
    """Whether ``directory`` holds a whole built target (weights present, not a Git LFS pointer)."""
    if not all((directory / name).is_file() for name in REQUIRED_FILES):
        return False
    # A clone without LFS (or a truncated copy) leaves a stub of a few hundred bytes.
    return (directory / "model.safetensors").stat().st_size > 100_000


def default_cache_dir() -> Path:
    """$HSMON_CACHE, else ~/.cache/hsmon."""
    env = os.environ.get("HSMON_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "hsmon"


def ensure_embedded_target(cache_dir: Path | None = None, *, prefer_shipped: bool = True) -> Path:
    """Local Hugging Face directory of the embedded target: the shipped copy, else a cached build.

    When neither exists the target is built into ``cache_dir`` (default `default_cache_dir`),
    under a file lock so that concurrent callers build it once.
    """
    if prefer_shipped and is_complete(SHIPPED_DIR):
        return SHIPPED_DIR
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache / CACHE_SUBDIR
    if is_complete(target):
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{CACHE_SUBDIR}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_complete(target):
            print(
                f"hsmon: building the embedded target model into {target} (about 2-3 minutes)",
                file=sys.stderr,
            )
            build_target(target, log=lambda m: print(f"hsmon: {m}", file=sys.stderr))
        with contextlib.suppress(OSError):
            fcntl.flock(lock, fcntl.LOCK_UN)
    return target
