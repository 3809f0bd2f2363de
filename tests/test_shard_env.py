"""`hsmon extract --shard` from the scheduler's environment (extractor/shard_env.py): the pure rules,
then real runs whose environment is set as torchrun, a Slurm array and a Kubernetes Indexed Job set
it. Two Slurm array tasks run at once write one output equal, tensor for tensor, to one unsharded
run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from extract_helpers import assert_same_output, events_of, extract_cmd, extract_env, make_dataset, tiny_model  # noqa: F401

from extractor.shard_env import ShardEnvError, resolve_shard
from hsmon import layout

SCHEDULER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN",
                  "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_STEP",
                  "JOB_COMPLETION_INDEX", "HSMON_SHARD_COUNT")
SLURM = {"SLURM_ARRAY_TASK_MIN": "10", "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_MAX": "11"}


@pytest.mark.parametrize("env, want", [
    ({}, None),
    ({"RANK": "1", "WORLD_SIZE": "4"}, "1/4"),
    ({"RANK": "0", "WORLD_SIZE": "1"}, None),  # one process: no sharding
    ({"SLURM_ARRAY_TASK_ID": "11", **SLURM}, "1/2"),
    ({"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_STEP": "2",
      "SLURM_ARRAY_TASK_COUNT": "3"}, "2/3"),  # --array=1-5:2
    ({"JOB_COMPLETION_INDEX": "3", "HSMON_SHARD_COUNT": "8"}, "3/8"),
    ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_COUNT": "10",
      "HSMON_SHARD_COUNT": "4"}, "3/4"),  # the count overridden
    # torchrun inside a one-task Slurm array: both agree
    ({"RANK": "2", "WORLD_SIZE": "4", "SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "1"}, "2/4"),
])
def test_shard_from_environment(env: dict[str, str], want: str | None) -> None:
    assert resolve_shard(None, env) == want
    if want:
        assert resolve_shard(want, env) == want  # an explicit --shard that agrees


@pytest.mark.parametrize("explicit, env, words", [
    ("0/4", {"RANK": "1", "WORLD_SIZE": "4"}, ["--shard 0/4", "RANK/WORLD_SIZE", "1/4"]),
    (None, {"RANK": "1", "WORLD_SIZE": "2", "JOB_COMPLETION_INDEX": "0", "HSMON_SHARD_COUNT": "2"},
     ["torchrun", "Kubernetes", "1/2", "0/2"]),
    (None, {"JOB_COMPLETION_INDEX": "0"}, ["HSMON_SHARD_COUNT", "completions"]),
    (None, {"SLURM_ARRAY_TASK_ID": "4"}, ["SLURM_ARRAY_TASK_COUNT"]),
    (None, {"RANK": "x", "WORLD_SIZE": "2"}, ["RANK='x'"]),
    (None, {"JOB_COMPLETION_INDEX": "5", "HSMON_SHARD_COUNT": "4"}, ["5/4", "0 <= index < count"]),
])
def test_disagreement_is_a_clear_error(explicit: str | None, env: dict[str, str], words: list[str]) -> None:
    with pytest.raises(ShardEnvError) as err:
        resolve_shard(explicit, env)
    assert all(w in str(err.value) for w in words), str(err.value)
    assert "\n" not in str(err.value)


def _env(**scheduler: str) -> dict[str, str]:
    env = {k: v for k, v in extract_env().items() if k not in SCHEDULER_VARS}
    return {**env, **scheduler}


@pytest.mark.slow
def test_real_runs_take_their_shard_from_the_scheduler(tmp_path: Path, tiny_model: Path) -> None:  # noqa: F811
    data = make_dataset(tmp_path / "data.jsonl", 40, min_lines=1, max_lines=3)
    opts = ("--chunk-size", "10", "--batch-tokens", "512")
    runs = {  # name: (out dir, environment)
        "whole": ("whole", _env()),
        "slurm10": ("array", _env(SLURM_ARRAY_TASK_ID="10", **SLURM)),
        "slurm11": ("array", _env(SLURM_ARRAY_TASK_ID="11", **SLURM)),
        "torchrun": ("torchrun", _env(RANK="1", WORLD_SIZE="2", LOCAL_RANK="0")),
        "k8s": ("k8s", _env(JOB_COMPLETION_INDEX="0", HSMON_SHARD_COUNT="2")),
    }
    procs = {
        name: subprocess.Popen(
            extract_cmd(data, tmp_path / out, tiny_model, *opts, events=tmp_path / f"{name}.jsonl"),
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        for name, (out, env) in runs.items()
    }
    # an explicit --shard that the environment contradicts stops before any work
    bad = subprocess.run(
        extract_cmd(data, tmp_path / "bad", tiny_model, *opts, "--shard", "0/2"),
        env=_env(RANK="1", WORLD_SIZE="2"), capture_output=True, text=True, timeout=120,
    )
    try:
        for name, proc in procs.items():
            assert proc.wait(300) == 0, f"{name}: {proc.stderr.read() if proc.stderr else ''}"
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "--shard 0/2 disagrees with RANK/WORLD_SIZE (torchrun), which says 1/2" in bad.stderr
    assert not (tmp_path / "bad").exists()

    def start_shard(name: str) -> list[int]:
        return next(e for e in events_of(tmp_path / f"{name}.jsonl") if e["kind"] == "start")["shard"]

    assert start_shard("slurm10") == [0, 2] and start_shard("slurm11") == [1, 2]
    assert start_shard("torchrun") == [1, 2] and start_shard("k8s") == [0, 2]
    assert start_shard("whole") == [0, 1]
    # the two array tasks, run at once into one directory, equal the unsharded run
    assert_same_output(tmp_path / "array", tmp_path / "whole")
    # torchrun's rank 1 did the same rows as the array's second task; Kubernetes' index 0 the first
    rows = {name: set(layout.read_manifest(tmp_path / out).rows) for name, (out, _) in runs.items()}
    shard1 = set(layout.read_manifest(tmp_path / "array", layout.manifest_name((1, 2))).rows)
    assert rows["torchrun"] == shard1 and rows["k8s"] == rows["whole"] - shard1 and shard1
