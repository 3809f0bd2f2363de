"""The embedded default target: a small Llama model made from Python's own standard library.

`hsmon extract` uses it when no ``--model`` is given, so that extraction, drafter training and
the demo run on any machine without a model hub. Everything is made here, from local text:

* corpus: the ``.py`` files of the running interpreter's standard library (tests excluded), in
  sorted order; files whose CRC-32 of the relative path is ``0 mod 10`` are held out for evaluation;
* tokenizer: byte-level BPE (the `tokenizers` library), vocabulary 2048, with the special tokens
  below and a chat template (`CHAT_TEMPLATE`) whose assistant turns are marked for loss masks;
* model: `LlamaForCausalLM`, 8 layers (EAGLE-3 capture points 2, 4, 5), hidden size 128, trained
  on CPU for a time budget, the learning-rate schedule following elapsed time.

A built copy ships in ``extractor/embedded/``; `ensure_embedded_target` returns it, or builds one
into a cache directory when it is absent. ``hsmon make-target`` rebuilds on demand.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import fcntl
import json
import math
import os
import random
import shutil
import sys
import sysconfig
import tempfile
import textwrap
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SHIPPED_DIR = Path(__file__).resolve().parent / "embedded"
CACHE_SUBDIR = "embedded-target"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
BUILD_INFO = "build_info.json"

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
SYSTEM, USER, ASSISTANT, END = "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"
SPECIAL_TOKENS = (PAD, BOS, EOS, SYSTEM, USER, ASSISTANT, END)

# Roles: OpenAI names and their ShareGPT aliases. Assistant content and its closing <|end|> sit
# inside {% generation %}, so apply_chat_template(..., return_assistant_tokens_mask=True) gives
# the loss mask. The role tokens themselves are never in the mask.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% set role = message['role'] if 'role' in message else message['from'] %}"
    "{% set content = message['content'] if 'content' in message else message['value'] %}"
    "{% if role == 'system' %}<|system|>{{ content }}<|end|>"
    "{% elif role in ('user', 'human') %}<|user|>{{ content }}<|end|>"
    "{% elif role in ('assistant', 'gpt') %}<|assistant|>"
    "{% generation %}{{ content }}<|end|>{% endgeneration %}"
    "{% else %}{{ raise_exception('unknown role: ' + role) }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

HELDOUT_MODULUS = 10
MAX_FILE_BYTES = 200_000
EXCLUDED_DIRS = frozenset({"test", "tests", "site-packages", "dist-packages", "idle_test"})


@dataclass(frozen=True)
class TargetSpec:
    """Shape and training settings of the embedded target."""

    vocab_size: int = 2048
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 8
    num_heads: int = 4
    num_kv_heads: int = 2
    max_positions: int = 2048
    seq_len: int = 256
    batch_size: int = 4
    learning_rate: float = 5e-3
    warmup_steps: int = 10
    tokenizer_chars: int = 3_000_000
    train_chars: int = 4_000_000
    chat_chars: int = 600_000
    bigram_prior: float = 20.0
    eval_tokens: int = 8192


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
# Corpus: pure selection logic plus file reading.


def stdlib_dir() -> Path:
    """The running interpreter's standard-library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relpath: str) -> bool:
    """Whether a corpus file (by its path relative to the stdlib) is held out for evaluation."""
    return zlib.crc32(relpath.encode()) % HELDOUT_MODULUS == 0


def corpus_files(root: Path | None = None) -> tuple[list[Path], list[Path]]:
    """(train, heldout) standard-library source files, each list in sorted relative-path order."""
    root = root or stdlib_dir()
    train: list[Path] = []
    heldout: list[Path] = []
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root).as_posix()
        parts = rel.split("/")
        if any(part in EXCLUDED_DIRS for part in parts[:-1]) or parts[-1].startswith("test_"):
            continue
        try:
            if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
                continue
        except OSError:
            continue
        (heldout if is_heldout(rel) else train).append(path)
    if not train or not heldout:
        raise RuntimeError(f"no Python sources found under {root}; the embedded target needs the stdlib")
    return train, heldout


