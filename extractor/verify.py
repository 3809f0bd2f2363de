"""`hsmon verify-data OUT --against URL`: re-extract a seeded sample of stored rows and compare.

Catches data made by another engine (vLLM against SGLang), another model revision or weights,
another dtype, or other layers: the stored tensors are compared per capture point and for the
last layer with cosine similarity (per token) and max abs difference, under tolerances that fit
the stored dtype. A server capturing other layers than the data's is refused before any row.
Exit status: 0 agree, 1 disagree, 2 bad options or a server that cannot serve the check (or
could not re-extract the sample: the message says why).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
from pathlib import Path
from typing import Any

from extractor.backend_options import VERIFY_OPTIONS, misplaced_option
from hsmon.contracts import layout
from hsmon.contracts.manifest_reader import read_manifest, read_row_records

# (min cosine per token, max abs diff relative to the stored layer's max |x|), per stored dtype.
# fp32: two engines doing the same math agree to ~1e-6; bf16/fp16 round every op (measured
# between SGLang and transformers on bf16 models: cosines stay above 0.99).
TOLERANCES = {"float32": (0.9999, 1e-3), "bfloat16": (0.99, 0.08), "float16": (0.995, 0.02)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", metavar="OUT", help="an `hsmon extract` output directory")
    parser.add_argument("--against", action="append", default=[], metavar="URL",
                        help="SGLang server to re-extract with (repeatable)")
    parser.add_argument("--backend", choices=["sglang", "hf"], default=None,
                        help="sglang (with --against, the default) or hf (in-process with --model)")
    parser.add_argument("--model", metavar="DIR",
                        help="model directory (default: the one the data was made with)")
    parser.add_argument("--sample", type=int, default=8, metavar="N", help="rows to re-extract (default 8)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    parser.add_argument("--chunk", metavar="rows_A-B",
                        help="sample only the rows of this chunk (what `hsmon daemon --verify-every` checks)")
    parser.add_argument("--transport", choices=["json", "shm"], default="json",
                        help="how the server returns the states (default json)")
    parser.add_argument("--dump-dir", metavar="DIR", help="dump directory for --transport shm")
    parser.add_argument("--request-timeout", type=float, default=300.0, metavar="SECONDS")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")


def _fail(message: str) -> int:
    print(f"hsmon verify-data: {message}", file=sys.stderr, flush=True)
    return 2


def compare(stored: Any, fresh: Any) -> dict[str, float]:
    """Cosine per token (min, mean) and max abs difference of two [seq, H] tensors."""
    import torch

    a, b = stored.float(), fresh.float()
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1, eps=1e-12)
    return {"cos_min": float(cos.min()), "cos_mean": float(cos.mean()),
            "max_abs_diff": float((a - b).abs().max()), "max_abs": float(a.abs().max())}


def verdict(stats: dict[str, float], dtype: str) -> bool:
    cos_tol, rel_tol = TOLERANCES.get(dtype, TOLERANCES["bfloat16"])
    return stats["cos_min"] >= cos_tol and stats["max_abs_diff"] <= rel_tol * max(stats["max_abs"], 1.0)


def run(args: argparse.Namespace) -> int:
    """Entry point of `hsmon verify-data`."""
    out = Path(args.out)
    refusal = misplaced_option(args, args.backend or ("sglang" if args.against else "hf"),
                               VERIFY_OPTIONS, add_arguments)
    if refusal is not None:
        return _fail(refusal)
    if not out.is_dir():
        return _fail(f"{out}: no such directory (give the --out of an `hsmon extract` run)")
    manifest = read_manifest(out)
    if manifest is None or not manifest.rows:
        return _fail(f"{out}: no rows recorded (give the --out of an `hsmon extract` run)")
    settings = manifest.runs[0].get("settings", {}) if manifest.runs else {}
    layers = [int(p) for p in settings.get("layers") or []]
    dtype = str(settings.get("dtype") or "float32")
    backend_name = args.backend or ("sglang" if args.against else "hf")
    if backend_name == "sglang" and not args.against:
        return _fail("--backend sglang needs --against URL (or use --backend hf --model DIR)")
    if args.sample < 1:
        return _fail("--sample must be at least 1")
    model = args.model or settings.get("model")
    if not layers or not model or not (Path(model) / "config.json").is_file():
        return _fail(f"cannot tell the data's model or layers from {out}'s manifest; pass --model DIR")
    rows = list(manifest.rows)  # ascending
    if args.chunk:
        bounds = layout.parse_chunk_dir_name(args.chunk)
        rows = [r for r in rows if bounds and bounds[0] <= r < bounds[1]]
        if not rows:
            return _fail(f"--chunk {args.chunk}: no rows of {out} in that chunk; "
                         "give a chunk directory's name")
    sample = sorted(random.Random(args.seed).sample(rows, min(args.sample, len(rows))))
    import torch

    records = read_row_records(out, sample)  # the sample's records, read again from the manifest
    stored_rows = {r: torch.load(out / records[r]["chunk"] / layout.row_file_name(r), weights_only=True)
                   for r in sample}
    longest = max(int(d["input_ids"].shape[0]) for d in stored_rows.values())
    try:
        backend = _backend(backend_name, args, Path(model), layers, dtype, longest)
    except Exception as exc:  # includes PreflightError (a UsageError)
        from extractor.errors import UsageError

        if isinstance(exc, UsageError):
            return _fail(str(exc))
        return _fail(f"cannot start the {backend_name} backend: {type(exc).__name__}: {exc}")
    from extractor.backends.base import RowRejected

    try:
        fresh = backend.extract([stored_rows[r]["input_ids"].tolist() for r in sample], rows=sample)
        refused = [(r, s.reason) for r, s in zip(sample, fresh, strict=True) if isinstance(s, RowRejected)]
        if refused:
            raise RuntimeError(f"row {refused[0][0]}: {refused[0][1]}")
    except Exception as exc:
        print(f"hsmon verify-data: cannot re-extract the sample: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        backend.close()
    per_layer = _compare_rows(sample, stored_rows, fresh, layers)
    results = {name: {**s, "ok": verdict(s, dtype)} for name, s in per_layer.items()}
    agree = all(r["ok"] for r in results.values())
    cos_tol, rel_tol = TOLERANCES.get(dtype, TOLERANCES["bfloat16"])
    report = {"out": str(out), "against": args.against or [f"hf:{model}"], "rows": sample, "dtype": dtype,
              "tolerance": {"cos_min": cos_tol, "max_abs_diff_rel": rel_tol}, "layers": results,
              "verdict": "agree" if agree else "disagree", "chunk": args.chunk,
              "worst_cosine": min(r["cos_min"] for r in results.values()),
              "max_abs_diff": max(r["max_abs_diff"] for r in results.values()),
              "differ": [n for n, r in results.items() if not r["ok"]]}
    if args.json:
        print(json.dumps(report))
    else:
        _print_report(report, results, len(sample))
    return 0 if agree else 1


def _compare_rows(sample: list[int], stored_rows: dict[int, Any], fresh: list[Any],
                  layers: list[int]) -> dict[str, dict[str, float]]:
    """Per layer ("final" and each capture point), the worst of the rows' comparisons."""
    hidden = next(iter(stored_rows.values()))["hidden_state"].shape[-1]
    names = ["final", *[str(p) for p in layers]]
    per_layer: dict[str, dict[str, float]] = {}
    for row, states in zip(sample, fresh, strict=True):
        stored = stored_rows[row]
        pairs = [(stored["hidden_state"][0], states.hidden_state)]
        pairs += [(stored["aux_hidden_state"][0][:, k * hidden:(k + 1) * hidden],
                   states.aux_hidden_state[:, k * hidden:(k + 1) * hidden]) for k in range(len(layers))]
        for name, (a, b) in zip(names, pairs, strict=True):
            stats = compare(a, b) if a.shape == b.shape else {"cos_min": -1.0, "cos_mean": -1.0,
                                                              "max_abs_diff": float("inf"), "max_abs": 0.0}
            old = per_layer.get(name)
            if old is None:
                per_layer[name] = stats
            else:
                old["cos_min"] = min(old["cos_min"], stats["cos_min"])
                old["cos_mean"] = min(old["cos_mean"], stats["cos_mean"])
                old["max_abs_diff"] = max(old["max_abs_diff"], stats["max_abs_diff"])
                old["max_abs"] = max(old["max_abs"], stats["max_abs"])
    return per_layer


