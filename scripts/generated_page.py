"""A docs page generated from the code: written, or (``--check``) compared with what is committed."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def write_or_check(page: Path, text: str, source: str, script: str) -> int:
    """Write ``text`` to ``page``; with ``--check`` on the command line, exit status 1 when the committed
    page differs from ``text`` (one line naming ``source`` and the ``script`` that regenerates it)."""
    if "--check" in sys.argv[1:]:
        if not page.exists() or page.read_text() != text:
            print(f"{page.relative_to(ROOT)} differs from the {source}: run python {script}", file=sys.stderr)
            return 1
        return 0
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(text)
    print(f"wrote {page.relative_to(ROOT)}")
    return 0
