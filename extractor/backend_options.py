"""Which options belong to one backend only, and the refusal of one given to a run of another.

An option of the other backend is never ignored in silence: `hsmon extract --url ...` without
`--backend sglang` would otherwise plan an in-process run of another engine than the server's.
The tables are checked against the parsers by tests/test_backend_options.py: a new option of a
backend's argument group must be entered here.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping

SGLANG = "sglang"
VLLM = "vllm"
HF = "hf"
SERVERS = (SGLANG, VLLM)  # the options of the server client, which both engines' backends share

# dest -> the backend(s) it belongs to; options not listed serve every backend
EXTRACT_OPTIONS: Mapping[str, str | tuple[str, ...]] = {
    "url": SERVERS,
    "transport": SGLANG,
    "dump_dir": SGLANG,  # vLLM's files go where vllm-serve --dump-dir says
    "concurrency": SERVERS,
    "max_dump_bytes": SERVERS,
    "dump_min_free": SERVERS,
    "request_timeout": SERVERS,
    "give_up_after": SERVERS,
    "row_attempts": SERVERS,
    "wait_for_server": SERVERS,
    "skip_first_chunk_check": SGLANG,
    "device": HF,  # the server runs where it was started
}
REGENERATE_OPTIONS: Mapping[str, str] = {
    "url": SGLANG,
    "concurrency": SGLANG,
    "request_timeout": SGLANG,
    "give_up_after": SGLANG,
    "row_attempts": SGLANG,
    "wait_for_server": SGLANG,
    "device": HF,
    "dtype": HF,  # the servers compute in their own --dtype
    "threads": HF,
}
VERIFY_OPTIONS: Mapping[str, str] = {
    "against": SGLANG,
    "transport": SGLANG,
    "dump_dir": SGLANG,
    "request_timeout": SGLANG,
}
BACKEND_NAMES = {SGLANG: "SGLang servers", VLLM: "vLLM servers", HF: "transformers in-process"}


def misplaced_option(
    args: argparse.Namespace,
    backend: str,
    table: Mapping[str, str | tuple[str, ...]],
    add_arguments: Callable[[argparse.ArgumentParser], None],
) -> str | None:
    """A one-line refusal for the first option given (not at its default) that belongs to
    another backend than ``backend``, or None."""
    defaults = argparse.ArgumentParser(add_help=False)
    add_arguments(defaults)
    for dest, owners in table.items():
        owners = (owners,) if isinstance(owners, str) else owners
        if backend in owners or getattr(args, dest, None) == defaults.get_default(dest):
            continue
        flag = "--" + dest.replace("_", "-")
        names = " or ".join(f"--backend {o} ({BACKEND_NAMES[o]})" for o in owners)
        return (f"{flag} belongs to {names} but this run uses --backend {backend} "
                f"({BACKEND_NAMES[backend]}): add --backend {owners[0]}, or drop {flag}")
    return None
