"""Guards on the repository itself: no tracked file carries unresolved merge-conflict markers, and no
doc, README or Python source uses words only its authors know."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A conflict marker is seven of <, = or > at the start of a line; "=======" alone is also a
# reStructuredText/Markdown rule, so only the opening and closing markers count.
MARKER = re.compile(rb"^(<{7}|>{7})( |$)", re.MULTILINE)


def tracked_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_no_tracked_file_has_merge_conflict_markers() -> None:
    offenders = []
    for path in tracked_files():
        if not path.is_file() or path.stat().st_size > 5_000_000:
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue
        for match in MARKER.finditer(data):
            line = data.count(b"\n", 0, match.start()) + 1
            offenders.append(f"{path.relative_to(ROOT)}:{line}")
    assert not offenders, "merge-conflict markers left in: " + ", ".join(offenders)


def test_the_guard_finds_a_marker() -> None:
    sample = b"a\n<<<<<<< HEAD\nb\n=======\nc\n>>>>>>> main\n"
    assert len(MARKER.findall(sample)) == 2


# Words only the project's authors know: numbered contracts, the seed run's nickname, issue numbers.
PRIVATE_WORDS = re.compile("contract [0-9]|the st" + "ory|issues? [0-9]", re.IGNORECASE)


def test_no_private_words_in_docs_readme_or_code() -> None:
    offenders = []
    for path in tracked_files():
        if path.suffix not in (".py", ".md") or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if PRIVATE_WORDS.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:80]}")
    assert not offenders, "words a newcomer cannot know (name the thing instead):\n" + "\n".join(offenders)
