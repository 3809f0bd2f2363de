"""The documentation site builds with `mkdocs build --strict` (a broken link or anchor, or a page left
out of the nav, fails it), its generated command-line reference is the parsers' own, and its
configuration reference lists exactly the keys the TOML reader accepts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


def test_the_site_builds_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    done = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()


def test_a_broken_anchor_fails_the_build(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    index = copy / "docs" / "index.md"
    index.write_text(index.read_text() + "\n[gone](daemon.md#no-such-section)\n")
    done = build(copy / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-section" in done.stdout + done.stderr


def test_the_command_line_reference_is_generated_from_the_parsers() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "cli_reference.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_configuration_reference_is_generated_from_the_config_reader() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "config_reference.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_stale_configuration_reference_fails_the_check(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "scripts", copy / "scripts")
    shutil.copytree(ROOT / "hsmon", copy / "hsmon", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "docs" / "reference").mkdir(parents=True)
    page = (ROOT / "docs" / "reference" / "config.md").read_text()
    assert "| `retire_grace` |" in page
    (copy / "docs" / "reference" / "config.md").write_text(page.replace("| `retire_grace` |", "| `retire` |"))
    done = subprocess.run([sys.executable, str(copy / "scripts" / "config_reference.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "docs/reference/config.md differs from the code" in done.stderr
