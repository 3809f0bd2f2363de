"""Each SGLang model class's layer rule, asked of the class (extractor/sglang/plugin_root/
hsmon_sglang_plugin/layer_rule.py), and hsmon's named rules (hsmon/contracts/capture_points.py).

One probe per module (about 40 s: it imports every SGLang model module) calls
``set_eagle3_layers_to_capture`` of every class that has it, on an object shaped just enough for
it, in the environment the servers run on (HSMON_SGLANG_VENV; the matrix lane runs this module on
each supported release). Then: every class has a rule hsmon knows, the committed
``hsmon/contracts/sglang_classes.py`` says the same, the ids the plugin chooses for a list of
points are the contract's and capture exactly those points, every probe leaves the model as it
was, and the generated docs table is current.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from extractor.sglang import rule_table
from hsmon.contracts import sglang_classes
from hsmon.contracts.capture_points import layer_ids_for, points_for
from tests.sglang_server import sglang_python

pytestmark = [pytest.mark.sglang]


@pytest.fixture(scope="module")
def probed() -> rule_table.Derived:
    return rule_table.derive(rule_table.run_probe(str(sglang_python())))


def test_every_class_with_the_method_has_a_rule_and_the_contract_has_it(probed: rule_table.Derived) -> None:
    assert len(probed.rules) >= 10, probed.rules  # SGLang's registry was read, not an empty list
    for name, rule in probed.rules.items():
        if rule is None:
            assert name in sglang_classes.NOT_DERIVED, (name, probed.raw["classes"][name])
            continue
        assert sglang_classes.CLASS_RULES.get(name) == rule, (
            f"{name}: SGLang {probed.release} captures by the {rule} rule, the contract says "
            f"{sglang_classes.CLASS_RULES.get(name)}; run python -m extractor.sglang.rule_table")
    # the classes this issue is about, by what the class does, not by name
    assert probed.rules.get("LlamaForCausalLM") == "llama"
    assert probed.rules.get("DeepseekV3ForCausalLM") == "deepseek"
    if "KimiK25ForConditionalGeneration" in probed.rules:
        assert probed.rules["KimiK25ForConditionalGeneration"] == "deepseek"


def test_the_ids_chosen_by_asking_the_class_round_trip(probed: rule_table.Derived) -> None:
    n = probed.num_layers
    checked = 0
    for name, rule in probed.rules.items():
        entry = probed.raw["classes"][name]
        left = entry["left_capturing"]
        assert left == [], f"{name}: a probe left the model capturing {left}"
        if rule is None:
            continue
        for text, chosen in entry["choices"].items():
            points = [int(p) for p in text.split(",")]
            try:
                expected = layer_ids_for(points, rule, n)
            except ValueError:
                expected = None
            assert chosen == expected, (name, points, chosen, expected)
            if chosen is not None:
                assert points_for(chosen, rule, n) == points
                assert entry["probes"].get(",".join(map(str, chosen)), points) == points
            checked += 1
    assert checked >= 40


def test_the_generated_table_and_contract_are_current(probed: rule_table.Derived) -> None:
    # make test (not the matrix lane, which runs this per release), with every release's environment here
    full = not os.environ.get("HSMON_SGLANG_VENV") and len(sglang_classes.RELEASES) > 1
    if full and len(rule_table.default_pythons()) >= len(sglang_classes.RELEASES):
        assert rule_table.main(["--check"]) == 0, "run python -m extractor.sglang.rule_table"
        return
    if (probed.release,) != sglang_classes.RELEASES:
        missing = sorted(n for n, r in probed.rules.items() if r and n not in sglang_classes.CLASS_RULES)
        assert not missing, (f"SGLang {probed.release}'s classes {missing} are missing from the table; run "
                             "python -m extractor.sglang.rule_table with this release's environment too")
        return
    assert rule_table.render_contract([probed]) == rule_table.CONTRACT.read_text()
    docs = rule_table.DOCS.read_text()
    assert rule_table.replace_table(docs, rule_table.render_table([probed])) == docs, (
        "docs/extract.md's layer-rule table is stale: run python -m extractor.sglang.rule_table")


def test_an_exported_drafters_ids_make_the_serving_class_capture_its_points(tmp_path: Path) -> None:
    """export-drafter --serving-class: the ids in config.json, given to SGLang's own class (DeepSeek-V3,
    Kimi-K2.5's wrapper, Llama), capture the points the drafter was trained on (aux ids 2,4,5 =
    points 3,5,6 in training)."""
    import json
    import subprocess

    from extractor.sglang.serve import build_env
    from trainer.export import sglang_config

    drafter = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512, "draft_vocab_size": 64,
               "num_aux": 3, "rms_norm_eps": 1e-6,
               "rope_theta": 1e4, "max_position_embeddings": 1024, "hidden_act": "silu"}
    env = build_env(dict(__import__("os").environ), str(tmp_path), cpu=True)
    # Kimi-K2.5's wrapper: SGLang's own class, its DeepSeek-V3 text model asked through it
    for serving, module in (("DeepseekV3ForCausalLM", "deepseek_v2"),
                            ("KimiK25ForConditionalGeneration", "kimi_k25"), ("LlamaForCausalLM", "llama")):
        config = sglang_config(drafter, [2, 4, 5], serving)
        ids = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        assert config["hsmon_capture"]["capture_points"] == [3, 5, 6]
        assert config["hsmon_capture"]["serving_class"] == serving
        out = subprocess.run([str(sglang_python()), "-m", "hsmon_sglang_plugin.rule_probe", module, serving,
                              ",".join(map(str, ids))], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout.strip().splitlines()[-1]) == [3, 5, 6], (serving, ids)
    for serving in ("DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration"):
        assert sglang_config(drafter, [2, 4, 5], serving)["eagle_config"][
            "eagle_aux_hidden_state_layer_ids"] == [3, 5, 6]
    assert sglang_config(drafter, [2, 4, 5])["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
