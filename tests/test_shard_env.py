"""`hsmon extract --shard` from the scheduler's environment (extractor/shard_env.py): the pure rules,
then real `hsmon extract` runs whose environment is set as torchrun, a Slurm array and a Kubernetes
Indexed Job set it. Two Slurm array tasks run at once write one output equal, tensor for tensor, to
one unsharded run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from extract_helpers import assert_same_output, events_of, extract_cmd, extract_env, make_dataset, tiny_model  # noqa: F401

from extractor.shard_env import ShardEnvError, resolve_shard
from hsmon.contracts import layout
from hsmon.contracts.manifest_reader import read_manifest

SCHEDULER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_ARRAY_TASK_ID",
                  "SLURM_ARRAY_TASK_MIN",
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


@pytest.mark.parametrize("device, env, want", [
    ("auto", {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8"}, "3"),
    ("auto", {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": "4,5"}, "5"),
    ("auto", {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, None),  # one process per host: all its GPUs
    ("cuda:2", {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}, None),  # an explicit device wins
    ("auto", {}, None),
])
def test_torchrun_ranks_of_one_host_get_one_gpu_each(
    device: str, env: dict[str, str], want: str | None
) -> None:
    from extractor.shard_env import visible_device_for_rank

    assert visible_device_for_rank(device, env) == want


def _env(**scheduler: str) -> dict[str, str]:
    env = {k: v for k, v in extract_env().items() if k not in SCHEDULER_VARS}
    return {**env, **scheduler}


@pytest.mark.slow
def test_real_runs_take_their_shard_from_the_scheduler(tmp_path: Path, tiny_model: Path) -> None:  # noqa: F811
    """Two Slurm array tasks (no --shard) at once into one directory equal one unsharded run.
    torchrun's and Kubernetes' variables reach the real command too: an explicit --shard that
    contradicts them stops it, naming the shard the environment gives (before any heavy import, so
    these cost no model load; the rules themselves are the parametrized tests above)."""
    data = make_dataset(tmp_path / "data.jsonl", 40, min_lines=1, max_lines=3)
    opts = ("--chunk-size", "10", "--batch-tokens", "512")
    runs = {  # name: (out dir, environment)
        "whole": ("whole", _env()),
        "slurm10": ("array", _env(SLURM_ARRAY_TASK_ID="10", **SLURM)),
        "slurm11": ("array", _env(SLURM_ARRAY_TASK_ID="11", **SLURM)),
    }
    procs = {
        name: subprocess.Popen(
            extract_cmd(data, tmp_path / out, tiny_model, *opts, events=tmp_path / f"{name}.jsonl"),
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        for name, (out, env) in runs.items()
    }
    refused = {
        "RANK/WORLD_SIZE (torchrun), which says 1/2": _env(RANK="1", WORLD_SIZE="2", LOCAL_RANK="0"),
        "JOB_COMPLETION_INDEX/HSMON_SHARD_COUNT (Kubernetes Indexed Job), which says 1/2":
            _env(JOB_COMPLETION_INDEX="1", HSMON_SHARD_COUNT="2"),
        "SLURM_ARRAY_TASK_ID-SLURM_ARRAY_TASK_MIN/SLURM_ARRAY_TASK_COUNT (Slurm array), which says 1/2":
            _env(SLURM_ARRAY_TASK_ID="11", **SLURM),
    }
    for words, env in refused.items():
        bad = subprocess.run(
            extract_cmd(data, tmp_path / "bad", tiny_model, *opts, "--shard", "0/2"),
            env=env, capture_output=True, text=True, timeout=120,
        )
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
        assert f"hsmon extract: --shard 0/2 disagrees with {words}" in bad.stderr
    assert not (tmp_path / "bad").exists()
    try:
        for name, proc in procs.items():
            assert proc.wait(300) == 0, f"{name}: {proc.stderr.read() if proc.stderr else ''}"
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()

    def start_shard(name: str) -> list[int]:
        return next(e for e in events_of(tmp_path / f"{name}.jsonl") if e["kind"] == "start")["shard"]

    assert start_shard("slurm10") == [0, 2] and start_shard("slurm11") == [1, 2]
    assert start_shard("whole") == [0, 1]
    # the two array tasks, run at once into one directory, equal the unsharded run, tensor for tensor
    assert_same_output(tmp_path / "array", tmp_path / "whole")
    shards = [set(read_manifest(tmp_path / "array", layout.manifest_name((i, 2))).rows)
              for i in (0, 1)]
    assert shards[0] and shards[1] and not shards[0] & shards[1]
