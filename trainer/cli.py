"""`hsmon train DATA_DIR --out DIR`: train an EAGLE-3 drafter on extracted hidden states.

Runs as one process, or under torchrun (DDP: NCCL on GPUs, gloo on CPU). Progress goes out as
contract-1 events (stdout or --events FILE); checkpoints to OUT/checkpoints; --resume continues
exactly where the last checkpoint left off. SIGTERM writes a checkpoint, then exits.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hsmon.contracts import train_defaults as defaults
from hsmon.contracts.heldout import DEFAULT_EVAL_FRACTION
from hsmon.contracts.progress_line import is_terminal


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "data_dir",
        metavar="DATA_DIR",
        help="output directory of `hsmon extract` (or any SpecForge-layout rows_*/data_*.ckpt directory)",
    )
    parser.add_argument(
        "--target-model",
        metavar="DIR",
        default=None,
        help="the target's Hugging Face directory (default: the model the data was extracted from, as its "
        "manifest records it, else the embedded target)",
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="where checkpoints and the data index go")
    parser.add_argument("--epochs", type=_positive_int, default=None,
                        help=f"passes over the data (default {defaults.EPOCHS})")
    parser.add_argument(
        "--max-steps",
        type=_positive_int,
        default=None,
        help="stop after N optimizer steps (cycles epochs when --epochs is not given)",
    )
    parser.add_argument(
        "--arch",
        choices=("eagle3", "eagle3.1"),
        default=None,
        help="drafter architecture: eagle3, or eagle3.1 (per-layer fc_norm before fc, post-norm "
             "hidden state fed to the next draft step); default eagle3.1, on --resume the checkpoint's",
    )
    parser.add_argument("--ttt-length", type=_positive_int, default=defaults.TTT_LENGTH,
                        help="training-time-test unroll steps")
    parser.add_argument(
        "--draft-vocab-size",
        type=_positive_int,
        default=None,
        help="draft vocabulary size (default: the most frequent tokens that cover 99%% of the trained "
             "tokens, 256 to 32000, never above the target's vocabulary)",
    )
    parser.add_argument("--lr", type=float, default=defaults.LR,
                        help=f"peak learning rate (default {defaults.LR:g})")
    parser.add_argument(
        "--batch-tokens",
        type=_positive_int,
        default=defaults.BATCH_TOKENS,
        help=f"padded tokens per batch and process (default {defaults.BATCH_TOKENS})",
    )
    parser.add_argument("--events", metavar="FILE", default=None, help="append events here (default stdout)")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out "
                       "(none yet: start at step 0); an --out that holds a checkpoint needs --resume or "
                       "--restart")
    start.add_argument("--restart", action="store_true", help="start over at step 0: remove the checkpoints "
                       "--out holds first")
    parser.add_argument("--launched", action="store_true", help=argparse.SUPPRESS)  # by the launch API
    parser.add_argument("--max-length", type=_positive_int, default=2048, help="truncate rows to N tokens")
    parser.add_argument("--warmup-ratio", type=float, default=0.03, help="share of steps spent warming up")
    parser.add_argument("--grad-clip", type=float, default=0.5, help="gradient-norm clipping")
    parser.add_argument("--eval-fraction", type=float, default=DEFAULT_EVAL_FRACTION,
                        help="share of rows held out")
    parser.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps (and at the end)")
    parser.add_argument("--checkpoint-every", type=int, default=1000, help="checkpoint every N steps")
    parser.add_argument("--keep-checkpoints", type=_positive_int, default=2, help="checkpoints kept")
    parser.add_argument("--log-every", type=_positive_int, default=1, help="a step event every N steps")
    parser.add_argument("--heartbeat", type=float, default=10.0, help="seconds between heartbeat events")
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="end the training (checkpoint, eval, done) after this many seconds of steps",
    )
    parser.add_argument("--max-bad-fraction", type=float, default=0.1, metavar="F",
                        help="refuse to start when more than this share of rows hold NaN/Inf "
                             "(those rows are skipped; default 0.1)")
    parser.add_argument("--max-skipped-steps", type=_positive_int, default=5, metavar="N",
                        help="stop after N steps in a row whose loss or gradient is not finite "
                             "(each is skipped; default 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--job", default="train", help="job id written into every event")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    online = parser.add_argument_group(
        "online (train while `hsmon extract` writes DATA_DIR; docs/train.md \"Online\")")
    online.add_argument("--follow", action="store_true",
                        help="train on DATA_DIR's rows as their chunks complete; end when the extraction "
                             "has ended and every row had its --passes (events default to "
                             "DATA_DIR/hsmon-train-events.jsonl)")
    online.add_argument("--passes", type=_positive_int, default=1, metavar="E",
                        help="with --follow: batches each training row is in (default 1)")
    online.add_argument("--consume", action="store_true",
                        help="with --follow: delete a chunk's training rows once each had its E passes "
                             "(recorded in DATA_DIR/hsmon-ledger.jsonl first)")
    online.add_argument("--window", type=int, default=0, metavar="ROWS",
                        help="with --follow: rows of the replay window batches are drawn from "
                             "(default: eight batches' worth)")
    online.add_argument("--poll", type=float, default=0.1, metavar="SECONDS",
                        help="with --follow: how often the spool is checked while waiting for rows")


def run(args: argparse.Namespace) -> int:
    from trainer.runtime import world_size

    code = _run(args)
    if world_size() > 1:
        # Under torchrun, leave without the interpreter's finalization: gloo's worker threads may
        # still hold work objects whose tensors take the GIL when freed, and during finalization
        # that aborts the rank ("terminate called without an active exception", SIGABRT) after a
        # run that finished well (one run in five of the DDP tests under load, with the ranks
        # already meeting before leaving the group). Everything is written and closed by now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def over_checkpoint(args: argparse.Namespace) -> str | None:
    """No silent restart: why a run into an --out that holds a checkpoint is refused (before torch
    loads: at once), unless --resume or --restart says what to do with it."""
    step = defaults.checkpoint_step_in(args.out)
    if step is None or args.resume or args.restart or args.follow:
        return None
    name = f"step-{step:08d}.pt"
    held = f"--out {args.out} holds a checkpoint at step {step} ({name})"
    if args.launched:
        return f"{held}: Resume in the dashboard's training form goes on from it"
    return (f"{held}: add --resume to go on from step {step}, or --restart to start over at step 0 (its "
            "checkpoints are removed)")


def _run(args: argparse.Namespace) -> int:
    refusal = over_checkpoint(args)
    if refusal:
        print(f"hsmon train: {refusal}", file=sys.stderr)
        return 2
    import torch

    from trainer.checkpoint import CheckpointRefused
    from trainer.data import DataError
    from trainer.nonfinite import NonFiniteError
    from trainer.settings import TrainSettings
    from trainer.target import TargetError, extracted_from, resolve_target
    from trainer.train import train

    if not args.follow and (args.consume or args.passes != 1):
        print("hsmon train: --passes and --consume go with --follow", file=sys.stderr)
        return 2
    events = args.events
    if args.follow and events is None:
        from hsmon.contracts.spool import train_events_path

        events = str(train_events_path(args.data_dir))
    elif events is None and is_terminal(sys.stdout):  # JSON is no reading for a person: a file, a line
        events = str(Path(args.out) / "events.jsonl")
        print(f"hsmon train: events -> {events} (stdout is a terminal; --events FILE to choose, a pipe to "
              "read them on stdout)", file=sys.stderr, flush=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        target = resolve_target(args.target_model or extracted_from(Path(args.data_dir)))
        settings = TrainSettings(
            data_dir=Path(args.data_dir),
            target=target,
            out=Path(args.out),
            epochs=args.epochs,
            max_steps=args.max_steps,
            ttt_length=args.ttt_length,
            arch=args.arch,
            draft_vocab_size=args.draft_vocab_size,
            lr=args.lr,
            batch_tokens=args.batch_tokens,
            events=events,
            resume=args.resume,
            restart=args.restart,
            launched=args.launched,
            warmup_ratio=args.warmup_ratio,
            grad_clip=args.grad_clip,
            max_length=args.max_length,
            eval_fraction=args.eval_fraction,
            eval_every=args.eval_every,
            checkpoint_every=args.checkpoint_every,
            keep_checkpoints=args.keep_checkpoints,
            log_every=args.log_every,
            heartbeat_s=args.heartbeat,
            seed=args.seed,
            job=args.job,
            time_limit_s=args.time_limit,
            max_bad_fraction=args.max_bad_fraction,
            max_skips_in_a_row=args.max_skipped_steps,
            follow=args.follow,
            follow_passes=args.passes,
            follow_consume=args.consume,
            follow_poll_s=args.poll,
            follow_window=args.window,
        )
        if args.follow:
            from trainer.follow import follow

            Path(args.data_dir).mkdir(parents=True, exist_ok=True)  # it waits for the extractor
            return train(settings, body=follow)
        return train(settings)
    except (DataError, TargetError, CheckpointRefused) as exc:
        print(f"hsmon train: {exc}", file=sys.stderr)
        return 2
    except NonFiniteError as exc:
        print(f"hsmon train: {exc}", file=sys.stderr)
        return 1
