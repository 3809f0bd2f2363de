"""Drafters on vLLM (make test-vllm): vLLM's own config path reads an export for vLLM as the points the
drafter was trained on, and an export for SGLang one layer off unless `hsmon vllm-serve --draft`
converts it; `hsmon eval-drafter --engine vllm` puts vLLM's own speculative figures beside hsmon's
evaluator and n-gram on the same prompts, with greedy decoding equal to the target's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from drafter_exports import TARGET, export_for
from vllm_server import ROOT, VLLMServer, vllm_python

from extractor.drafter_ids import for_engine

pytestmark = pytest.mark.vllm
POINTS = [
    2,
    4,
    5,
]  # the reference drafter's capture points (vLLM captures hidden_states[id]: test_extract_vllm)


def test_vllms_own_config_path_gives_an_export_for_vllm_the_trained_points(tmp_path):
    for_vllm = export_for("vllm", tmp_path / "for-vllm")
    for_sglang = export_for("sglang", tmp_path / "for-sglang")
    converted, _ = for_engine(for_sglang, "vllm", TARGET)  # what hsmon vllm-serve --draft serves
    done = subprocess.run(
        [
            str(vllm_python()),
            "-m",
            "tests.vllm_checks.config_probe",
            str(TARGET),
            str(for_vllm),
            str(for_sglang),
            str(converted),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got[0] == POINTS  # the ids vLLM hands set_aux_hidden_state_layers are the trained points
    assert got[1] == [1, 3, 4]  # an export for SGLang read as it is: one layer off (what hsmon prevents)
    assert got[2] == POINTS


@pytest.fixture(scope="module")
def speculative(tmp_path_factory):
    vllm_python()
    work = tmp_path_factory.mktemp("vllm-spec")
    draft = export_for("sglang", work / "for-sglang")  # served by vLLM through a converted copy
    srv = VLLMServer(TARGET, work, serve_args=("--draft", str(draft), "--draft-tokens", "4")).start()
    yield srv, draft, work
    srv.stop()


def test_eval_drafter_engine_vllm_reports_vllms_figures_beside_the_evaluator(speculative):
    srv, draft, work = speculative
    assert "served by vllm with ids [2, 4, 5] for the points it was trained on" in srv.log.read_text()
    sys.path.insert(0, str(ROOT / "tests"))
    from test_spec_decoding import held_out_prompts

    prompts = work / "held-out.jsonl"
    prompts.write_text("".join(json.dumps({"input_ids": p}) + "\n" for p in held_out_prompts(8)))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hsmon",
            "eval-drafter",
            "--engine",
            "vllm",
            "--server",
            srv.url,
            "--drafter",
            str(draft),
            "--target-model",
            str(TARGET),
            "--prompts",
            str(prompts),
            "--max-new-tokens",
            "48",
            "--threads",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])["sets"]["held-out"]
    assert result["engine"] == "vllm" and result["depth"] == 3 and result["prompts"] == 8
    assert result["outputs_match_greedy"] is True  # lossless: the target's own greedy tokens
    assert len(result["accepted_per_position"]) == 3 and result["accepted_per_position"][0] > 0.1
    assert result["engine_per_verify"] > 1.2 and result["finding"] is None  # vLLM agrees with the evaluator
    assert abs(result["engine_per_verify"] - result["evaluator"]) <= 0.15 * result["evaluator"]
    assert result["ngram"] > 1.0