def read_texts(paths: Sequence[Path], max_chars: int) -> list[str]:
    """UTF-8 texts of ``paths`` in order, until ``max_chars`` are gathered; unreadable files skipped."""
    texts: list[str] = []
    total = 0
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if not text.strip():
            continue
        texts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return texts


def render_chat(messages: Sequence[dict[str, str]]) -> str:
    """`CHAT_TEMPLATE` rendered in plain Python (OpenAI-style messages), without the leading bos."""
    opening = {"system": SYSTEM, "user": USER, "assistant": ASSISTANT}
    return "".join(f"{opening[m['role']]}{m['content']}{END}" for m in messages)


def conversation_texts(paths: Sequence[Path], max_chars: int) -> list[str]:
    """Chat-formatted training documents: a function's docstring asks, its source answers.

    They teach the model the chat layout, so `{"conversations": ...}` rows get structured
    predictions too.
    """
    texts: list[str] = []
    total = 0
    for path in paths:
        if total >= max_chars:
            break
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        lines = source.splitlines(keepends=True)
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            doc = ast.get_docstring(node)
            # Slicing lines, not ast.get_source_segment: that one re-splits the file per call.
            code = textwrap.dedent("".join(lines[node.lineno - 1 : node.end_lineno or node.lineno])).rstrip()
            if not doc or not code or len(code) > 4000:
                continue
            request = doc.strip().split("\n\n")[0].strip()
            text = render_chat(
                [
                    {"role": "user", "content": f"Write a Python function `{node.name}`: {request}"},
                    {"role": "assistant", "content": code},
                ]
            )
            texts.append(text)
            total += len(text)
            if total >= max_chars:
                break
    return texts


def spread_order(paths: Sequence[Path], seed: int) -> list[Path]:
    """A seeded shuffle, so that a character budget draws from the whole library, not one corner."""
    shuffled = list(paths)
    random.Random(seed).shuffle(shuffled)
    return shuffled


# ---------------------------------------------------------------------------------------------
# Tokenizer.


