"""kill -9 of the following trainer at each point of its save (real processes, the crash placed
exactly by HSMON_TRAIN_KILL_AT, never by timing) and its --resume: no row trained under or over E
times, no chunk deleted before its passes, the chunks the checkpoint finished consumed first."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from extract_helpers import extract_env, make_dataset, run_extract, tiny_model  # noqa: F401
from test_train_follow import PASSES, assert_every_row_exactly_e, trainer_cmd, trainer_env

from hsmon.contracts import layout, spool
from hsmon.contracts.manifest_reader import read_row_records

OPTS = ("--window", "8", "--checkpoint-every", "2")


@pytest.fixture(scope="module")
def finished_spool(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:  # noqa: F811
    """One finished extraction (chunks of 4 rows), copied by each case (a consuming trainer deletes rows)."""
    tmp = tmp_path_factory.mktemp("crash_spool")
    data = make_dataset(tmp / "data.jsonl", 24, min_lines=1, max_lines=2)
    proc = run_extract(data, tmp / "spool", tiny_model, "--chunk-size", "4", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    return tmp / "spool"


def run_trainer(spool_dir: Path, out: Path, model: Path, *extra: str, kill_at: str | None = None):
    env = trainer_env(spool_dir, **({"HSMON_TRAIN_KILL_AT": kill_at} if kill_at else {}))
    return subprocess.run(trainer_cmd(spool_dir, out, model, *OPTS, *extra), capture_output=True, text=True,
                          timeout=240, env=env)


def records(spool_dir: Path) -> list[dict]:
    return list(layout.iter_jsonl(spool.ledger_path(spool_dir)))


def assert_nothing_deleted_early(spool_dir: Path) -> None:
    """Every row file gone belongs to a chunk the ledger says consumed, each of its rows at E passes
    as a resume will count them (a trained record its checkpoint never held does not count)."""
    ledger = spool.read_ledger(spool_dir)
    for row, rec in read_row_records(spool_dir).items():
        if not (spool_dir / rec["chunk"] / layout.row_file_name(row)).exists():
            assert rec["chunk"] in ledger.consumed_chunks, row
            assert ledger.passes.get(row) == PASSES, (row, ledger.passes.get(row))


@pytest.mark.parametrize("kill_at", ["trained:1", "checkpoint:2", "consumed:2", "final"])
def test_kill_9_at_each_point_of_a_save_then_resume_gives_exactly_e(tmp_path, finished_spool, tiny_model,  # noqa: F811
                                                                    kill_at):
    spool_dir, out = tmp_path / "spool", tmp_path / "train"
    shutil.copytree(finished_spool, spool_dir)
    # the final save writes a trained record of its own when no checkpoint fell on the last step
    extra = ("--checkpoint-every", "1000") if kill_at == "final" else ()
    killed = run_trainer(spool_dir, out, tiny_model, *extra, kill_at=kill_at)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert_nothing_deleted_early(spool_dir)
    before = len(records(spool_dir))
    resumed = run_trainer(spool_dir, out, tiny_model, *extra, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_every_row_exactly_e(spool_dir)
    after = records(spool_dir)[before:]
    assert after[0]["type"] == "start"
    if kill_at == "checkpoint:2":
        # the chunks that checkpoint finished are consumed before the resumed trainer's first step
        first_trained = next(i for i, r in enumerate(after) if r["type"] == "trained")
        assert [r for r in after[1:first_trained] if r["type"] == "consumed"], after[:4]
