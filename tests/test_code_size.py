"""The size rule, checked: a module reads in one sitting (at most 400 lines), a function at most 80.

Ruff's own rules count statements or branches (PLR0915, C901), not lines, and a long function of
plain statements is as hard to read as a branchy one; so this counts lines, over every tracked
Python file. The exceptions are reviewed, each with its reason, and an entry that no longer
exceeds the rule fails too, so the list only shrinks. Run it alone: ``python -m pytest
tests/test_code_size.py``; ``python tests/test_code_size.py`` prints every offender.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULE_LINES = 400
FUNCTION_LINES = 80

# "path" for a module, "path:function" for a function (nested functions by their own name).
REVIEWED: dict[str, str] = {
    # declarative: recorded status documents written out as literals, one field a line
    "tests/tui_documents.py:extraction_job": "declarative: a status document as literals",
    "tests/tui_run_documents.py": "declarative: the recorded run's status documents as literals",
    "tests/tui_run_documents.py:extraction": "declarative: a status document as literals",
    "tests/tui_run_documents.py:training": "declarative: a status document as literals",
    "tests/tui_run_documents.py:acceptance": "declarative: a status document as literals",
    "trainer/cli.py:add_arguments": "declarative: the trainer's flags, one add_argument each",
    # to split along their seams when the hsmon/ root moves into packages by role
    # test modules that share one real server or model per module (their fixtures' cost)
    "tests/test_daemon.py": "one module: its daemons share fixtures",
    "tests/test_extract_run.py": "one module: the kill-9 series shares its model",
    "tests/test_extract_sglang.py": "one module: the tests share one real SGLang server",
    "tests/test_smollm2.py": "one module: the tests share one SmolLM2 conversion and server",
    "tests/test_trackers.py": "one module per tracker to come: shared helpers first",
    "tests/test_train.py": "one module: the tests share one trained drafter",
    "tests/test_tui_pilot.py": "one module: the pilot tests share their recorded documents",
    "tests/test_extract_run.py:test_ctrl_c_reads_stopped_everywhere_exits_130_and_resume_completes":
        "one real extraction stopped, read everywhere, then resumed",
    "tests/test_run_daemon.py:test_external_endings_done_dead_exited_and_one_warning":
        "one real daemon watching four endings in sequence",
}


def tracked_python_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", "*.py"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name and (ROOT / name).is_file()]


def sizes(path: Path, root: Path = ROOT) -> dict[str, int]:
    """Each module's and each function's length in lines, keyed as REVIEWED is."""
    text = path.read_text()
    rel = path.relative_to(root).as_posix()
    found = {rel: text.count("\n") + (0 if text.endswith("\n") or not text else 1)}
    for node in ast.walk(ast.parse(text, filename=rel)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            found[f"{rel}:{node.name}"] = max(found.get(f"{rel}:{node.name}", 0), node.end_lineno - first + 1)
    return found


def offenders() -> dict[str, int]:
    over = {}
    for path in tracked_python_files():
        for key, lines in sizes(path).items():
            limit = FUNCTION_LINES if ":" in key else MODULE_LINES
            if lines > limit:
                over[key] = lines
    return over


def test_no_module_or_function_over_the_rule_outside_the_reviewed_list() -> None:
    over = offenders()
    new = {k: v for k, v in over.items() if k not in REVIEWED}
    assert not new, (
        f"over the size rule (modules {MODULE_LINES} lines, functions {FUNCTION_LINES}): "
        + ", ".join(f"{k} ({v} lines)" for k, v in sorted(new.items()))
        + ": split it along its seams (or, for a declarative table, add it to REVIEWED with the reason)"
    )
    stale = sorted(k for k in REVIEWED if k not in over)
    assert not stale, f"within the rule now, remove it from REVIEWED: {', '.join(stale)}"


def test_the_rule_counts_a_long_function_and_a_long_module(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(90))
    sample = tmp_path / "sample.py"
    sample.write_text("def long():\n" + body + "\n" + "\n" * 320)
    found = sizes(sample, tmp_path)
    assert found["sample.py:long"] == 91
    assert found["sample.py"] == 411


if __name__ == "__main__":
    for key, lines in sorted(offenders().items()):
        print(f"{lines:5d}  {key}{'  (reviewed)' if key in REVIEWED else ''}", file=sys.stdout)
