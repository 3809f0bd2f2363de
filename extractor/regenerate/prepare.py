"""Everything `hsmon regenerate` knows before an answer is drawn: options and inputs checked, the
target's tokenizer, chat template and end-of-turn ids, the dataset scanned, what an earlier run of the
same command already committed, and the hold on ``--out``.

Resume rule: the same command goes on after the last row its manifest records; a run with other
settings (dataset content, model, engine, sampling, seed, reasoning, truncated rule, end-of-turn ids)
is refused, because its answers would not be the ones already written. The servers, their number,
the concurrency, threads and heartbeat may change.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from extractor import dataset as ds
from extractor.conversations import RowError
from extractor.errors import UsageError
from extractor.prepare import binding_settings, check_out_events_model, model_fingerprint, resolve_model
from extractor.regenerate import turns
from extractor.regenerate.engines import Sampling
from extractor.scan_cache import ScanLog
from hsmon.contracts import regen_layout, writer_lock
from hsmon.contracts.regen_layout import RegenTotals
from hsmon.contracts.units import format_bytes, parse_size
from hsmon.contracts.writer_lock import WriterLock

RESUME_KEYS = ("dataset_sha256", "model_fingerprint", "engine", "dtype", "sampling", "seed", "reasoning",
               "truncated")
SEED_RULE = "sha256('{seed}:{row id}:{answer place}'), first 63 bits; row id: the row's 'id', else its number"
SCAN_BATCH = 256  # source answers tokenized in one call


@dataclass
class Scan:
    """What a first pass over the dataset found."""

    lines: int = 0
    rejects: list[ds.Reject] = field(default_factory=list)
    answers: int = 0  # answers to generate in the valid rows
    source_tokens: int = 0  # the source's answers, each cut at --max-new-tokens
    sha256: str = ""

    @property
    def rows(self) -> int:
        return self.lines - len(self.rejects)


@dataclass
class Prepared:
    """What the run needs before any answer is drawn."""

    data: Path
    out: Path
    model_dir: Path
    job: str
    tokenizer: Any
    config: Any
    sampling: Sampling
    template_kwargs: dict[str, Any]
    scan: Scan
    settings: dict[str, Any]
    totals: RegenTotals  # what earlier runs committed
    min_free: int
    lock: WriterLock | None = None


def prepare(args: argparse.Namespace) -> Prepared:
    """Check options and inputs, scan the dataset, read what is already done; UsageError on bad input."""
    data, min_free = _check_arguments(args)
    import torch
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = resolve_model(args.model)
    config = AutoConfig.from_pretrained(str(model_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if not getattr(tokenizer, "chat_template", None):
        raise UsageError(f"--model {model_dir}: its tokenizer has no chat template, which renders the "
                         "prompts the target answers; give a model whose tokenizer_config.json has a "
                         "chat_template")
    try:
        eos = GenerationConfig.from_pretrained(str(model_dir)).eos_token_id
    except OSError:  # no generation_config.json: the config's own
        eos = getattr(config, "eos_token_id", None)
    stop_ids = tuple(turns.end_of_turn_ids(tokenizer, eos))
    if not stop_ids:
        raise UsageError(f"--model {model_dir}: no end-of-turn token found (no eos_token_id in its configs, "
                         "none closing an assistant turn in its chat template); give a model that has one")
    sampling = Sampling(args.temperature, args.top_p, args.max_new_tokens, stop_ids)
    template_kwargs = {"enable_thinking": False} if args.reasoning == "disable" else {}
    scan = scan_dataset(data, tokenizer, args.max_new_tokens)
    if scan.lines == 0:
        raise UsageError(f"dataset {data} has no rows (expected JSON Lines: one object per line)")
    if scan.rows == 0:
        first = scan.rejects[0]
        raise UsageError(f"no row of {data} can be regenerated: all {len(scan.rejects)} rejected (row "
                         f"{first.index}, line {first.line}: {first.reason})")
    out = Path(args.out)
    fingerprint = model_fingerprint(model_dir)
    settings = {
        "dataset": str(data.resolve()), "dataset_sha256": scan.sha256, "model": str(model_dir.resolve()),
        "model_fingerprint": fingerprint, "engine": args.backend,
        "dtype": _hf_dtype(args) if args.backend == "hf" else "server", "sampling": sampling.record(),
        "seed": args.seed, "reasoning": args.reasoning, "truncated": args.truncated,
    }
    lock = None
    if not args.dry_run:  # every refusal above leaves no --out behind
        lock = _lock(out)
        check_resume(out, settings)
    totals = regen_layout.read_totals(out)
    if totals.committed != totals.last_row + 1:
        raise UsageError(f"{out / regen_layout.MANIFEST_NAME}: records {totals.committed} rows but its last "
                         f"is row {totals.last_row}: not a manifest hsmon regenerate wrote; use a new --out")
    return Prepared(data, out, model_dir, args.job or _job_name(out), tokenizer, config, sampling,
                    template_kwargs, scan, settings, totals, min_free, lock)


def _check_arguments(args: argparse.Namespace) -> tuple[Path, int]:
    """The checks that need no model: (dataset path, --min-free in bytes); raises UsageError."""
    data = Path(args.data)
    if not data.is_file():
        raise UsageError(f"dataset {data} not found (give a JSON Lines file of conversations, one row per "
                         "line)")
    try:
        min_free = parse_size(args.min_free)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens {args.max_new_tokens}: give at least 1")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        raise UsageError("--temperature must be >= 0 (0: greedy) and --top-p in (0, 1]")
    if args.concurrency < 0:
        raise UsageError(f"--concurrency {args.concurrency}: give 0 (chosen from the servers' info) or more")
    check_out_events_model(args)
    return data, min_free


def _lock(out: Path) -> WriterLock:
    try:
        return writer_lock.acquire(out, regen_layout.LOCK_NAME, "hsmon regenerate", "--out")
    except writer_lock.OutputLocked as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"--out {out}: {exc.strerror or exc} (give a directory you can write)") from None


def _hf_dtype(args: argparse.Namespace) -> str:
    """The dtype the in-process engine computes in (--dtype auto resolved), one line on a bad one."""
    from extractor.backends.hf import resolve_device, resolve_dtype

    try:
        return str(resolve_dtype(args.dtype, resolve_device(args.device))).removeprefix("torch.")
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _job_name(out: Path) -> str:
    name = out.resolve().name
    return name if name.startswith("regenerate") else f"regenerate-{name}"


def scan_dataset(data: Path, tokenizer: Any, max_new_tokens: int) -> Scan:
    """Every row checked (a reject says why), the file fingerprinted, the source's answer tokens
    counted (each cut at ``max_new_tokens``: the answers' length as the run will see them)."""
    hasher = hashlib.sha256()
    scan = Scan()
    pending: list[str] = []
    said, read = ScanLog(data), 0
    for index, line_no, raw in ds.iter_lines(data, hasher):
        scan.lines = index + 1
        read += len(raw)
        try:
            source = turns.parse_source(raw, index)
        except RowError as exc:
            scan.rejects.append(ds.Reject(index, str(exc), line_no))
            continue
        scan.answers += len(source.answer_at)
        pending += [source.messages[p]["content"] for p in source.answer_at if p < len(source.messages)]
        if len(pending) >= SCAN_BATCH:
            scan.source_tokens += _count(tokenizer, pending, max_new_tokens)
            pending.clear()
            said(scan.lines, read)
    scan.source_tokens += _count(tokenizer, pending, max_new_tokens)
    scan.sha256 = hasher.hexdigest()
    return scan


def _count(tokenizer: Any, texts: list[str], cap: int) -> int:
    if not texts:
        return 0
    return sum(min(cap, len(ids)) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])


