"""The no-silent-skip switch (tests/conftest.py): a real pytest run in a subprocess on a tiny module
that skips, with this suite's conftest beside it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TINY = '''
import pytest

def test_runs():
    assert True

def test_needs_a_thing():
    pytest.skip("no thing here")

def test_allowed():
    pytest.skip("no GPU")
'''
WHOLE = 'import pytest\npytest.importorskip("hsmon_no_such_module")\n\ndef test_x():\n    pass\n'


def _pytest(tmp: Path, env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    conftest = (Path(__file__).parent / "conftest.py").read_text()
    (tmp / "conftest.py").write_text(conftest + '\nALLOWED_SKIPS["test_tiny.py::test_allowed"] = "no GPU"\n')
    (tmp / "test_tiny.py").write_text(TINY)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "HSMON_NO_SKIP")} | env_extra
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", str(tmp)],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip


def test_without_the_switch_a_skip_stays_a_skip(tmp_path):
    run = _pytest(tmp_path, {})
    assert run.returncode == 0, run.stdout
    assert "1 passed, 2 skipped" in run.stdout


def test_under_the_switch_an_unlisted_skip_fails_and_a_listed_one_stays(tmp_path):
    for env in ({"HSMON_NO_SKIP": "1"}, {"CI": "true"}):
        run = _pytest(tmp_path, env)
        assert run.returncode == 1, run.stdout
        assert "1 failed, 1 passed, 1 skipped" in run.stdout, run.stdout
        assert "FAILED test_tiny.py::test_needs_a_thing" in run.stdout
        assert "not on ALLOWED_SKIPS (tests/conftest.py): no thing here" in run.stdout
        assert "SKIPPED [1] test_tiny.py:11: no GPU" in run.stdout


def test_under_the_switch_a_module_skipped_at_collection_fails(tmp_path):
    (tmp_path / "test_whole.py").write_text(WHOLE)
    run = _pytest(tmp_path, {"HSMON_NO_SKIP": "1"})
    assert run.returncode != 0, run.stdout
    assert "module skipped under CI=true/HSMON_NO_SKIP=1" in run.stdout
    assert "hsmon_no_such_module" in run.stdout
