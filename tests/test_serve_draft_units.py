"""`hsmon sglang-serve --draft`'s flags (extractor/sglang/speculative.py), without a server: the
speculative defaults, SGLang's own flags after -- kept, the CPU attention flags, the shared dtype,
and the launch line (the real servers: tests/test_spec_decoding.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from extractor.sglang.serve import build_command
from extractor.sglang.speculative import DraftError, plan, shared_dtype

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "hsmon" / "demo" / "reference-drafter"
EMBEDDED = ROOT / "extractor" / "embedded"


def flags(args: tuple[str, ...]) -> dict[str, str]:
    return dict(zip(args[::2], args[1::2], strict=True))


def test_draft_gives_a_chain_of_draft_tokens_and_the_cpu_attention_backends():
    got = flags(plan(str(REFERENCE), 5, True, [], EMBEDDED).args)
    assert got["--speculative-draft-model-path"] == str(REFERENCE.resolve())
    assert (got["--speculative-algorithm"], got["--speculative-eagle-topk"]) == ("EAGLE3", "1")
    assert (got["--speculative-num-steps"], got["--speculative-num-draft-tokens"]) == ("4", "5")
    assert got["--prefill-attention-backend"] == got["--decode-attention-backend"] == "intel_amx"
    assert "--prefill-attention-backend" not in plan(str(REFERENCE), 5, False, [], EMBEDDED).args  # a GPU


def test_sglangs_own_flags_are_kept_and_no_drafter_means_no_speculation():
    extra = ["--speculative-draft-model-path", "/d", "--speculative-num-steps", "2", "--dtype", "float32"]
    got = plan(None, 4, True, extra, EMBEDDED)
    assert got.active and "--speculative-num-steps" not in got.args and "--dtype" not in got.args
    assert not plan(None, 4, True, ["--dtype", "float32"], EMBEDDED).active


def test_the_launch_line_has_no_capture_flags_when_it_drafts():
    spec = plan(str(REFERENCE), 4, True, ["--dtype", "float32"], EMBEDDED)
    cmd = build_command("py", str(EMBEDDED), [2, 4, 5], "127.0.0.1", 1, True, ["--dtype", "float32"],
                        speculative=spec)
    assert "--enable-return-aux-hidden-states" not in cmd and "--enable-return-hidden-states" not in cmd
    assert cmd.count("--speculative-algorithm") == 1 and "--speculative-draft-model-path" in cmd
    capture = build_command("py", str(EMBEDDED), [2, 4, 5], "127.0.0.1", 1, True, [])
    assert "--enable-return-aux-hidden-states" in capture and "--speculative-draft-model-path" not in capture


def test_a_float32_target_beside_a_bfloat16_export_runs_both_in_what_auto_gives_the_target(tmp_path):
    # SGLang's "auto" runs a float32 config in float16 and a bfloat16 one as is: the drafter would
    # get float16 features for bfloat16 weights (a dtype error in its first matmul)
    assert shared_dtype(EMBEDDED, REFERENCE) == "float16"
    assert flags(plan(str(REFERENCE), 4, True, [], EMBEDDED).args)["--dtype"] == "float16"
    same = tmp_path / "target"
    same.mkdir()
    (same / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16", "model_type": "llama"}))
    assert shared_dtype(same, REFERENCE) is None


@pytest.mark.parametrize("args,words", [
    ((str(REFERENCE), 1, ["--dtype", "float32"]), "--draft-tokens 1: at least 2"),
    ((str(REFERENCE), 4, ["--speculative-draft-model-path", "/x"]), "both name a drafter"),
    ((None, 4, ["--speculative-draft-model-path", "/x", "--return-aux-hidden-state-layer-ids", "1"]),
     "for capture servers"),
])
def test_bad_flags_are_one_line(args, words):
    with pytest.raises(DraftError, match=words):
        plan(args[0], args[1], True, args[2], EMBEDDED)