def train_tokenizer(texts: Sequence[str], vocab_size: int) -> Any:
    """A byte-level BPE `tokenizers.Tokenizer` trained on ``texts``, special tokens first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def wrap_tokenizer(tokenizer: Any) -> Any:
    """The transformers fast tokenizer around a trained `tokenizers.Tokenizer`, with chat template."""
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[SYSTEM, USER, ASSISTANT, END],
        model_max_length=TargetSpec.max_positions,
        clean_up_tokenization_spaces=False,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def make_tokenizer_config_portable(directory: Path) -> None:
    """Let transformers 4.x load the tokenizer that transformers 5 saved.

    v5 names its own class (``TokenizersBackend``), lists extra special tokens under a key that
    v4 reads as a dict, and keeps the chat template only in ``chat_template.jinja``. The generic
    class name, the v4 key and an inline template load the same in both.
    """
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = config.pop("extra_special_tokens", None)
    if isinstance(extra, list):
        config["additional_special_tokens"] = extra
    config["chat_template"] = CHAT_TEMPLATE
    path.write_text(json.dumps(config, indent=2) + "\n")


def document_stream(tokenizer: Any, texts: Sequence[str]) -> list[int]:
    """Token ids of ``texts`` as one stream: <|bos|> text <|eos|> per document."""
    bos = tokenizer.token_to_id(BOS)
    eos = tokenizer.token_to_id(EOS)
    stream: list[int] = []
    for encoding in tokenizer.encode_batch(list(texts)):
        stream.append(bos)
        stream.extend(encoding.ids)
        stream.append(eos)
    return stream


# ---------------------------------------------------------------------------------------------
# Losses.


def unigram_loss(train_ids: Sequence[int], eval_ids: Sequence[int], vocab_size: int) -> float:
    """Cross-entropy (nats/token) on ``eval_ids`` of an add-one unigram model fit on ``train_ids``."""
    counts = [1.0] * vocab_size
    for token in train_ids:
        counts[token] += 1.0
    total = sum(counts)
    return -sum(math.log(counts[token] / total) for token in eval_ids) / max(1, len(eval_ids))


def model_loss(model: Any, ids: Sequence[int], seq_len: int, batch_size: int = 8) -> float:
    """Mean next-token cross-entropy (nats/token) of ``model`` over ``ids`` cut into ``seq_len`` windows."""
    import torch

    windows = [list(ids[i : i + seq_len]) for i in range(0, len(ids) - 1, seq_len)]
    windows = [w for w in windows if len(w) >= 2]
    total_loss = 0.0
    total_tokens = 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start in range(0, len(windows), batch_size):
            group = windows[start : start + batch_size]
            # Windows of one length share a batch; only the last window may be shorter.
            for same in (group[:-1], group[-1:]) if len(group[-1]) != len(group[0]) else (group,):
                if not same:
                    continue
                batch = torch.tensor(same)
                logits = model(input_ids=batch).logits[:, :-1].float()
                loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum"
                )
                total_loss += float(loss)
                total_tokens += batch[:, 1:].numel()
    model.train(was_training)
    return total_loss / max(1, total_tokens)


def predicted_positions(ids: Sequence[int], seq_len: int) -> list[int]:
    """The ids that `model_loss` scores (every window's tokens but its first), for a fair unigram."""
    scored: list[int] = []
    for i in range(0, len(ids) - 1, seq_len):
        window = ids[i : i + seq_len]
        if len(window) >= 2:
            scored.extend(window[1:])
    return scored


# ---------------------------------------------------------------------------------------------
# Model.


def make_config(spec: TargetSpec, tokenizer: Any) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_positions,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        # Untied: the input embedding and the output head start from the two factors of a
        # low-rank bigram model (see `bigram_init`).
        tie_word_embeddings=False,
        bos_token_id=tokenizer.token_to_id(BOS),
        eos_token_id=tokenizer.token_to_id(EOS),
        pad_token_id=tokenizer.token_to_id(PAD),
        torch_dtype="float32",
    )


def bigram_init(model: Any, stream: Sequence[int], vocab_size: int, prior: float) -> None:
    """Start the model as a low-rank bigram model of ``stream``.

    A randomly initialised model spends most of a short CPU budget learning what a count
    table knows at once; starting from it, training goes straight to using context. The
    centred log-probabilities of a bigram model (smoothed towards the unigram, Dirichlet
    ``prior``) are factored by a truncated SVD: the left factor, rows scaled to RMS 1 as the
    final RMSNorm will see them, becomes the input embedding; the output head is then the
    least-squares fit of the log-probabilities on it.
    """
    import torch

    ids = torch.as_tensor(stream, dtype=torch.long)
    counts = torch.bincount(ids[:-1] * vocab_size + ids[1:], minlength=vocab_size * vocab_size)
    counts = counts.reshape(vocab_size, vocab_size).double()
    unigram = counts.sum(0) + 1.0
    unigram /= unigram.sum()
    logp = ((counts + prior * unigram) / (counts.sum(1, keepdim=True) + prior)).log()
    logp -= logp.mean(1, keepdim=True)
    hidden = model.get_input_embeddings().weight.shape[1]
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(0)
    left, singular, _ = torch.svd_lowrank(logp, q=hidden + 16, niter=4)
    torch.random.set_rng_state(generator_state)
    embed = left[:, :hidden] * singular[:hidden].sqrt()
    embed /= embed.pow(2).mean(1, keepdim=True).sqrt().clamp_min(1e-6)
    head = torch.linalg.lstsq(embed, logp).solution.T
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(embed.float())
        model.get_output_embeddings().weight.copy_(head.float())


