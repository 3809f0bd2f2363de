"""Which shard of an extraction this process is, from the scheduler that started it.

`hsmon extract` without `--shard` takes its index and count from torchrun (RANK, WORLD_SIZE), a
Slurm job array (SLURM_ARRAY_TASK_ID minus SLURM_ARRAY_TASK_MIN, divided by SLURM_ARRAY_TASK_STEP;
SLURM_ARRAY_TASK_COUNT) or a Kubernetes Indexed Job (JOB_COMPLETION_INDEX; the count, which
Kubernetes does not put in the environment, from HSMON_SHARD_COUNT). HSMON_SHARD_COUNT also sets
the count for the others. Sources that disagree with each other or with an explicit --shard are an
error; a source whose count is 1 is no sharding and agrees with anything. Pure: no imports of
torch, reads only the mapping it is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise

COUNT_VAR = "HSMON_SHARD_COUNT"


class ShardEnvError(ValueError):
    """The environment's shard is unreadable or contradicts itself or --shard (one-line message)."""


@dataclass(frozen=True)
class EnvShard:
    index: int
    count: int
    source: str  # the variables it came from, for messages

    @property
    def text(self) -> str:
        return f"{self.index}/{self.count}"


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ShardEnvError(
            f"{name}={value!r} is not an integer; fix the environment or pass --shard I/N"
        ) from None


def _count(env: Mapping[str, str], native: str | None) -> tuple[int | None, str]:
    override = _int(env, COUNT_VAR)
    if override is not None:
        return override, COUNT_VAR
    return (_int(env, native) if native else None), native or COUNT_VAR


def from_env(env: Mapping[str, str]) -> list[EnvShard]:
    """Every scheduler's view of the shard found in ``env`` (torchrun, Slurm array, Kubernetes)."""
    found = []
    rank = _int(env, "RANK")
    if rank is not None and env.get("WORLD_SIZE"):
        count, count_var = _count(env, "WORLD_SIZE")
        found.append(EnvShard(rank, count or 1, f"RANK/{count_var} (torchrun)"))
    task = _int(env, "SLURM_ARRAY_TASK_ID")
    if task is not None:
        low = _int(env, "SLURM_ARRAY_TASK_MIN") or 0
        step = _int(env, "SLURM_ARRAY_TASK_STEP") or 1
        count, count_var = _count(env, "SLURM_ARRAY_TASK_COUNT")
        if count is None:
            raise ShardEnvError("SLURM_ARRAY_TASK_ID is set without SLURM_ARRAY_TASK_COUNT; "
                                f"set {COUNT_VAR} or pass --shard I/N")
        if (task - low) % step:
            raise ShardEnvError(f"SLURM_ARRAY_TASK_ID={task} is not on the array's step {step} from {low}")
        found.append(EnvShard((task - low) // step, count,
                              f"SLURM_ARRAY_TASK_ID-SLURM_ARRAY_TASK_MIN/{count_var} (Slurm array)"))
    index = _int(env, "JOB_COMPLETION_INDEX")
    if index is not None:
        count = _int(env, COUNT_VAR)
        if count is None:
            raise ShardEnvError(f"JOB_COMPLETION_INDEX is set but {COUNT_VAR} is not; set it to the "
                                "Indexed Job's completions, or pass --shard I/N")
        found.append(EnvShard(index, count, f"JOB_COMPLETION_INDEX/{COUNT_VAR} (Kubernetes Indexed Job)"))
    for shard in found:
        if shard.count < 1 or not 0 <= shard.index < shard.count:
            raise ShardEnvError(f"{shard.source} gives shard {shard.text}: need 0 <= index < count; "
                                "fix the environment or pass --shard I/N")
    return found


def resolve_shard(explicit: str | None, env: Mapping[str, str]) -> str | None:
    """The --shard value to use: the explicit one (checked against the environment) or the
    environment's; None when neither shards."""
    sharded = [s for s in from_env(env) if s.count > 1]
    for a, b in pairwise(sharded):
        if (a.index, a.count) != (b.index, b.count):
            raise ShardEnvError(f"{a.source} says shard {a.text} but {b.source} says {b.text}; "
                                "pass --shard I/N that matches the one you mean")
    if explicit:
        from extractor.plan import Shard

        try:
            want = Shard.parse(explicit)
        except ValueError as exc:
            raise ShardEnvError(str(exc)) from None
        for s in sharded:
            if (s.index, s.count) != (want.index, want.count):
                raise ShardEnvError(f"--shard {explicit} disagrees with {s.source}, which says {s.text}; "
                                    "drop --shard or fix the environment")
        return explicit
    return sharded[0].text if sharded else None


def visible_device_for_rank(device: str, env: Mapping[str, str]) -> str | None:
    """Under torchrun with several processes per host and ``--device auto``: the CUDA_VISIBLE_DEVICES
    that gives this rank its own GPU (LOCAL_RANK-th of those visible), so the ranks of one host do
    not all load the target onto GPU 0. None: leave the environment as it is."""
    local = _int(env, "LOCAL_RANK")
    if device != "auto" or local is None or (_int(env, "LOCAL_WORLD_SIZE") or 1) < 2:
        return None
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return str(local)
    ids = [v for v in visible.split(",") if v.strip()]
    return ids[local] if local < len(ids) else None
