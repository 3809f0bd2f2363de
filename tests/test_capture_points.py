"""Capture points and SGLang layer ids: one convention (hsmon/contracts/capture_points.py) for every part."""

from __future__ import annotations

import pytest

from hsmon.contracts.capture_points import (
    capture_points_of,
    default_capture_points,
    layer_ids_for,
    parse_capture_points,
    points_for,
    rule_of,
    sglang_layer_ids,
)


def test_capture_point_p_is_sglang_layer_id_p_minus_1_both_ways() -> None:
    assert sglang_layer_ids([2, 4, 5]) == [1, 3, 4]
    assert capture_points_of(sglang_layer_ids([2, 30, 58])) == [2, 30, 58]


def test_the_default_is_eagle3s_and_is_checked_like_a_given_value() -> None:
    assert default_capture_points(61) == [2, 30, 58]
    assert parse_capture_points(None, 8) == [2, 4, 5]
    with pytest.raises(ValueError, match=r"--layers \(default \[2, 2, 1\]\): capture points must be"):
        parse_capture_points(None, 4)  # a 4-layer model's default repeats a point


@pytest.mark.parametrize(
    ("text", "why"),
    [("2,8", "lie in 1..7 for this 8-layer model"), ("0,3", "lie in 1..7"), ("3,3", "distinct"),
     ("2,x", "give comma-separated integers"), (",", "capture points must be")],
)
def test_a_bad_value_is_one_line_naming_it_and_the_range(text: str, why: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_capture_points(text, 8)
    message = str(caught.value)
    assert message.startswith(f"--layers {text!r}: ") and why in message and "\n" not in message


def test_each_named_rule_turns_points_into_the_ids_its_classes_need() -> None:
    assert layer_ids_for([2, 30, 58], "llama", 61) == [1, 29, 57]
    assert layer_ids_for([3, 5, 6], "llama", 8) == [2, 4, 5]
    # DeepSeek's rule: ids used as they are unless the first is 1
    assert layer_ids_for([2, 30, 58], "deepseek", 61) == [1, 29, 57]
    assert layer_ids_for([3, 5, 6], "deepseek", 8) == [3, 5, 6]
    assert points_for([2, 30, 58], "deepseek", 61) == [2, 30, 58]
    assert points_for([2, 30, 58], "llama", 61) == [3, 31, 59]
    with pytest.raises(ValueError, match=r"capture points \[1, 4, 5\]: no layer ids .* deepseek rule"):
        layer_ids_for([1, 4, 5], "deepseek", 8)
    assert layer_ids_for([2, 4, 7], "gpt-oss", 8) == [1, 3, 6]
    assert points_for([1, 4, 8], "gpt-oss", 8) == [1, 4, 8]


def test_a_serving_class_names_its_rule_and_an_unknown_name_is_one_line() -> None:
    assert rule_of("DeepseekV3ForCausalLM") == "deepseek"
    assert rule_of("KimiK25ForConditionalGeneration") == "deepseek"
    assert rule_of("Qwen3MoeForCausalLM") == "llama"
    assert rule_of("gpt-oss") == "gpt-oss"
    with pytest.raises(ValueError) as caught:
        rule_of("NoSuchForCausalLM")
    assert "'NoSuchForCausalLM' is neither" in str(caught.value) and "\n" not in str(caught.value)