def check_resume(out: Path, settings: dict[str, Any]) -> None:
    """Refuse to go on with a run whose committed rows were made with other settings."""
    path = out / regen_layout.MANIFEST_NAME
    old = binding_settings(path) if path.exists() else None
    if old is None:
        return
    for key in RESUME_KEYS:
        if old.get(key) != settings[key]:
            raise UsageError(f"{out} was started with different settings ({key}: {old.get(key)!r}, now "
                             f"{settings[key]!r}); resume with the same command, or use a new --out")


def dry_run(prep: Prepared) -> int:
    """Print the rows, the answers to generate and the source's answer tokens; exit 0."""
    scan, done = prep.scan, prep.totals.committed
    free = shutil.disk_usage(prep.out if prep.out.exists() else Path.cwd()).free
    print(f"dataset {prep.data}: {scan.lines} rows, {scan.rows} to regenerate, {len(scan.rejects)} rejected; "
          f"{done} committed by an earlier run")
    print(f"answers {scan.answers}, the source's {scan.source_tokens} tokens (each cut at --max-new-tokens "
          f"{prep.sampling.max_new_tokens}); end-of-turn ids {list(prep.sampling.stop_ids)}")
    print(f"output {prep.out}: {format_bytes(free)} free")
    print(f"RESULT rows={scan.rows} answers={scan.answers} source_tokens={scan.source_tokens} "
          f"rejects={len(scan.rejects)}")
    return 0
