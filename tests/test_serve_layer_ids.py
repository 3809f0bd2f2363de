"""`hsmon sglang-serve`'s choices for other model families, without starting SGLang: the layer ids
by the class's rule (a class that cannot capture the points refused in one line before launch),
DP attention refused, and the CPU cores of each rank of a multi-rank CPU server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from extractor.sglang.cpu_binding import BIND_ENV, bind_env, binding, ranks
from extractor.sglang.layer_ids import LayerIdsError, serving_ids
from extractor.sglang.serve import dp_attention_refusal

ROOT = Path(__file__).resolve().parents[1]


def _model(tmp_path: Path, arch: str, nested: bool = False) -> Path:
    text = {"num_hidden_layers": 8, "architectures": [arch]}
    config = {"architectures": [arch], "text_config": text} if nested else text
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(("arch", "nested", "ids"), [
    ("LlamaForCausalLM", False, [2, 4, 5]), ("Qwen3MoeForCausalLM", False, [2, 4, 5]),
    ("DeepseekV3ForCausalLM", False, [3, 5, 6]), ("KimiK25ForConditionalGeneration", True, [3, 5, 6]),
    ("SomeNewForCausalLM", False, [2, 4, 5]),  # not in the table: Llama's ids, the plugin asks the class
])
def test_the_command_lines_ids_follow_the_classs_rule(tmp_path: Path, arch: str, nested: bool,
                                                      ids: list[int]) -> None:
    assert serving_ids([3, 5, 6], _model(tmp_path, arch, nested)) == (ids, arch)


def test_a_class_that_cannot_capture_the_points_is_refused_in_one_line_before_launch(tmp_path: Path) -> None:
    model = _model(tmp_path, "DeepseekV3ForCausalLM")
    with pytest.raises(LayerIdsError, match="choose points whose first is not 1"):
        serving_ids([1, 4, 5], model)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for args, why in ((["--layers", "1,4,5"], "SGLang's DeepseekV3ForCausalLM cannot capture them"),
                      (["--", "--enable-dp-attention"], "--enable-dp-attention (DP attention) is not"),
                      (["--", "--tp-size", "2", "--attn-dp-size=2"], "--attn-dp-size 2 (DP attention)")):
        proc = subprocess.run([sys.executable, "-m", "hsmon", "sglang-serve", "--model-path", str(model),
                               "--python", sys.executable, *args], capture_output=True, text=True, env=env,
                              timeout=60)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and why in lines[0], proc.stderr


def test_dp_attention_is_refused_in_every_spelling_naming_what_to_use_instead() -> None:
    for extra in (["--enable-dp-attention"], ["--enable-dp-attention", "--dp-size", "2"],
                  ["--attn-dp-size", "2"], ["--attn-dp-size=4"],
                  ["--attn-dp-size", "1", "--attn-dp-size", "2"]):
        line = dp_attention_refusal(extra)
        assert line is not None and "use --tp-size, or --dp-size without DP attention" in line, extra
    for extra in ([], ["--dp-size", "2"], ["--attn-dp-size", "1"],
                  ["--enable-dp-attention-local-control-broadcast"]):
        assert dp_attention_refusal(extra) is None, extra


def test_each_rank_of_a_multi_rank_cpu_server_gets_its_cores() -> None:
    assert ranks(["--dtype", "float32", "--tp-size", "2"]) == 2
    assert ranks(["--tp=2", "--dp-size", "2"]) == 4 and ranks([]) == 1
    assert binding(2, [0, 1]) == "0|1"
    assert binding(2, list(range(8))) == "0-3|4-7"
    assert binding(3, [0, 1]) == "0|1|0"  # fewer cores than ranks: shared round-robin
    env: dict[str, str] = {}
    assert bind_env(env, ["--tp-size", "1"]) is None and BIND_ENV not in env
    assert bind_env(env, ["--tp-size", "2"]) == env[BIND_ENV] and env[BIND_ENV].count("|") == 1
    given = {BIND_ENV: "0-15|16-31"}
    assert bind_env(given, ["--tp-size", "2"]) is None and given[BIND_ENV] == "0-15|16-31"
