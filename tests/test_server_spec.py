"""A speculative server's figures, parsed (hsmon/core/trackers/server_spec.py and the spec series of
server_rules.parse_load): SGLang 0.5.23's own /metrics lines and /server_info fields, the drafter's
recorded estimate, the status section, its wording and its Prometheus families. The real server,
daemon and Prometheus: tests/test_spec_decoding.py."""

from __future__ import annotations

import json

from hsmon.core.trackers.server_rules import parse_load
from hsmon.core.trackers.server_spec import drafter_estimate, spec_info, speculative_of
from hsmon.metrics.engine_metrics import EngineCollector
from hsmon.status.text import SPEC_LOW_FRACTION, spec_low, spec_text
from hsmon.status_doc import Speculative

LABELS = 'engine_type="unified",model_name="/m",moe_ep_rank="0",pp_rank="0",tp_rank="{tp}"'
# as SGLang 0.5.23 writes them (a TP-2 server: each rank repeats the figure)
METRICS = "\n".join([
    "# HELP sglang:spec_accept_length Mean acceptance length of speculative decoding.",
    "# TYPE sglang:spec_accept_length gauge",
    *(f"sglang:spec_accept_length{{{LABELS.format(tp=tp)}}} 1.85" for tp in (0, 1)),
    "# TYPE sglang:spec_accept_rate gauge",
    *(f"sglang:spec_accept_rate{{{LABELS.format(tp=tp)}}} 0.2833" for tp in (0, 1)),
    "# TYPE sglang:spec_verify_calls_total counter",
    *(f"sglang:spec_verify_calls_total{{{LABELS.format(tp=tp)}}} 540.0" for tp in (0, 1)),
    "# TYPE sglang:generation_tokens_total counter",
    *(f'sglang:generation_tokens_total{{{LABELS.format(tp=tp)},is_streaming="false"}} 1080.0'
      for tp in (0, 1)),
    "# TYPE sglang:num_running_reqs gauge",
    f"sglang:num_running_reqs{{{LABELS.format(tp=0)}}} 2.0",
]) + "\n"


def server_info(draft: str | None) -> dict:
    return {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": draft,
            "speculative_num_steps": 3, "speculative_num_draft_tokens": 4, "speculative_eagle_topk": 1,
            "internal_states": [{"avg_spec_accept_length": 1.79, "last_gen_throughput": 6.2}]}


def test_the_spec_series_parse_once_per_replica():
    load = parse_load(METRICS)
    assert load["spec_accept_length"] == 1.85 and load["spec_accept_rate"] == 0.2833
    assert load["spec_verify_calls_total"] == 540.0 and load["running"] == 2.0


def test_a_server_without_a_drafter_has_no_speculative_section(tmp_path):
    assert spec_info(server_info(None)) is None  # a capture server names EAGLE3 without a drafter
    assert speculative_of(None, parse_load(METRICS), (None, None)) is None


def test_the_section_holds_the_engines_figures_and_the_drafters_estimate(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hsmon_estimate": {
        "accept_length": {"1": 1.73, "3": 2.634}, "source": "hsmon train's held-out evaluation"}}))
    info = spec_info(server_info(str(tmp_path)))
    estimate = drafter_estimate(info["draft_model"], info["depth"])
    assert estimate[0] == 2.634 and "hsmon train" in estimate[1]
    spec = speculative_of(info, parse_load(METRICS), estimate)
    assert (spec.algorithm, spec.depth, spec.draft_tokens, spec.topk) == ("EAGLE3", 3, 4, 1)
    assert (spec.accept_length, spec.accept_rate, spec.avg_accept_length) == (1.85, 0.2833, 1.79)
    assert spec.verify_calls_total == 540.0 and spec.generated_tokens_total == 1080.0
    assert spec.estimate == 2.634 and not spec_low(spec)
    # tokens per verify over every finished request (1080 / 540), SGLang's last window beside it
    assert spec_text(spec) == ("EAGLE3 depth 3: 2.00 tokens per verify (recent 1.85, rate 0.28), "
                               "the drafter's estimate 2.63")
    # SGLang's gauges read 0 until its first decode window: no figure, not "0 accepted"
    empty = speculative_of(info, parse_load(METRICS.replace(" 1.85", " 0.0")), estimate)
    assert empty.accept_length is None and empty.accept_rate is None and empty.avg_accept_length == 1.79


def test_an_unreadable_or_silent_drafter_gives_no_estimate_and_says_why(tmp_path):
    value, why = drafter_estimate(str(tmp_path / "elsewhere"), 3)
    assert value is None and "not readable here" in why
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    value, why = drafter_estimate(str(tmp_path), 3)
    assert value is None and "records no estimate at depth 3" in why


def test_below_the_fraction_of_the_estimate_reads_low_and_is_exported():
    low = Speculative(algorithm="EAGLE3", depth=3, accept_length=1.04, estimate=2.634)
    assert SPEC_LOW_FRACTION * 2.634 > 1.04 and spec_low(low)
    assert spec_text(low).endswith("the drafter's estimate 2.63 (below 50% of it)")
    # without the /metrics gauge the average since start stands in; without an estimate, never low
    assert spec_low(Speculative(avg_accept_length=1.0, estimate=3.0))
    assert not spec_low(Speculative(accept_length=1.0))

    class Srv:
        url, speculative = "http://s:1", low

    class Job:
        job, servers = "serve", [Srv()]

    collector = EngineCollector([Job()], None)  # the GPU families are not read here
    samples = {s.name: s.value for fam in collector._speculative() for s in fam.samples}
    assert "hsmon_server_spec_generated_tokens_total" not in samples  # unknown: no sample, never a guess
    assert samples["hsmon_server_spec_accept_length"] == 1.04
    assert samples["hsmon_server_spec_accept_length_estimate"] == 2.634
    assert samples["hsmon_server_spec_depth"] == 3 and "hsmon_server_spec_accept_rate" not in samples
