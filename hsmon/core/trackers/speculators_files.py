"""The vLLM-speculators layout of an output directory: ``hs_*.safetensors`` files in OUT or one
level below; a file is a row, its tokens read from its safetensors header (a few bytes, read once
per file and kept while its size and mtime stay)."""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass

from hsmon.contracts import layout

SPECULATORS_RE = re.compile(r"^hs_\d+.*\.safetensors$")


def safetensors_tokens(path: str) -> int | None:
    """Tokens in a safetensors file: the length of ``input_ids``, else the first dim of a tensor."""
    try:
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > 16 * 1024 * 1024:
                return None
            header = json.loads(fh.read(n))
    except (OSError, ValueError, struct.error):
        return None
    tensors = {k: v for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}
    for key in ("input_ids", "token_ids"):
        shape = tensors.get(key, {}).get("shape")
        if shape:
            return int(shape[-1])
    for info in tensors.values():
        shape = info.get("shape") or []
        if shape:
            return int(shape[0]) if len(shape) < 3 else int(shape[-2])
    return None


@dataclass(frozen=True)
class SpeculatorsCount:
    rows: int
    bytes: int
    tokens: int | None  # None when a file's header does not say
    temp_files: int


class SpeculatorsFiles:
    """Counts the speculators files of one directory, keeping each file's tokens between scans."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._files: dict[str, tuple[int, int, int | None]] = {}  # rel path -> (size, mtime_ns, tokens)

    def clear(self) -> None:
        self._files.clear()

    def _candidates(self, names: list[str]) -> tuple[list[str], int]:
        candidates: list[str] = []
        temps = 0
        for name in names:
            if layout.is_temporary(name):
                temps += 1
            elif SPECULATORS_RE.match(name):
                candidates.append(name)
            elif os.path.isdir(os.path.join(self.root, name)):
                try:
                    sub = os.listdir(os.path.join(self.root, name))
                except OSError:
                    continue
                candidates += [f"{name}/{s}" for s in sub if SPECULATORS_RE.match(s)]
                temps += sum(1 for s in sub if layout.is_temporary(s))
        return candidates, temps

    def count(self, names: list[str]) -> SpeculatorsCount | None:
        """The files among ``names`` (the directory's listing); None when there is none at all."""
        candidates, temps = self._candidates(names)
        seen = set()
        rows = nbytes = tokens = 0
        tokens_known = True
        for rel in candidates:
            full = os.path.join(self.root, rel)
            try:
                st = os.stat(full)
            except OSError:
                continue
            cached = self._files.get(rel)
            if cached is None or cached[:2] != (st.st_size, st.st_mtime_ns):
                cached = (st.st_size, st.st_mtime_ns, safetensors_tokens(full))
                self._files[rel] = cached
            seen.add(rel)
            rows += 1
            nbytes += st.st_size
            if cached[2] is None:
                tokens_known = False
            else:
                tokens += cached[2]
        for rel in set(self._files) - seen:
            del self._files[rel]
        if not (rows or temps):
            return None
        return SpeculatorsCount(rows, nbytes, tokens if tokens_known else None, temps)
