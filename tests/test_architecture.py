"""The architecture's import rules ([tool.importlinter] in pyproject.toml) hold, and a violating
import fails them with the rule's name (run on a copy of the packages with one bad import added)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).parent / "lint-imports"


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT), str(root / "pyproject.toml"), "--no-cache"], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300)


def test_the_import_rules_hold() -> None:
    proc = lint(ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_a_monitor_module_importing_torch_breaks_the_named_rule(tmp_path: Path) -> None:
    for name in ("hsmon", "extractor", "trainer"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "embedded",
                                                                                       "plugin_root", "*.md"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    monitor = tmp_path / "hsmon" / "core" / "trackers" / "disk.py"
    monitor.write_text(monitor.read_text() + "\n\ndef _bad() -> None:\n    import torch  # noqa: F401\n")
    cycle = tmp_path / "extractor" / "errors.py"
    cycle.write_text(cycle.read_text() + "\n\ndef _cycle() -> None:\n    import extractor.prepare\n")
    proc = lint(tmp_path)
    said = " ".join(proc.stdout.split())
    assert proc.returncode != 0
    assert "never imports torch, transformers, sglang or vllm BROKEN" in said
    assert "hsmon.core.trackers.disk -> torch" in said
    assert "no import cycles between the modules of extractor, trainer and the monitor BROKEN" in said
    assert ".errors -> .prepare" in said


def test_the_contracts_rule_names_every_part_of_hsmon_but_the_contracts() -> None:
    """A new module or package at the hsmon/ root is forbidden to extractor/ and trainer/ too."""
    import tomllib

    rules = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    rule = next(r for r in rules if r["source_modules"] == ["extractor", "trainer"])
    listed = set(rule["forbidden_modules"])
    package = ROOT / "hsmon"
    parts = {f"hsmon.{p.stem}" for p in package.glob("*.py") if p.stem not in ("__init__", "__main__")}
    parts |= {f"hsmon.{p.name}" for p in package.iterdir() if (p / "__init__.py").is_file()}
    assert parts - {"hsmon.contracts"} == listed, "pyproject.toml: list each part of hsmon/ but contracts"
