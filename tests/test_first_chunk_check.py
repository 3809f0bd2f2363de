"""The first-chunk check's choices without a server (the check itself, on a real SGLang server, is
tests/test_extract_sglang.py::test_an_untested_release_gets_its_first_chunk_checked_against_transformers)."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

from extractor import first_chunk_check as fcc
from extractor.backends.sglang.preflight import facts_of

INFO = {"model_path": "/m", "dtype": "float32", "chunked_prefill_size": 64,
        "return_aux_hidden_state_layer_ids": [1, 3, 4]}


def _backend(*plugins: dict | None) -> SimpleNamespace:
    return SimpleNamespace(facts=[facts_of(f"http://s{i}", {**INFO, "hsmon_plugin": p} if p else INFO)
                                  for i, p in enumerate(plugins)])


def test_only_servers_that_say_untested_are_checked(tmp_path, capsys):
    tested = {"version": "1", "sglang_version": "0.5.23", "adapter": "aux-return", "tested": True}
    untested = {**tested, "sglang_version": "0.5.20", "adapter": "layer-capture", "tested": False}
    stop = threading.Event()
    assert fcc.start(tmp_path, Path("/m"), _backend(tested, None), False, stop) is None
    assert fcc.start(tmp_path, Path("/m"), SimpleNamespace(), False, stop) is None  # backend hf
    assert fcc.untested_servers(_backend(tested, untested).facts) == [
        fcc.Untested("http://s1", "0.5.20", "layer-capture")]
    assert fcc.start(tmp_path, Path("/m"), _backend(untested), True, stop) is None
    assert "first-chunk check skipped (--skip-first-chunk-check)" in capsys.readouterr().err


def test_a_chunk_of_rejects_only_is_not_the_one_checked(tmp_path):
    check = fcc.FirstChunkCheck(tmp_path, Path("/m"), [fcc.Untested("http://s", "0.5.20", "layer-capture")],
                                threading.Event())
    check.chunk_done({"chunk": "rows_0-4", "rows": 0, "rejects": 4})
    assert not check._wake.is_set()
    check.chunk_done({"chunk": "rows_4-8", "rows": 3, "rejects": 1})
    check.chunk_done({"chunk": "rows_8-12", "rows": 4, "rejects": 0})
    assert check._chunk == "rows_4-8" and check._wake.is_set()
    want = ["hsmon", "verify-data", str(tmp_path), "--backend", "hf", "--model", "/m", "--chunk", "rows_4-8",
            "--sample", "8", "--json"]
    assert check.command("rows_4-8")[2:] == want


def test_a_run_that_ends_before_any_chunk_runs_no_check(tmp_path):
    stop = threading.Event()
    check = fcc.FirstChunkCheck(tmp_path, Path("/m"), [fcc.Untested("http://s", "0.5.20", "layer-capture")],
                                stop)
    check.start()
    stop.set()
    check.finish(stopped=True)
    assert not check.is_alive() and check._proc is None and check.verdict is None and check.error is None
