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


def test_the_served_drafter_watch_and_its_alert_read_vllms_figures(speculative, tmp_path):
    """A real daemon and a real Prometheus with the committed rules watch the good drafter's vLLM server
    and a degraded one's (the same export, its weights scrambled): vLLM's counters reach the speculative
    sections, `hsmon status` and /metrics, and HsmonServedAcceptanceLow's condition holds for the
    degraded drafter only."""

    import yaml
    from daemon_helpers import Daemon, Procs, child_env, wait_until
    from prometheus_helpers import Prometheus
    from spec_servers import drafter_estimate, scrambled_copy

    from hsmon.status.text import SPEC_LOW_FRACTION

    good, draft, work = speculative
    bad_draft = scrambled_copy(export_for("vllm", tmp_path / "for-vllm"), tmp_path / "degraded")
    bad = VLLMServer(TARGET, work, serve_args=("--draft", str(bad_draft), "--draft-tokens", "4")).start()
    procs = Procs()
    try:
        rule = next(
            r
            for g in yaml.safe_load((ROOT / "dashboards/prometheus/hsmon-alerts.yml").read_text())["groups"]
            for r in g["rules"]
            if r.get("alert") == "HsmonServedAcceptanceLow"
        )
        args = [
            "--job",
            "serve",
            "--server",
            good.url,
            "--server",
            bad.url,
            "--server-interval",
            "1",
            "--health-interval",
            "2",
        ]
        daemon = Daemon(procs, tmp_path, args, env=child_env())
        prom = Prometheus(procs, tmp_path, [daemon.url.removeprefix("http://")])
        wait_until(
            lambda: len(_query(prom, "hsmon_server_spec_depth") or []) == 2,
            90,
            0.5,
            what="Prometheus scraping both servers' speculative figures",
        )
        for server, count in ((good, 8), (bad, 3)):
            for ids in _prompts(count):
                _complete(server.url, ids)
        estimate = drafter_estimate(draft, 3)
        low = SPEC_LOW_FRACTION * estimate

        _figures_reach_the_status(daemon, good.url, bad.url, estimate, low)

        def pending_for_bad_only() -> list | None:
            alerts = prom.alerts("HsmonServedAcceptanceLow")
            return alerts if [a["labels"]["server"] for a in alerts] == [bad.url] else None

        alerts = wait_until(pending_for_bad_only, 90, 0.5, what="the alert pending for the degraded drafter")
        assert alerts[0]["state"] == "pending"
        ratio = {
            r["metric"]["server"]: float(r["value"][1])
            for r in _query(prom, rule["expr"].split("<")[0]) or []
        }
        assert ratio[good.url] > low > ratio[bad.url], ratio
    finally:
        procs.close()
        bad.stop()


def _figures_reach_the_status(daemon, good: str, bad: str, estimate: float, low: float) -> None:
    """vLLM's counters in both servers' speculative sections, `hsmon status` and the daemon's /metrics."""
    import urllib.request

    from daemon_helpers import child_env, wait_until

    def specs() -> dict | None:
        found = {s["url"]: s.get("speculative") for s in daemon.job("serve").get("servers") or []}
        ready = all(v and v.get("verify_calls_total") and v.get("estimate") for v in found.values())
        return found if len(found) == 2 and ready else None

    found = wait_until(specs, 60, 0.5, what="both servers' speculative figures")
    for spec in found.values():
        assert spec["algorithm"] == "EAGLE3" and spec["depth"] == 3 and spec["estimate"] == estimate
        assert spec["generated_tokens_total"] > 0 and spec["avg_accept_length"] >= 1
    served = {u: s["generated_tokens_total"] / s["verify_calls_total"] for u, s in found.items()}
    assert served[good] > low > served[bad], (served, low)
    status = subprocess.run(
        [sys.executable, "-m", "hsmon", "status", "--url", daemon.url],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    ).stdout
    lines = {u: next(x for x in status.splitlines() if u in x) for u in (good, bad)}
    assert "tokens per verify" in lines[good] and "below 50% of it" not in lines[good], status
    assert "below 50% of it" in lines[bad], status
    text = urllib.request.urlopen(daemon.url + "/metrics", timeout=10).read().decode()
    assert f'hsmon_server_spec_verify_calls_total{{job="serve",server="{bad}"}}' in text


def _query(prom, expr: str) -> list | None:
    try:
        return prom.query(expr) or None
    except OSError:  # Prometheus still starting
        return None


def _prompts(count: int) -> list[list[int]]:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_spec_decoding import held_out_prompts

    return held_out_prompts(count)


def _complete(url: str, ids: list[int]) -> None:
    import urllib.request

    body = json.dumps(
        {"model": str(TARGET), "prompt": ids, "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    )
    request = urllib.request.Request(
        url + "/v1/completions", data=body.encode(), headers={"Content-Type": "application/json"}
    )
    urllib.request.urlopen(request, timeout=300).read()


def test_vllms_layer_rules_are_derived_from_its_own_code():
    """The vLLM contract (hsmon/contracts/vllm_classes.py, and the docs table rendered from it) is what
    vLLM's code in .vllm-venv says today: `python -m extractor.vllm.rule_table --check`."""
    done = subprocess.run(
        [sys.executable, "-m", "extractor.vllm.rule_table", "--check", "--python", str(vllm_python())],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
