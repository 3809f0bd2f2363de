"""The docs agree with the code and with each other: the tested SGLang releases (one list, the
support table's, which is the plugin's own), the exit status of a stop by signal, `--dtype`'s
choices, the accepted row formats, and export-drafter's refusal (run for real)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

from hsmon.contracts import stop_signals

REPO = Path(__file__).resolve().parents[1]
DOCS = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
VERSION = re.compile(r"\b0\.5\.\d+\b")
# the sentences where an exit 0 beside a stop is not an hsmon command's own after a signal
OTHERS_EXIT_0 = r"forwarded signal|sglang-serve exits 0 or 143|real scripts that exit 0"


def text(name: str) -> str:
    return (REPO / name).read_text()


def test_the_tested_sglang_releases_are_one_list_the_plugins() -> None:
    sys.path.insert(0, str(REPO / "extractor" / "sglang" / "plugin_root"))
    from hsmon_sglang_plugin import TESTED_SGLANG_VERSIONS

    tested = set(TESTED_SGLANG_VERSIONS)
    extract = text("docs/extract.md")
    sentence = re.search(r"refuses an SGLang it was not tested with \(tested: ([^)]*)\)", extract)
    assert sentence and set(VERSION.findall(sentence.group(1))) == tested, sentence
    table = extract.split("### Supported SGLang releases", 1)[1].split("\n\n", 2)[1]
    rows = [line.split("|") for line in table.splitlines() if line.startswith("| 0.5")]
    assert {v for row in rows if row[-2].strip().startswith("yes") for v in VERSION.findall(row[1])} == tested
    matrix = re.search(r"^SGLANG_MATRIX \?= (.+)$", text("Makefile"), re.M)
    newest = re.search(r"^newest=(\S+)$", text("scripts/setup-sglang-env.sh"), re.M)
    assert matrix and newest and set(matrix.group(1).split()) | {newest.group(1)} == tested
    # nowhere else a list of its own: README and the other pages link to the table
    for page in DOCS:
        for line in page.read_text().splitlines():
            if re.search(r"[Tt]ested", line) and "SGLang" in line and len(set(VERSION.findall(line))) >= 2:
                assert page.name == "extract.md", (page.name, line)


def test_a_stop_by_signal_has_one_exit_status_in_the_code_and_the_docs() -> None:
    statuses = {"SIGINT": 130, "SIGTERM": 143, "SIGHUP": 129}
    for name, status in statuses.items():
        assert stop_signals.exit_status(getattr(signal, name)) == status
    said = 0
    for page in DOCS:
        words = " ".join(page.read_text().split())
        for number, name in re.findall(r"\b(1[2-4]\d),? (?:for )?(SIGINT|SIGTERM|SIGHUP)\b", words):
            assert int(number) == statuses[name], (page.name, number, name)
            said += 1
        for sentence in re.split(r"(?<=[.;])\s", words):
            stop = re.search(r"Ctrl-C|SIGINT|SIGTERM|SIGHUP|`stopped`|stop requested", sentence)
            if stop and re.search(r"\bexit(?: status)? 0\b", sentence):
                # an exit 0 beside a stop is someone else's: a forwarded child's (hsmon run), a server's
                assert re.search(OTHERS_EXIT_0, sentence), (page.name, sentence)
    assert said >= 3  # the docs do name them (extract, train, regenerate)


def test_dtype_choices_and_row_formats_are_the_parsers() -> None:
    from extractor.backends.hf import DTYPES
    from extractor.cli import DTYPE_NAMES
    from extractor.dataset import RowError, render_line

    assert set(DTYPE_NAMES) == {"auto", *DTYPES}
    synopsis = re.search(r"\[--dtype ([a-z0-9|]+)\]", text("docs/extract.md"))
    assert synopsis and set(synopsis.group(1).split("|")) == {"auto"} | {str(t).removeprefix("torch.")
                                                                     for t in DTYPES.values()}
    try:
        render_line(b'{"prompt": "x"}', None, None)  # type: ignore[arg-type]
    except RowError as exc:
        refusal = str(exc)
    formats = ("text", "conversations", "messages", "input_ids")
    assert all(f"'{name}'" in refusal for name in formats), refusal
    for page in ("docs/extract.md", "docs/index.md"):
        assert all(f'"{name}"' in text(page) or f"`{name}`" in text(page) for name in formats), page


def test_export_drafters_refusal_is_the_one_the_guide_quotes(tmp_path: Path) -> None:
    from trainer.export import NO_SUCH_CHECKPOINT

    proc = subprocess.run([sys.executable, "-m", "hsmon", "export-drafter", str(tmp_path / "none"),
                           "--out", str(tmp_path / "export")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        f"hsmon export-drafter: {tmp_path / 'none'}: {NO_SUCH_CHECKPOINT}"], proc.stderr
    guide = " ".join(text("docs/train.md").split())
    assert f"CKPT: {' '.join(NO_SUCH_CHECKPOINT.split())}" in guide.replace("`hsmon train`", "`hsmon train`")
