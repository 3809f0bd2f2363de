"""README's headline figures come from benches that exist and still print them: each row of its
table names a bench under bench/ and the RESULT keys that carry the figure, and each key is one
that bench's source prints (a ``key=`` in its RESULT line, or a ``"key"`` of the fields it joins,
``_ratio``/``_p5``/``_p95`` of such a field included)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUFFIXES = ("_ratio", "_p5", "_p95")


def headline_rows() -> list[tuple[str, str, list[str]]]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Headline figures", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[2].startswith("`bench/"):
            continue
        names = re.findall(r"`([^`]+)`", cells[2])
        rows.append((cells[0], names[0], names[1:]))
    return rows


def printed(key: str, source: str) -> bool:
    if re.search(rf"(?<![\w.]){re.escape(key)}=", source) or f'"{key}"' in source:
        return True
    return any(key.endswith(s) and printed(key[: -len(s)], source) for s in SUFFIXES)


def test_every_headline_figure_names_a_bench_and_keys_it_prints():
    rows = headline_rows()
    assert len(rows) >= 8, rows
    for what, bench, keys in rows:
        path = REPO / bench
        assert path.is_file(), f"README's '{what}' names {bench}, which does not exist"
        assert keys, f"README's '{what}' names no RESULT key of {bench}"
        source = path.read_text()
        if path.name == "soak.py":
            source += (REPO / "bench" / "_soak_report.py").read_text()
        missing = [k for k in keys if not printed(k, source)]
        assert not missing, f"README's '{what}': {bench} no longer prints {missing}"


def test_the_check_catches_a_key_no_bench_prints():
    source = (REPO / "bench" / "drafter_acceptance.py").read_text()
    assert printed("long_d5_ratio", source) and printed("long_d5_ratio_p95", source)
    assert not printed("eagle3_d7", source) and not printed("ngram_d7", source)  # the old version's keys
