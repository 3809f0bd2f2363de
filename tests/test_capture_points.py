"""Capture points and SGLang layer ids: one convention (hsmon/contracts/capture_points.py) for every part."""

from __future__ import annotations

import pytest

from hsmon.contracts.capture_points import (
    capture_points_of,
    default_capture_points,
    parse_capture_points,
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
