"""SGLang 0.5.14 (SpecForge's pinned release; adapter ``whole-prefill``) served with chunked
prefill off, against the in-process extraction of the same weights.

0.5.14 drops the middle pieces of a chunked prefill before any hook, so `hsmon sglang-serve`
refuses it unless ``--chunked-prefill-size -1`` is given (one line naming that setting); with
it every prompt is one piece, and both transports give the in-process rows (float32, the Llama
check's 1e-4) for prompts from 11 to 600 tokens, no dump file left. Runs in make
test-sglang-matrix's 0.5.14 lane only (the newer releases chunk; their conformance tests cover
this and more), so ``make test`` skips it (tests/conftest.py's ALLOWED_SKIPS).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.extract_helpers import load_output, run_extract, sglang_equals_in_process
from tests.sglang_server import EMBEDDED_MODEL, ROOT, SGLangServer, get_json, sglang_python, sglang_release

pytestmark = [pytest.mark.sglang]

ROWS = [list(range(5, 45)), [(i * 37) % 500 + 3 for i in range(150)],
        [7, 300, 12, 99, 41, 5, 6, 8, 200, 3, 17], [(i * 7) % 400 + 20 for i in range(600)]]
# 0.5.14's CPU memory estimate with chunked prefill off leaves no KV cache ("--mem-fraction-static
# -0.049"): a fraction of its own; the KV cache is --max-total-tokens' anyway
WHOLE = ("--mem-fraction-static", "0.5")


def high_free_port() -> int:
    """A port above 61000 (outside the ephemeral range) that binds now."""
    for port in range(65000, 61000, -1):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port between 61001 and 65000")


@pytest.fixture(scope="module")
def whole_prefill_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangServer]:
    sglang_python()
    if sglang_release()["adapter"] != "whole-prefill":
        pytest.skip(f"SGLang {sglang_release()['sglang_version']} chunks prefills through the plugin's hook: "
                    "this module is 0.5.14's (make test-sglang-matrix)")
    base = tmp_path_factory.mktemp("whole-prefill")
    # a port past 55535 on purpose: 0.5.14 puts its gRPC port at --port + 10000 (sglang-serve moves it)
    server = SGLangServer(EMBEDDED_MODEL, base, chunked_prefill_size=-1, dump_root=base / "dump",
                          extra_args=WHOLE, port=high_free_port())
    try:
        yield server.start()
    finally:
        server.stop()


def test_sglang_serve_refuses_0_5_14_unless_chunked_prefill_is_off(whole_prefill_server: SGLangServer,
                                                                   tmp_path: Path) -> None:
    for extra in ((), ("--chunked-prefill-size", "64")):
        cmd = [sys.executable, "-m", "hsmon", "sglang-serve", "--model-path", str(EMBEDDED_MODEL),
               "--port", "1", "--python", str(sglang_python()), "--device", "cpu",
               "--dump-dir", str(tmp_path), "--", *extra]
        proc = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                              text=True, timeout=120)
        line = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 2 and "drops the middle pieces of a chunked prefill" in line, proc.stderr
        assert "--chunked-prefill-size -1" in line


def test_both_transports_equal_the_in_process_rows(whole_prefill_server: SGLangServer,
                                                   tmp_path: Path) -> None:
    server = whole_prefill_server
    plugin = get_json(server.url + "/server_info")["hsmon_plugin"]
    assert plugin["adapter"] == "whole-prefill" and plugin["tested"] is True
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"input_ids": r}) + "\n" for r in ROWS))
    proc = run_extract(data, tmp_path / "hf", EMBEDDED_MODEL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = load_output(tmp_path / "hf")
    assert sorted(want) == list(range(len(ROWS)))
    worst = sglang_equals_in_process(server.url, server.dump_root, data, want, tmp_path, EMBEDDED_MODEL,
                                     rows=ROWS)
    for transport, difference in worst.items():
        print(f"0.5.14 {transport}: {len(want)} rows, max abs difference {difference:.2e}")
