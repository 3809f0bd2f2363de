"""scripts/gpu-check.sh's CPU fallback, end to end on a real SGLang server (no GPU here: the
cuda path of the script is not run by this test)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.sglang_server import ROOT, sglang_python

pytestmark = [pytest.mark.sglang, pytest.mark.slow]


def test_gpu_check_cpu_fallback_runs_end_to_end(tmp_path):
    sglang_python()
    env = {**os.environ, "DEVICE": "cpu", "ROWS": "6", "CONCURRENCY": "3", "SAMPLE": "3", "TPS_TOKENS": "64",
           "TPS_REQUESTS": "4", "WORK": str(tmp_path / "work"), "DUMP_ROOT": str(tmp_path / "dump"),
           "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(ROOT / "scripts" / "gpu-check.sh")], capture_output=True, text=True, env=env,
                          timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "CPU fallback" in proc.stderr
    result = proc.stdout.strip().splitlines()[-1]
    fields = dict(kv.split("=") for kv in result.removeprefix("RESULT ").split())
    assert fields["device"] == "cpu" and fields["verdict"] == "agree", result
    assert float(fields["extract_tokens_s"]) > 0 and float(fields["dump_over_none"]) > 0
    assert fields["gpu_pids_seen"] == "false"  # no NVML here: the panel says why, lists nothing
    assert re.search(r"daemon GPU panel: unavailable \(.+\)", proc.stdout), proc.stdout
    assert not any((tmp_path / "dump").rglob("*.safetensors"))  # every dump consumed
