"""The CPU cores of each SGLang rank on the CPU engine (``SGLANG_CPU_OMP_THREADS_BIND``).

Without the variable SGLang binds one rank per NUMA node and stops a server with more ranks than
nodes (an assertion in sglang/srt/utils/numa_utils.py): ``--tp-size 2`` on a one-node machine
never starts. ``hsmon sglang-serve`` on CPU sets it when the server has more than one rank and
the variable is not set already: this process's allowed cores split into one contiguous group
per rank, ``|``-separated (two cores, two ranks: ``0|1``; a rank gets a core of its own when there
are enough, else ranks share them round-robin).
"""

from __future__ import annotations

import contextlib
import os

BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"
_SIZE_FLAGS = {"--tp-size": "tp", "--tp": "tp", "--dp-size": "dp", "--dp": "dp", "--pp-size": "pp"}


def ranks(extra: list[str]) -> int:
    """The number of ranks (tp * dp * pp) that SGLang's arguments ask for."""
    sizes = {"tp": 1, "dp": 1, "pp": 1}
    for i, arg in enumerate(extra):
        name, _, value = arg.partition("=")
        if name in _SIZE_FLAGS:
            text = value if value else (extra[i + 1] if i + 1 < len(extra) else "1")
            with contextlib.suppress(ValueError):  # SGLang says what is wrong with it
                sizes[_SIZE_FLAGS[name]] = max(1, int(text))
    return sizes["tp"] * sizes["dp"] * sizes["pp"]


def binding(world: int, cpus: list[int]) -> str:
    """``SGLANG_CPU_OMP_THREADS_BIND`` for ``world`` ranks over ``cpus``."""
    cpus = sorted(cpus)
    if len(cpus) < world:
        return "|".join(str(cpus[r % len(cpus)]) for r in range(world))
    per, extra = divmod(len(cpus), world)
    groups, start = [], 0
    for r in range(world):
        n = per + (1 if r < extra else 0)
        group = cpus[start:start + n]
        start += n
        contiguous = group == list(range(group[0], group[-1] + 1))
        groups.append(f"{group[0]}-{group[-1]}" if contiguous and n > 1 else ",".join(map(str, group)))
    return "|".join(groups)


def bind_env(env: dict[str, str], extra: list[str]) -> str | None:
    """Set the binding in ``env`` for a multi-rank CPU server unless it is set; returns it or None."""
    world = ranks(extra)
    if world <= 1 or env.get(BIND_ENV):
        return None
    env[BIND_ENV] = binding(world, sorted(os.sched_getaffinity(0)))
    return env[BIND_ENV]