def bigram_loss(
    train_ids: Sequence[int], eval_ids: Sequence[int], seq_len: int, vocab_size: int, prior: float
) -> float:
    """Cross-entropy (nats/token) of the smoothed bigram model `bigram_init` starts from.

    Scored on the positions `model_loss` scores: within each ``seq_len`` window of ``eval_ids``.
    """
    import torch

    ids = torch.as_tensor(train_ids, dtype=torch.long)
    counts = torch.bincount(ids[:-1] * vocab_size + ids[1:], minlength=vocab_size * vocab_size)
    counts = counts.reshape(vocab_size, vocab_size).double()
    unigram = counts.sum(0) + 1.0
    unigram /= unigram.sum()
    probs = (counts + prior * unigram) / (counts.sum(1, keepdim=True) + prior)
    prev: list[int] = []
    nxt: list[int] = []
    for i in range(0, len(eval_ids) - 1, seq_len):
        window = list(eval_ids[i : i + seq_len])
        prev += window[:-1]
        nxt += window[1:]
    return float(-probs[torch.tensor(prev), torch.tensor(nxt)].log().mean())


def auto_threads(limit: int = 2) -> int:
    """Up to ``limit`` torch threads, fewer when other work already fills the cores.

    On a busy machine two threads that wait on each other at every operation run several
    times slower than one (measured: 570 vs 3600 tokens/s at load 4 on 2 cores).
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    idle = cores - os.getloadavg()[0]
    return max(1, min(limit, cores, int(idle + 0.5)))


def _lr_at(step: int, progress: float, spec: TargetSpec) -> float:
    """Linear warm-up by step, then cosine decay to 10 % by elapsed fraction of the time budget."""
    warm = min(1.0, (step + 1) / spec.warmup_steps)
    decay = 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return spec.learning_rate * warm * decay


def train_model(
    model: Any, stream: Sequence[int], spec: TargetSpec, seconds: float, seed: int
) -> tuple[int, int]:
    """Train ``model`` on random windows of ``stream`` until ``seconds`` pass; (steps, tokens seen)."""
    import torch

    data = torch.tensor(stream, dtype=torch.long)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=spec.learning_rate, betas=(0.9, 0.95), weight_decay=0.01
    )
    model.train()
    start = time.monotonic()
    steps = 0
    max_start = len(data) - spec.seq_len - 1
    if max_start <= 0:
        raise RuntimeError("training stream shorter than one window; the corpus is too small")
    while True:
        progress = (time.monotonic() - start) / seconds if seconds > 0 else 1.0
        if progress >= 1.0 and steps > 0:
            break
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(steps, progress, spec)
        offsets = torch.randint(0, max_start, (spec.batch_size,), generator=generator)
        batch = torch.stack([data[o : o + spec.seq_len] for o in offsets.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        steps += 1
    return steps, steps * spec.batch_size * spec.seq_len


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
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        wrap_tokenizer(tokenizer).save_pretrained(staging)
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
    return result


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


# ---------------------------------------------------------------------------------------------
# `hsmon make-target`.


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="directory to build into (default: the cache, $HSMON_CACHE or ~/.cache/hsmon, /embedded-target)",
    )
    parser.add_argument("--seconds", type=float, default=150.0, help="whole build time budget (default 150)")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed for initialisation and data order (default 0)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: 2, 1 when the cores are busy)",
    )


def run(args: argparse.Namespace) -> int:
    if args.seconds <= 0:
        print(f"hsmon make-target: --seconds must be positive, got {args.seconds}", file=sys.stderr)
        return 2
    if args.threads is not None and args.threads < 1:
        print(f"hsmon make-target: --threads must be at least 1, got {args.threads}", file=sys.stderr)
        return 2
    out = args.out if args.out is not None else default_cache_dir() / CACHE_SUBDIR
    result = build_target(
        out,
        seconds=args.seconds,
        seed=args.seed,
        num_threads=args.threads,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    print(
        f"built {out} in {result.seconds_total:.1f} s: "
        f"{result.steps} steps, {result.train_tokens_seen} tokens"
    )
    print(
        f"held-out loss: model {result.heldout_loss:.3f} nats/token, "
        f"unigram {result.unigram_loss:.3f}, bigram {result.bigram_loss:.3f} nats/token "
        f"({result.heldout_tokens} held-out tokens)"
    )
    return 0
