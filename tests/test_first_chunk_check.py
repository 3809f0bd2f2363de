"""The first-chunk check's choices without a server (the check itself, on a real SGLang server, is
tests/test_extract_sglang.py::test_an_untested_release_gets_its_first_chunk_checked_against_transformers)."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

from extractor import first_chunk_check as fcc
from extractor.backends.sglang.preflight import facts_of, release_line
from hsmon.contracts.sglang_classes import CLASS_RULES

INFO = {"model_path": "/m", "dtype": "float32", "chunked_prefill_size": 64,
        "return_aux_hidden_state_layer_ids": [1, 3, 4]}


def _backend(*plugins: dict | None) -> SimpleNamespace:
    return SimpleNamespace(facts=[facts_of(f"http://s{i}", {**INFO, "hsmon_plugin": p} if p else INFO)
                                  for i, p in enumerate(plugins)])


UNTESTED = fcc.Unchecked("http://s", "an untested SGLang release", True)


def test_only_servers_that_say_untested_are_checked(tmp_path, capsys):
    tested = {"version": "1", "sglang_version": "0.5.23", "adapter": "aux-return", "tested": True}
    untested = {**tested, "sglang_version": "0.5.20", "adapter": "layer-capture", "tested": False}
    stop = threading.Event()
    assert fcc.start(tmp_path, Path("/m"), _backend(tested, None), False, stop) is None
    assert fcc.start(tmp_path, Path("/m"), SimpleNamespace(), False, stop) is None  # backend hf
    assert fcc.untested_servers(_backend(tested, untested).facts) == [
        fcc.Unchecked("http://s1", "an untested SGLang release (SGLang 0.5.20, layer-capture)", True)]
    assert fcc.start(tmp_path, Path("/m"), _backend(untested), True, stop) is None
    assert "first-chunk check skipped (--skip-first-chunk-check)" in capsys.readouterr().err


def test_a_model_class_the_conformance_tests_cannot_serve_is_checked_on_a_tested_release(tmp_path, capsys):
    """Kimi-K2.5's wrapper class (SGLang's KimiK25ForConditionalGeneration, the class the rule table
    names for it) cannot be served here: its first chunk is checked by default; the classes the
    conformance tests serve are not."""
    tested = {"version": "1", "sglang_version": "0.5.23", "adapter": "aux-return", "tested": True}
    kimi = {**tested, "model_class": "KimiK25ForConditionalGeneration"}
    assert "KimiK25ForConditionalGeneration" in CLASS_RULES  # the name SGLang's class table gives it
    served = [{**tested, "model_class": name} for name in ("LlamaForCausalLM", "DeepseekV3ForCausalLM",
                                                           "Qwen3MoeForCausalLM")]
    assert fcc.untested_servers(_backend(*served).facts) == []
    [found] = fcc.untested_servers(_backend(tested, kimi).facts)
    assert found.url == "http://s1" and not found.untested_release
    assert found.why == ("model class KimiK25ForConditionalGeneration, which hsmon's conformance tests do "
                         "not serve")
    line = release_line(facts_of("http://s", {**INFO, "hsmon_plugin": kimi}))
    assert "model class KimiK25ForConditionalGeneration, not served by hsmon's conformance tests: hsmon " \
           "verify-data checks the first chunk" in line
    check = fcc.FirstChunkCheck(tmp_path, Path("/m"), [found], threading.Event())
    check._judge("rows_0-4", 1, '{"verdict": "disagree", "differ": ["5"]}', "", fcc._servers([found]))
    assert check.verdict == "disagree" and check.error is not None
    assert "http://s1 (model class KimiK25ForConditionalGeneration" in check.error
    assert "report the model class" in check.error and "tested SGLang release" not in check.error
    assert fcc.start(tmp_path, Path("/m"), _backend(kimi), True, threading.Event()) is None
    assert "the data of http://s0 (model class KimiK25ForConditionalGeneration" in capsys.readouterr().err


def test_a_chunk_of_rejects_only_is_not_the_one_checked(tmp_path):
    check = fcc.FirstChunkCheck(tmp_path, Path("/m"), [UNTESTED],
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
    check = fcc.FirstChunkCheck(tmp_path, Path("/m"), [UNTESTED],
                                stop)
    check.start()
    stop.set()
    check.finish(stopped=True)
    assert not check.is_alive() and check._proc is None and check.verdict is None and check.error is None
