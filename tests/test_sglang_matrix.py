"""The SGLang release check, on the environment the servers run on (HSMON_SGLANG_VENV; make
test-sglang-matrix runs this module on each release of docs/extract.md's support table).

No server starts: the plugin's probe reads SGLang's files, and `hsmon sglang-serve` refuses before
it launches anything. The registry-less release is the environment's own SGLang with its
``srt/plugins`` package left out (a tree of links: everything else is the real code), and the
untested release is the same SGLang under a ``sglang-9.9.9.dist-info`` that shadows its version.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from extractor.sglang import serve
from tests.sglang_server import EMBEDDED_MODEL, ROOT, sglang_python, sglang_release

pytestmark = [pytest.mark.sglang]

# release -> adapter: the support table of docs/extract.md
SUPPORTED = {"0.5.14": "whole-prefill", "0.5.18": "layer-capture", "0.5.22": "layer-capture",
             "0.5.23": "aux-return"}


def _sglang_dir() -> Path:
    out = subprocess.run([str(sglang_python()), "-c", "import importlib.util as u; "
                          "print(list(u.find_spec('sglang').submodule_search_locations)[0])"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return Path(out.strip())


def _linked_tree(dst: Path, without_plugins: bool) -> Path:
    """``dst/sglang``: links to the real package, ``srt/plugins`` left out when asked."""
    src = _sglang_dir()
    pkg = dst / "sglang"
    (pkg / "srt").mkdir(parents=True)
    for entry in src.iterdir():
        if entry.name != "srt":
            (pkg / entry.name).symlink_to(entry)
    for entry in (src / "srt").iterdir():
        if not (without_plugins and entry.name == "plugins"):
            (pkg / "srt" / entry.name).symlink_to(entry)
    return dst


def _serve(tmp_path: Path, pythonpath: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    cmd = [sys.executable, "-m", "hsmon", "sglang-serve", "--model-path", str(EMBEDDED_MODEL), "--port", "1",
           "--python", str(sglang_python()), "--device", "cpu", "--dump-dir", str(tmp_path), *args]
    return subprocess.run(cmd, env={**env, "PYTHONPATH": f"{ROOT}{os.pathsep}{pythonpath}"},
                          capture_output=True, text=True, timeout=120)


def test_the_environment_is_a_supported_release_with_its_adapter():
    release = sglang_release()
    assert release["sglang_version"] in SUPPORTED, release
    assert release["adapter"] == SUPPORTED[release["sglang_version"]] and release["tested"] is True
    assert release["hook_registry"] is True and release["refusal"] is None
    assert release["aux_return"] is (release["adapter"] == "aux-return")


def test_a_release_without_the_hook_registry_is_refused_naming_the_oldest_supported(tmp_path):
    tree = _linked_tree(tmp_path / "old", without_plugins=True)
    proc = _serve(tmp_path, tree)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "has no plugin hook registry" in lines[0], proc.stderr
    assert "the oldest supported release is 0.5.14 (with chunked prefill off; 0.5.18 with it on)" in lines[0]


def test_an_untested_release_is_refused_unless_the_user_opts_in(tmp_path):
    shadow = tmp_path / "shadow"
    dist = shadow / "sglang-9.9.9.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 9.9.9\n")
    probe = subprocess.run([str(sglang_python()), "-m", "hsmon_sglang_plugin.features"],
                           env={**os.environ, "PYTHONPATH": f"{shadow}{os.pathsep}{serve.PLUGIN_ROOT}"},
                           capture_output=True, text=True, check=True, timeout=60)
    found = json.loads(probe.stdout)
    assert found["sglang_version"] == "9.9.9" and found["tested"] is False
    proc = _serve(tmp_path, shadow)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "SGLang 9.9.9 is outside the tested releases" in lines[0]
    assert "--allow-untested-sglang" in lines[0]
    assert serve.check_release(found, allow_untested=True) is None  # the opt-in lets it start
