"""Targets of other families in-process: tiny random DeepSeek-V3 (MLA + MoE, YaRN rope) and
Kimi-K2.5 (its multimodal wrapper around a DeepSeek-V3 text model), made by `hsmon make-target
--preset tiny-...`, extracted by `hsmon extract --model`: every capture point equals transformers'
own ``hidden_states[p]`` of the text model; a row with image content is rejected in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.extract_helpers import load_output, run_extract

POINTS = [3, 5, 6]  # the first is not 2: SGLang's DeepSeek class counts these differently


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("families")
    made = {}
    for preset in ("tiny-deepseek-v3", "tiny-kimi-k25"):
        proc = subprocess.run([sys.executable, "-m", "hsmon", "make-target", "--preset", preset,
                               "--out", str(base / preset)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        made[preset] = Path(proc.stdout.strip().splitlines()[-1])
    return made


def _reference(model_dir: Path, ids: list[int]) -> tuple[torch.Tensor, ...]:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    if config.model_type == "kimi_k25":
        from transformers import AutoModelForImageTextToText

        wrapper = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
        text = wrapper.model.language_model  # the DeepSeek-V3 text model, called by itself
    else:
        from transformers import AutoModelForCausalLM

        text = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval().model
    with torch.inference_mode():
        return text(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states


@pytest.mark.parametrize("preset", ["tiny-deepseek-v3", "tiny-kimi-k25"])
def test_capture_points_equal_transformers_hidden_states_of_the_text_model(
        preset: str, targets: dict[str, Path], tmp_path: Path) -> None:
    model = targets[preset]
    config = json.loads((model / "config.json").read_text())
    text_config = config.get("text_config", config)
    assert text_config["model_type"] == "deepseek_v3" and text_config["num_hidden_layers"] == 8
    assert text_config["kv_lora_rank"] and text_config["n_routed_experts"] > 1
    assert text_config["rope_parameters"]["rope_type"] == "yarn"
    data = tmp_path / "data.jsonl"
    rows = [{"input_ids": list(range(5, 45))}, {"input_ids": [7, 300, 12, 99, 41, 5, 6, 8, 200, 3, 17]},
            {"conversations": [{"role": "user", "content": [{"type": "image", "image": "cat.png"},
                                                            {"type": "text", "text": "what is it?"}]}]}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    proc = run_extract(data, out, model, "--layers", ",".join(map(str, POINTS)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert [r["row"] for r in rejects] == [2]
    reason = rejects[0]["reason"]
    assert "image or video content is not extracted" in reason and "\n" not in reason
    got = load_output(out)
    assert sorted(got) == [0, 1]
    for row in (0, 1):
        ids = rows[row]["input_ids"]
        states = _reference(model, ids)
        aux = got[row]["aux_hidden_state"][0]  # [tokens, 3 * hidden], SpecForge's layout
        hidden = states[-1].shape[-1]
        for k, point in enumerate(POINTS):
            torch.testing.assert_close(aux[:, k * hidden:(k + 1) * hidden], states[point][0],
                                       rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got[row]["hidden_state"][0], states[-1][0], rtol=1e-5, atol=1e-5)