def _print_report(report: dict[str, Any], results: dict[str, dict[str, Any]], rows: int) -> None:
    dtype, out = report["dtype"], report["out"]
    cos_tol, rel_tol = report["tolerance"]["cos_min"], report["tolerance"]["max_abs_diff_rel"]
    for name, r in results.items():
        print(f"layer {name:>6}: cosine min {r['cos_min']:.6f} mean {r['cos_mean']:.6f}, max abs diff "
              f"{r['max_abs_diff']:.3g} (max |x| {r['max_abs']:.3g}): {'ok' if r['ok'] else 'DIFFERS'}")
    where = ", ".join(report["against"])
    if report["verdict"] == "agree":
        print(f"verify-data: AGREE: {rows} rows of {out} re-extracted by {where} match ({dtype} "
              f"tolerances: cosine >= {cos_tol}, max abs diff <= {rel_tol} x max |x|)")
    else:
        print(f"verify-data: DISAGREE: layers {', '.join(report['differ'])} of {rows} rows differ from "
              f"{where}: the data was made by another engine, model revision, dtype or layers; "
              "do not train on it for this server (re-extract against it)")


def _backend(name: str, args: argparse.Namespace, model: Path, layers: list[int], dtype: str,
             longest: int) -> Any:
    from extractor.backends import create_backend

    if name == "hf":
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        return create_backend("hf", str(model), capture_points=layers, device="cpu", dtype=dtype)
    from transformers import AutoConfig

    from extractor.backends.base import ModelInfo, RunContext
    from extractor.backends.hf import model_facts
    from extractor.backends.sglang.options import DEFAULT_DUMP_ROOT, SGLangOptions, check_urls
    from extractor.writer import Progress
    from hsmon.contracts import events as ev

    num_layers, hidden, vocab, max_pos = model_facts(AutoConfig.from_pretrained(str(model)))
    info = ModelInfo(num_layers, hidden, vocab, max_pos, dtype, "sglang")
    dump_dir = args.dump_dir or (f"{DEFAULT_DUMP_ROOT}/verify-{os.getpid()}"
                                 if args.transport == "shm" else None)
    options = SGLangOptions(urls=check_urls(args.against), transport=args.transport, dump_dir=dump_dir,
                            request_timeout=args.request_timeout, give_up_after=args.request_timeout,
                            longest_row=longest)
    context = RunContext(ev.EventWriter("verify-data", path=os.devnull), Progress(), threading.Event())
    return create_backend("sglang", str(model), context, capture_points=layers, info=info, options=options)
