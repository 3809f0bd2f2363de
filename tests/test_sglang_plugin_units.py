"""The capture plugin without a server: version check, request validation, the atomic write.

The plugin package is plain Python plus torch/safetensors, so its pure parts run in hsmon's
environment; the entry-point discovery and the refusal inside SGLang run in SGLang's own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from extractor.sglang import serve
from tests.sglang_server import sglang_python

sys.path.insert(0, str(serve.PLUGIN_ROOT))
import hsmon_sglang_plugin as plugin
from hsmon_sglang_plugin import dump


def test_version_check_refuses_untested_and_honours_the_override():
    assert plugin.version_refusal("0.5.23", {}) is None
    message = plugin.version_refusal("0.6.0", {})
    assert message is not None and "0.6.0" in message and "0.5.23" in message
    assert "HSMON_PLUGIN_ALLOW_UNTESTED=1" in message and "\n" not in message
    assert plugin.version_refusal("0.6.0", {"HSMON_PLUGIN_ALLOW_UNTESTED": "1"}) is None
    assert plugin.version_refusal("0.6.0", {"HSMON_PLUGIN_ALLOW_UNTESTED": "0"}) is not None


def test_pipeline_parallel_is_refused():
    assert plugin.pp_refusal(1) is None
    assert "--pp-size 2" in plugin.pp_refusal(2)


def test_rid_and_dump_dir_validation(tmp_path):
    root = tmp_path / "root"
    (root / "job").mkdir(parents=True)
    assert dump.check_rid("row-12_a.b") == "row-12_a.b"
    for bad in ("../x", "a/b", ".hidden", "", "x" * 201, 5):
        with pytest.raises(dump.DumpRefused):
            dump.check_rid(bad)
    assert dump.check_dump_dir(str(root / "job"), str(root)) == os.path.realpath(root / "job")
    assert dump.check_dump_dir(str(root / "new" / "deep"), str(root))  # created later
    (root / "escape").symlink_to(tmp_path)
    for bad in ("job", str(tmp_path / "elsewhere"), str(root / ".." / "x"), str(root / "escape" / "j"), None):
        with pytest.raises(dump.DumpRefused):
            dump.check_dump_dir(bad, str(root))


def _tensors(seq: int = 7, hidden: int = 16, k: int = 3) -> dict[str, torch.Tensor]:
    return {"hidden_state": torch.randn(seq, hidden), "aux_hidden_state": torch.randn(seq, k * hidden)}


def test_write_dump_renames_a_complete_file(tmp_path, monkeypatch):
    import safetensors.torch

    tensors = _tensors()
    target = tmp_path / "d" / "job"
    seen = {}
    real_save = safetensors.torch.save_file

    def watching_save(data, filename, metadata=None):
        # while the bytes are being written, nothing exists under the final name
        seen["final_during_write"] = (target / "r1.safetensors").exists()
        seen["tmp_name"] = Path(filename).name
        real_save(data, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", watching_save)
    meta = {"rid": "r1", "tokens": "7", "layer_ids": "1,3,4", "sglang_version": "x", "plugin_version": "1"}
    marker = dump.write_dump(str(target), "r1", tensors, meta)
    assert seen == {"final_during_write": False, "tmp_name": ".r1.safetensors.tmp"}
    final = target / "r1.safetensors"
    assert marker == {"mode": "dump", "ok": True, "file": str(final), "tokens": 7,
                      "bytes": final.stat().st_size}
    assert sorted(p.name for p in target.iterdir()) == ["r1.safetensors"]
    assert oct(target.stat().st_mode & 0o777) == oct(0o700)
    with safe_open(str(final), framework="pt") as fh:
        assert fh.metadata() == meta
        for name, tensor in tensors.items():
            assert torch.equal(fh.get_tensor(name), tensor)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_write_dump_on_a_full_tmpfs_reports_enospc_and_leaves_nothing(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=True)
    try:
        marker = dump.write_dump(str(mount / "job"), "big", _tensors(seq=2048, hidden=64),
                                 {"tokens": "2048"})
        assert marker["ok"] is False and marker["errno"] == "ENOSPC", marker
        assert "big.safetensors" in marker["error"] and "\n" not in marker["error"]
        assert list((mount / "job").iterdir()) == []  # neither the final name nor the .tmp
        small = dump.write_dump(str(mount / "job"), "small", _tensors(seq=4), {"tokens": "4"})
        assert small["ok"] is True  # the directory still works once there is room
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.sglang
def test_sglang_loads_the_entry_point_refuses_untested_versions_and_pipeline_parallelism():
    # One process (importing sglang takes long): SGLang's own load_plugins() twice, first with a
    # version the plugin was not tested with, then again with the override set.
    code = (
        "import importlib.metadata as md, os, sglang\n"
        # a scheduler process has imported this when it loads the plugins
        "import sglang.srt.managers.scheduler\n"
        "from sglang.srt import plugins\n"
        "from sglang.srt.plugins.hook_registry import HookRegistry\n"
        "eps = md.entry_points(group='sglang.srt.plugins')\n"
        "print('EPS', [(e.name, e.value, e.dist.name) for e in eps])\n"
        "sglang.__version__ = '0.9.1'\n"
        "try:\n"
        "    plugins.load_plugins()\n"
        "    print('LOADED WITHOUT OVERRIDE')\n"
        "except SystemExit as exc:\n"
        "    print('REFUSED', exc)\n"
        "print('PATCHED BEFORE', sorted(HookRegistry._patched))\n"
        "os.environ['HSMON_PLUGIN_ALLOW_UNTESTED'] = '1'\n"
        "plugins._plugins_loaded = False\n"
        "plugins.load_plugins()\n"
        "print('PATCHED AFTER', sorted(HookRegistry._patched))\n"
        "from sglang.srt.server_args import ServerArgs\n"
        "ServerArgs(model_path='m', tp_size=2)\n"
        "try:\n"
        "    ServerArgs(model_path='m', pp_size=2).resolve_once()\n"
        "    print('PP ACCEPTED')\n"
        "except SystemExit as exc:\n"
        "    print('PP', exc)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "HSMON_PLUGIN_ALLOW_UNTESTED"}
    env["PYTHONPATH"] = os.pathsep.join([str(serve.PLUGIN_ROOT), str(serve.CPU_STUBS)])
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    proc = subprocess.run([str(sglang_python()), "-c", code], capture_output=True, text=True, timeout=400,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = {line.split(" ", 1)[0] + (" " + line.split(" ")[1] if line.startswith("PATCHED") else ""): line
             for line in proc.stdout.splitlines()}
    assert lines["EPS"] == "EPS [('hsmon_capture', 'hsmon_sglang_plugin:register', 'hsmon-sglang-plugin')]"
    assert "LOADED" not in lines and "SGLang 0.9.1 is untested (tested: 0.5.23)" in lines["REFUSED"]
    assert lines["PATCHED BEFORE"] == "PATCHED BEFORE []"
    assert "--pp-size 2) is not supported" in lines["PP"]
    assert lines["PATCHED AFTER"] == "PATCHED AFTER " + str(sorted([
        "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor."
        "_append_prefill_hidden_states",
        "sglang.srt.server_args.ServerArgs.resolve_once",
        "sglang.srt.utils.common.build_server_info",
    ]))
