"""What `hsmon train SPOOL --follow` settles before its first step: the ledger (a new one, or the
resumed one read back and checked against the checkpoint), the held-out rule, the draft
vocabulary's token counts (the extraction's scan's, else the set-up sample's), the set-up sample
(the first chunk, or on a bounded spool the chunks of half its limit: the data's shapes), and the
step budget the
learning-rate schedule is laid over. Rank 0 decides; `share` hands its answer to every rank.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist

from hsmon.contracts import events as ev
from hsmon.contracts import spool
from hsmon.contracts.pauses import Pause
from hsmon.contracts.spool_ledger import LedgerWriter, first_start
from hsmon.contracts.token_counts import read_token_counts
from trainer.data import VOCAB_SAMPLE_ROWS, DataError, DataIndex, RowRef, load_row, plan_epoch
from trainer.runtime import Dist
from trainer.settings import TrainSettings
from trainer.window import ChunkRows, HeldOut, SpoolSource

# the step budget when the extraction's plan is unknown (a manifest without one)
FALLBACK_STEPS = 1000


def share(world: Dist, value: Any) -> Any:
    """Rank 0's ``value`` on every rank (pickled over the process group)."""
    if not world.enabled:
        return value
    box = [value if world.main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@dataclass
class LedgerState:
    """The ledger as a (re)start finds it, after writing its ``start`` record."""

    heldout: HeldOut
    passes: dict[int, int] = field(default_factory=dict)
    consumed: set[str] = field(default_factory=set)


def open_ledger(settings: TrainSettings, ckpt: dict[str, Any] | None) -> tuple[LedgerWriter, LedgerState]:
    """Rank 0: write this start's record and read the ledger back (a start voids the passes of
    checkpoints lost to a crash: hsmon.contracts.spool); refuse a ledger and a checkpoint that
    disagree, a second trainer on a ledger without --resume, or other passes than the first start's."""
    data = settings.data_dir
    first = first_start(data)
    if first is not None and not settings.resume:
        raise DataError(
            f"{spool.ledger_path(data)}: the spool already has a following trainer's ledger; pass "
            "--resume (with the same --out) to continue it, or remove the ledger to start over"
        )
    if first is not None and first.get("passes") != settings.follow_passes:
        raise DataError(
            f"{spool.ledger_path(data)}: the ledger's trainer gives {first.get('passes')} passes, not "
            f"--passes {settings.follow_passes}; resume with --passes {first.get('passes')}"
        )
    if first is not None and ckpt is None:
        before = spool.read_ledger(data)
        # a kill inside the first save leaves one trained record and no checkpoint: resumable
        # from scratch (this start voids it); anything more needs the checkpoint it names
        first_save_lost = (before.start_step == 0 and before.trained_since_start <= 1
                           and before.out in (None, str(settings.out)))
        if not first_save_lost or before.consumed_chunks:
            raise DataError(
                f"{spool.ledger_path(data)}: the ledger records training up to step {before.step} "
                f"({len(before.consumed_chunks)} chunks consumed) but {settings.out} has no checkpoint; "
                "resume with the --out of that training"
            )
    heldout = (HeldOut.from_record(first.get("heldout") or {}) if first is not None
               else HeldOut.new(settings.eval_fraction))
    writer = LedgerWriter(data)
    step = int(ckpt["step"]) if ckpt is not None else 0
    saves = checkpoint_saves(ckpt)
    writer.start(passes=settings.follow_passes, consume=settings.follow_consume, step=step,
                 heldout=heldout.to_record(), out=str(settings.out),
                 **({} if saves is None else {"save": saves}))
    ledger = spool.read_ledger(data)
    passes = {r: n for r, n in ledger.passes.items() if n > 0}
    if ckpt is not None:
        held = (ckpt.get("follow") or {}).get("passes_total")
        if held != sum(passes.values()):
            raise DataError(
                f"{spool.ledger_path(data)}: the ledger counts {sum(passes.values())} passes up to step "
                f"{step}, the checkpoint {held}; the ledger belongs to another training: resume with "
                "its --out, or start a new spool"
            )
    return writer, LedgerState(heldout, passes, set(ledger.consumed_chunks))


def checkpoint_saves(ckpt: dict[str, Any] | None) -> int | None:
    """The saves (trained records) a checkpoint covers: 0 without one, None for a checkpoint that
    does not say (written before saves were counted)."""
    if ckpt is None:
        return 0
    saves = (ckpt.get("follow") or {}).get("saves")
    return saves if isinstance(saves, int) else None


@dataclass
class Arrival:
    """One poll of the spool, the same on every rank."""

    chunks: list[ChunkRows]
    ended: bool
    plan_rows: int | None
    stop: bool
    spool_limit: int | None = None  # `hsmon extract --spool-max`, when the spool has one
    row_bytes: int = 0  # bytes of the rows the manifests count
    rows: int = 0  # the rows the manifests count


def poll_spool(world: Dist, source: SpoolSource | None, stop: bool) -> Arrival:
    if world.main:
        assert source is not None
        chunks = source.poll()
        written = source.written
        local = Arrival(chunks, source.ended(), source.plan_rows(), stop,
                        spool.read_spool_limit(source.data_dir), written.bytes, len(written.rows))
    else:
        local = Arrival([], False, None, stop)
    arrival: Arrival = share(world, local)
    return arrival


def rows_pause(writer: ev.EventWriter | None) -> Pause:
    """The trainer's ``pause``/``resume`` events with reason "rows" and its stderr lines (the one
    pause protocol, hsmon.contracts.pauses; rank 0 speaks, the other ranks are given no writer)."""
    return Pause(spool.PAUSE_ROWS, writer, prefix="hsmon train: ")


def setup_sample(arrived: list[ChunkRows], arrival: Arrival) -> ChunkRows | None:
    """The rows the trainer settles its shapes, window and step budget on (and its draft vocabulary
    when the extraction wrote no token counts), or None while it should wait for more: the complete
    chunks on hand once one has a usable row, and, on a bounded spool (--spool-max), once the rows
    written hold half the limit, the extraction has ended or they reach VOCAB_SAMPLE_ROWS. A bounded
    spool fills without the trainer (the extractor pauses only at the limit), so this costs seconds,
    and a budget laid out from a single small chunk is far off (measured: chunks of 1 row, 236
    steps laid out for a run of 105). An unbounded spool starts on its first usable chunk."""
    usable = [c for c in arrived if c.train or c.held]
    if not usable:
        return None
    rows = sum(len(c.train) + len(c.held) for c in usable)
    if (arrival.spool_limit and arrival.row_bytes * 2 < arrival.spool_limit and not arrival.ended
            and rows < VOCAB_SAMPLE_ROWS):
        return None
    if len(usable) == 1:
        return usable[0]
    return ChunkRows(f"{usable[0].name}..{usable[-1].name}", train=[r for c in usable for r in c.train],
                     held=[r for c in usable for r in c.held])


def first_index(chunk: ChunkRows, data_dir: Path | None = None) -> tuple[DataIndex, str]:
    """(shapes and draft-vocabulary token counts, where the counts came from): the counts from the
    extraction's scan (hsmon.contracts.token_counts: the whole dataset's, as offline) when the spool
    has them, else from the set-up sample; the shapes from the sample (what is known before the
    rest of the hidden states exist)."""
    index = sample_index(chunk)
    scanned = read_token_counts(data_dir) if data_dir is not None else None
    if scanned is None or not scanned.counts:
        return index, chunk.name
    index.token_counts = scanned.counts
    return index, f"the extraction's scan ({scanned.rows_sampled} rows)"


def sample_index(chunk: ChunkRows) -> DataIndex:
    """Shapes and draft-vocabulary token counts from the set-up sample."""
    counts: Counter = Counter()
    hidden = aux = 0
    rows = (chunk.train + chunk.held)[:VOCAB_SAMPLE_ROWS]
    for ref in rows:
        data = load_row(ref.path)
        ids, mask = data["input_ids"].reshape(-1), data["loss_mask"].reshape(-1)
        counts.update(ids[1:ref.length][mask[1:ref.length].bool()].tolist())
        hidden, aux = int(data["hidden_state"].shape[-1]), int(data["aux_hidden_state"].shape[-1])
    if not hidden:
        raise DataError(f"{chunk.name}: the first complete chunk has no usable rows")
    return DataIndex(list(rows), counts, hidden, aux)


def step_budget(settings: TrainSettings, first: ChunkRows, plan_rows: int | None, world: Dist,
                heldout: HeldOut) -> tuple[int, str]:
    """(steps the schedule is laid over, how they were found): --max-steps, else the extraction's
    planned rows less the held-out ones x E passes / rows per batch (measured on the first chunk)."""
    if settings.max_steps is not None:
        return settings.max_steps, "--max-steps"
    rows: list[RowRef] = first.train or first.held
    per_batch = max(1.0, len(rows) / max(1, len(plan_epoch(rows, settings.batch_tokens, settings.seed, 0))))
    expected = expected_training_rows(plan_rows, heldout)
    if expected is None:
        return FALLBACK_STEPS, "fallback (the extraction's manifest has no plan)"
    steps = math.ceil(expected * settings.follow_passes / (per_batch * world.world))
    return max(1, steps), "plan"


def expected_training_rows(plan_rows: int | None, heldout: HeldOut) -> int | None:
    """The training rows the extraction's plan will bring (its rows less the held-out ones expected)."""
    if plan_rows is None:
        return None
    held = min(plan_rows * heldout.fraction, heldout.below_row * heldout.fraction)
    return max(0, round(plan_rows - held))


def delete_rows(refs: list[RowRef]) -> None:
    """Delete training rows' files (after their ``consumed`` record); the chunk directory goes
    when nothing is left in it."""
    parents: set[Path] = set()
    for ref in refs:
        path = Path(ref.path)
        path.unlink(missing_ok=True)
        parents.add(path.parent)
    for parent in parents:
        with contextlib.suppress(OSError):  # held-out rows (or rows left out) stay
            parent.rmdir()
