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
HF = "hf"

# dest -> the backend it belongs to; options not listed serve every backend
EXTRACT_OPTIONS: Mapping[str, str] = {
    "url": SGLANG,
    "transport": SGLANG,
    "dump_dir": SGLANG,
    "concurrency": SGLANG,
    "max_dump_bytes": SGLANG,
    "dump_min_free": SGLANG,
    "request_timeout": SGLANG,
    "give_up_after": SGLANG,
    "row_attempts": SGLANG,
    "wait_for_server": SGLANG,
    "skip_first_chunk_check": SGLANG,
    "device": HF,  # the SGLang server runs where it was started
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
BACKEND_NAMES = {SGLANG: "SGLang servers", HF: "transformers in-process"}


def misplaced_option(
    args: argparse.Namespace,
    backend: str,
    table: Mapping[str, str],
    add_arguments: Callable[[argparse.ArgumentParser], None],
) -> str | None:
    """A one-line refusal for the first option given (not at its default) that belongs to
    another backend than ``backend``, or None."""
    defaults = argparse.ArgumentParser(add_help=False)
    add_arguments(defaults)
    for dest, owner in table.items():
        if owner == backend or getattr(args, dest, None) == defaults.get_default(dest):
            continue
        flag = "--" + dest.replace("_", "-")
        return (f"{flag} belongs to --backend {owner} ({BACKEND_NAMES[owner]}) but this run uses "
                f"--backend {backend} ({BACKEND_NAMES[backend]}): add --backend {owner}, or drop {flag}")
    return None
