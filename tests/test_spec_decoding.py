"""Speculative decoding in a real SGLang server on CPU with hsmon-exported drafters
(`hsmon sglang-serve --draft`; SGLang's EAGLE worker on hsmon's sgl-kernel stand-in, a test
device): lossless against the same target without it, token for token, for an EAGLE 3 and an
EAGLE 3.1 export; `hsmon eval-drafter --engine sglang` prints SGLang's own spec_accept_length
beside hsmon's evaluator (the shipped reference drafter above 1.5 at 4 draft tokens on held-out
prompts); bad flags of `--draft` are one-line refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from sglang_server import EMBEDDED_MODEL, SGLangServer, sglang_python
from spec_servers import (
    DRAFT_TOKENS,
    EAGLE31_DRAFTER,
    REFERENCE_DRAFTER,
    ServerPool,
    drafter_estimate,
    greedy_ids,
    scrambled_copy,
    spec_server,
)

ROOT = Path(__file__).resolve().parents[1]
NEW_TOKENS = 48
ALERT = "HsmonServedAcceptanceLow"
pytestmark = pytest.mark.sglang


def held_out_prompts(count: int = 8) -> list[list[int]]:
    """Snippets of the standard-library files neither the target nor the drafters were trained on
    (bench/_acceptance_data.py's held-out split), as the embedded target's token ids."""
    from transformers import AutoTokenizer

    sys.path.insert(0, str(ROOT))
    from bench._acceptance_data import snippets, stdlib_files

    tokenizer = AutoTokenizer.from_pretrained(EMBEDDED_MODEL)
    _, held = stdlib_files()
    return [tokenizer(text)["input_ids"][-96:] for text in snippets(held, count, 400, seed=7)]


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Iterator[ServerPool]:
    sglang_python()
    work = tmp_path_factory.mktemp("spec")
    pool = ServerPool({
        "plain": lambda: SGLangServer(EMBEDDED_MODEL, work),  # a capture server: decodes without drafting
        "eagle3": lambda: spec_server(work, REFERENCE_DRAFTER),
        "eagle3.1": lambda: spec_server(work, EAGLE31_DRAFTER),
        "degraded": lambda: spec_server(work, scrambled_copy(REFERENCE_DRAFTER, work / "degraded")),
    })
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return held_out_prompts()


@pytest.fixture(scope="module")
def plain_outputs(pool, prompts) -> list[list[int]]:
    """The target's greedy continuations without speculative decoding (a capture server decodes
    plainly), read once; that server is stopped before the speculative ones need the cores."""
    plain, _ = pool.start_together("plain", "eagle3")  # the reference's server starts alongside
    outputs = []
    for ids in prompts:
        got, meta = greedy_ids(plain, ids, NEW_TOKENS)
        assert "spec_accept_length" not in meta and len(got) == NEW_TOKENS
        outputs.append(got)
    pool.release("plain")
    return outputs


def assert_lossless(server: SGLangServer, prompts: list[list[int]], want: list[list[int]]) -> int:
    """Every prompt's speculative greedy output equals ``want``'s; returns the drafts accepted."""
    accepted = 0
    for ids, expected in zip(prompts, want, strict=True):
        got, meta = greedy_ids(server, ids, NEW_TOKENS)
        assert got == expected, f"{server.serve_args}: speculative output differs from plain greedy"
        accepted += meta["spec_num_correct_drafts"]
    return accepted


def test_eagle3_export_decodes_losslessly(pool, prompts, plain_outputs):
    server = pool.get("eagle3")
    info = server.server_info()
    assert info["speculative_algorithm"] == "EAGLE3" and info["speculative_eagle_topk"] == 1
    assert info["speculative_num_draft_tokens"] == DRAFT_TOKENS
    assert info["speculative_num_steps"] == DRAFT_TOKENS - 1
    assert info["decode_attention_backend"] == "intel_amx" and not info["enable_return_aux_hidden_states"]
    # drafts were accepted: the verify path that keeps them is exercised, not only rejections
    assert assert_lossless(server, prompts, plain_outputs) > len(prompts) * 5


def eval_drafter(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "hsmon", "eval-drafter", *args], capture_output=True,
                          text=True, env=env, timeout=600)


def test_eval_drafter_engine_sglang_reports_the_engines_acceptance_beside_the_evaluators(
        pool, prompts, tmp_path):
    server = pool.get("eagle3")
    prompt_file = tmp_path / "held-out.jsonl"
    prompt_file.write_text("".join(json.dumps({"input_ids": p}) + "\n" for p in prompts))
    proc = eval_drafter("--engine", "sglang", "--server", server.url, "--drafter", str(REFERENCE_DRAFTER),
                        "--prompts", str(prompt_file), "--max-new-tokens", str(NEW_TOKENS), "--threads", "1",
                        "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])["sets"]["held-out"]
    assert result["depth"] == DRAFT_TOKENS - 1 and result["prompts"] == len(prompts)
    assert result["spec_accept_length"] > 1.5, result  # SGLang's own figure, as it reports it
    assert len(result["per_prompt"]) == len(prompts)
    assert result["spec_accept_length_max"] > result["spec_accept_length_min"]
    assert result["outputs_match_greedy"] is True  # the engine's tokens are hsmon's evaluator's greedy tokens
    # the engine, counted as the evaluator counts, agrees with it: no finding
    assert result["finding"] is None and abs(result["engine_per_verify"] - result["evaluator"]) < 0.05, result
    assert result["ngram"] >= 1.0


def served(spec: dict) -> float:
    """Tokens per verify over every request the server finished (what `hsmon status` shows)."""
    return spec["generated_tokens_total"] / spec["verify_calls_total"]


def test_the_daemon_shows_the_served_acceptance_and_the_alert_holds_only_for_the_degraded_drafter(
        pool, prompts, tmp_path):
    """A real daemon watches the good and the degraded drafter's servers (a job naming both), a real
    Prometheus scrapes it with the committed rules: the served figures and the drafter's estimate
    reach the status document, `hsmon status` and /metrics; traffic sent while Prometheus watches
    puts HsmonServedAcceptanceLow's condition on the degraded one only (pending: the 15 minutes it
    must hold are promtool-tested)."""
    import yaml
    from daemon_helpers import Daemon, Procs, child_env, wait_until
    from prometheus_helpers import Prometheus

    from hsmon.status.text import SPEC_LOW_FRACTION

    good, bad = pool.get("eagle3"), pool.get("degraded")
    rules = yaml.safe_load((ROOT / "dashboards" / "prometheus" / "hsmon-alerts.yml").read_text())
    rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == ALERT)
    assert f"< {SPEC_LOW_FRACTION} * hsmon_server_spec_accept_length_estimate" in rule["expr"]
    greedy_ids(bad, prompts[0], NEW_TOKENS)  # the good one has served the tests above
    events = tmp_path / "events.jsonl"
    start = {"v": 1, "ts": time.time(), "job": "serve", "kind": "start", "pid": os.getpid(),
             "backend": "sglang", "urls": [good.url, bad.url]}
    events.write_text(json.dumps(start) + "\n")
    procs = Procs()
    try:
        args = ["--job", "serve", "--events", str(events), "--server-interval", "1", "--health-interval", "2"]
        daemon = Daemon(procs, tmp_path, args, env=child_env())
        prom = Prometheus(procs, tmp_path, [daemon.url.removeprefix("http://")])  # starts meanwhile

        def specs() -> dict | None:
            found = {s["url"]: s.get("speculative") for s in daemon.job("serve").get("servers") or []}
            ready = all(v and v.get("verify_calls_total") and v.get("estimate") for v in found.values())
            return found if len(found) == 2 and ready else None

        found = wait_until(specs, 60, 0.5, what="both servers' speculative figures")
        estimate = drafter_estimate(REFERENCE_DRAFTER, DRAFT_TOKENS - 1)
        for spec in found.values():
            assert spec["depth"] == DRAFT_TOKENS - 1 and spec["algorithm"] == "EAGLE3" and spec["topk"] == 1
            assert spec["estimate"] == pytest.approx(estimate) and spec["generated_tokens_total"] > 0
        low = SPEC_LOW_FRACTION * estimate
        assert served(found[good.url]) > low > served(found[bad.url]), found
        status = subprocess.run([sys.executable, "-m", "hsmon", "status", "--url", daemon.url],
                                capture_output=True, text=True, env=child_env(), timeout=60).stdout
        lines = {url: next(x for x in status.splitlines() if url in x) for url in (good.url, bad.url)}
        assert "tokens per verify" in lines[good.url] and "below 50% of it" not in lines[good.url], status
        assert "below 50% of it" in lines[bad.url], status
        line = f'hsmon_server_spec_accept_length_estimate{{job="serve",server="{bad.url}"}} {estimate}'

        def scraped() -> str | None:  # the engine families are rendered by the tick after the read
            text = urllib.request.urlopen(daemon.url + "/metrics", timeout=10).read().decode()
            return text if line in text else None

        text = wait_until(scraped, 10, 0.2, what="the estimate in /metrics")
        assert f'hsmon_server_spec_generated_tokens_total{{job="serve",server="{good.url}"}}' in text

        alert_pending_for_the_degraded_only(prom, rule["expr"], good, bad, prompts, low)
    finally:
        procs.close()


def alert_pending_for_the_degraded_only(prom, expr: str, good: SGLangServer, bad: SGLangServer,
                                        prompts: list[list[int]], low: float) -> None:
    """Traffic on both servers while Prometheus watches: HsmonServedAcceptanceLow pending for the
    degraded drafter's server only, the rule's own ratio on the two sides of ``low``."""
    from daemon_helpers import wait_until

    def query(q: str) -> list | None:
        try:
            return prom.query(q) or None
        except OSError:  # Prometheus still starting
            return None

    # both servers' counters scraped once before the traffic, so that increase() sees it
    wait_until(lambda: len(query("hsmon_server_spec_verify_calls_total") or []) == 2, 60, 0.5,
               what="Prometheus scraping both servers")
    for ids in prompts:  # the held-out set on the good one (1.8 a verify), a few on the bad one
        greedy_ids(good, ids, NEW_TOKENS)
    for ids in prompts[:2]:
        greedy_ids(bad, ids, NEW_TOKENS)

    def pending_for_bad_only() -> list | None:
        # (one prompt the good drafter does badly on can make it pending for a moment, until the
        # next requests finish: the rule's 15 minutes are what keep that from paging)
        alerts = prom.alerts(ALERT)
        return alerts if [a["labels"]["server"] for a in alerts] == [bad.url] else None

    alerts = wait_until(pending_for_bad_only, 60, 0.5, what="the alert pending for the degraded drafter")
    assert alerts[0]["state"] == "pending"
    ratio = query(expr.split("<")[0])  # the figure the rule compares, per server
    by_server = {r["metric"]["server"]: float(r["value"][1]) for r in ratio or []}
    assert by_server[good.url] > low > by_server[bad.url], by_server


def test_eval_drafter_engine_sglang_reports_a_disagreement_as_a_finding(pool, prompts, tmp_path):
    """The degraded drafter served, the good one evaluated: the engine accepts far less than the
    evaluator predicts, and the report says so and what to check."""
    server = pool.get("degraded")
    prompt_file = tmp_path / "held-out.jsonl"
    prompt_file.write_text("".join(json.dumps({"input_ids": p}) + "\n" for p in prompts[:3]))
    proc = eval_drafter("--engine", "sglang", "--server", server.url, "--drafter", str(REFERENCE_DRAFTER),
                        "--prompts", str(prompt_file), "--max-new-tokens", "24", "--threads", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "finding: held-out: the engine accepts" in proc.stdout, proc.stdout
    assert "eagle_aux_hidden_state_layer_ids" in proc.stdout and "d2t/t2d" in proc.stdout


def test_eagle31_export_decodes_losslessly(pool, prompts, plain_outputs):
    pool.release("eagle3", "degraded")
    assert json.loads((EAGLE31_DRAFTER / "config.json").read_text())["fc_norm"] is True  # an EAGLE 3.1 export
    assert assert_lossless(pool.get("eagle3.1"), prompts, plain_outputs) > len(prompts) * 3


def test_draft_flag_refusals_are_one_line(tmp_path):
    not_a_drafter = tmp_path / "nope"
    not_a_drafter.mkdir()
    (not_a_drafter / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "hsmon", "sglang-serve", "--model-path", "embedded", "--device", "cpu",
            "--python", str(sglang_python())]
    cases = [
        (["--draft", str(not_a_drafter)], "not an EAGLE-3 drafter"),
        (["--draft", str(tmp_path / "missing")], "cannot read config.json"),
        (["--draft", str(REFERENCE_DRAFTER), "--draft-tokens", "1"], "--draft-tokens 1: at least 2"),
        (["--draft", str(REFERENCE_DRAFTER), "--", "--speculative-draft-model-path", "x"],
         "both name a drafter"),
    ]
    for args, words in cases:
        proc = subprocess.run([*base, *args], capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 2 and words in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
