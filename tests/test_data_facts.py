"""The daemon watches the data itself: NaN/Inf rows and drifting statistics, on real extractions of
the embedded target (a corrupted and a scaled copy of it made by tests/nonfinite_helpers.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from daemon_helpers import free_port, wait_until
from extract_helpers import hsmon_status, make_dataset, run_extract
from nonfinite_helpers import nan_embedding_target, scaled_embedding_target, token_rows
from prometheus_client.parser import text_string_to_metric_families

from hsmon.contracts.data_facts import DataFacts
from hsmon.contracts.layout import MANIFEST_NAME, iter_jsonl
from hsmon.core.config import JobConfig
from hsmon.core.monitor import Monitor
from hsmon.core.verify_watch import VerifySpec
from hsmon.daemon.notify import Notifier
from hsmon.metrics.exporter import MetricsEndpoint

CHUNK = ["--chunk-size", "3"]


def status(out: Path) -> dict:
    _, job = hsmon_status("--out", str(out), "--sample", "0.2")
    return job


def hints(job: dict, hint_id: str) -> list[dict]:
    return [h for h in job["hints"] if h["id"] == hint_id]


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> tuple[Path, Path]:
    """(dataset, output): 60 mixed rows extracted with the embedded target in 20 chunks of 3."""
    base = tmp_path_factory.mktemp("clean")
    dataset = make_dataset(base / "rows.jsonl", 60, seed=3)
    out = base / "out"
    proc = run_extract(dataset, out, _embedded(), *CHUNK)
    assert proc.returncode == 0, proc.stderr
    return dataset, out


def _embedded() -> Path:
    from extractor.embedded_target import ensure_embedded_target

    return ensure_embedded_target()


def test_clean_run_of_20_chunks_has_no_data_warning(clean):
    job = status(clean[1])
    data = job["output"]["data"]
    assert data["rows"] == 60 and data["nonfinite_rows"] == 0 and data["drifted_chunks"] == 0
    assert set(data["layers"]) == {"final", "2", "4", "5"}
    assert data["newest_chunk"] == "rows_57-60"
    assert data["reference_chunks"] == ["rows_0-3", "rows_3-6", "rows_6-9"]
    final = data["layers"]["final"]
    assert 5 < final["mean_l2"] < 30 and final["std"] > 0 and final["max_abs"] > 0
    assert final["chunk"]["mean_l2"] > 0
    assert not hints(job, "data-drift") and not hints(job, "data-nonfinite")


def test_chunks_from_another_checkpoint_drift_on_the_right_chunk(clean, tmp_path):
    """Rows 0-8 from the embedded target, rows 9-14 from a copy with a scaled embedding."""
    dataset, clean_out = clean
    head = tmp_path / "rows15.jsonl"
    head.write_text("".join(dataset.read_text().splitlines(keepends=True)[:15]))
    other = tmp_path / "other"
    proc = run_extract(head, other, scaled_embedding_target(tmp_path / "scaled"), *CHUNK)
    assert proc.returncode == 0, proc.stderr
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    records = []
    for source, keep in ((clean_out, lambda row: row < 9), (other, lambda row: row >= 9)):
        for rec in iter_jsonl(source / MANIFEST_NAME):
            first = int(rec["chunk"].split("_")[1].split("-")[0]) if "chunk" in rec else None
            if (rec["type"] == "run" and source == clean_out) or (first is not None and keep(first)):
                records.append(rec)
                if rec["type"] == "chunk":
                    (mixed / rec["chunk"]).symlink_to(source / rec["chunk"])
    (mixed / MANIFEST_NAME).write_text("".join(json.dumps(r) + "\n" for r in records))
    job = status(mixed)
    (drift,) = hints(job, "data-drift")
    assert drift["severity"] == "warning"
    assert drift["message"].startswith("data drift at rows 12-15, layer 2: mean L2 norm per token")
    data = job["output"]["data"]
    assert data["drifted_chunks"] == 2
    assert {d["chunk"] for d in data["drifts"]} == {"rows_9-12", "rows_12-15"}
    assert "final" not in {d["layer"] for d in data["drifts"]}  # the final norm hides the scale
    assert job["state"] != "stalled" and not [h for h in job["hints"] if h["severity"] == "critical"]


def test_nan_rows_are_named_with_their_layers(tmp_path):
    dataset = token_rows(tmp_path / "rows.jsonl", 12, {3, 9})
    out = tmp_path / "out"
    proc = run_extract(dataset, out, nan_embedding_target(tmp_path / "nan"), "--chunk-size", "4")
    assert proc.returncode == 0, proc.stderr
    job = status(out)
    (hint,) = hints(job, "data-nonfinite")
    assert hint["severity"] == "warning"
    assert hint["message"].startswith(
        "2 rows of the output hold NaN/Inf hidden states (rows 3, 9; layer final: 2 rows")
    for layer in ("2", "4", "5"):
        assert f"layer {layer}: 2 rows" in hint["message"]
    data = job["output"]["data"]
    assert data["first_nonfinite_rows"] == [3, 9] and data["layers"]["2"]["nonfinite_rows"] == 2
    text = metrics_text(out, tmp_path)
    samples = {(s.name, s.labels.get("layer")): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert samples[("hsmon_output_nonfinite_rows", None)] == 2
    assert samples[("hsmon_output_layer_nonfinite_rows", "final")] == 2
    assert samples[("hsmon_output_layer_nonfinite_values", "2")] > 0
    assert samples[("hsmon_output_layer_mean_l2_norm", "final")] > 0
    assert ("hsmon_output_layer_chunk_drift_ratio", "5") in samples


def metrics_text(out: Path, tmp_path: Path) -> str:
    """The daemon's /metrics text for a job watching ``out`` (in-process), promtool-checked."""
    monitor = Monitor([JobConfig(name="nan", out_dir=str(out))], use_watchdog=False)
    monitor.tick(force_scan=True)
    text = MetricsEndpoint(monitor, Notifier("http://127.0.0.1:9/")).render().decode()
    if shutil.which("promtool"):
        res = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                             timeout=30)
        assert res.returncode == 0, res.stdout + res.stderr
    return text


def test_facts_keep_running_totals_only():
    """A million row records leave the accumulator the same size (no per-row state)."""
    facts = DataFacts()
    row = {"type": "row", "row": 0, "stats": {"final": [10, 120.0, 1280, 0.0, 1280.0, 4.0, 0]}}
    for i in range(2000):
        facts.add({**row, "row": i})
    size = len(json.dumps(facts.snapshot()))
    facts.add({**row, "row": 5, "stats": {"final": [10, 120.0, 1270, 0.0, 1270.0, 4.0, 10]}})
    for i in range(2000, 20000):
        facts.add({**row, "row": i})
    assert len(json.dumps(facts.snapshot())) <= size + 40
    assert facts.first_nonfinite_rows == [5] and facts.layers["final"].figures()["mean_l2"] == 12.0


def _chunks_of_rows(lengths: list[int], scale_from: int | None = None, per_chunk: int = 3) -> list[dict]:
    """Manifest records the writer's own code makes (row_stats, finish_stats) for rows whose position 0
    has ~160x the others' norm, as SmolLM2's hidden states have; rows from ``scale_from`` on scaled 1.5x."""
    import torch

    from extractor.row_stats import finish_stats, row_stats

    gen = torch.Generator().manual_seed(0)
    records, pending = [], []
    for row, seq in enumerate(lengths):
        hidden = torch.randn(seq, 64, generator=gen)
        hidden[0] *= 160.0
        if scale_from is not None and row >= scale_from:
            hidden *= 1.5
        stats = row_stats(hidden, hidden.repeat(1, 2), [2, 4])
        records.append({"type": "row", "row": row, "stats": stats})
        pending.append(stats)
        if len(pending) == per_chunk:
            name = f"rows_{row + 1 - per_chunk}-{row + 1}"
            records.append({"type": "chunk", "chunk": name,
                            "stats": {k: finish_stats([p[k] for p in pending]) for k in pending[0]}})
            pending = []
    return records


def test_drift_is_judged_after_the_first_position_so_a_changing_length_mix_is_not_drift():
    """A dataset whose rows are long at the start of the file and short later: the plain mean L2
    norm of a chunk moves by far more than the tolerance (more position-0 share), the drift figure
    (positions after the first) does not; a real scale change still drifts; an older manifest's rows
    (7 sums, no mean_l2_rest) are judged on the plain figures, as before."""
    lengths = [64] * 9 + [4] * 9  # 3 chunks of long rows (the reference), then 3 of short ones
    facts = DataFacts()
    records = _chunks_of_rows(lengths)
    for record in records:
        facts.add(record)
    chunks = [r for r in records if r["type"] == "chunk"]
    plain = chunks[-1]["stats"]["final"]["mean_l2"] / chunks[0]["stats"]["final"]["mean_l2"]
    assert plain > 3  # what the old figure would have judged: a 200+ % "drift"
    assert facts.drifted_chunks == 0 and facts.drifts == []
    ref = facts.reference_of("final")
    assert ref is not None and 7 < ref["mean_l2_rest"] < 9  # sqrt(64) per token, position 0 left out

    scaled = DataFacts()
    for record in _chunks_of_rows(lengths, scale_from=12):
        scaled.add(record)
    assert scaled.drifted_chunks == 2 and {d.figure for d in scaled.drifts} == {"mean_l2_rest"}
    assert {d.chunk for d in scaled.drifts} == {"rows_12-15", "rows_15-18"}

    old = DataFacts()
    for record in records:
        if record["type"] == "row":
            record = {**record, "stats": {k: v[:7] for k, v in record["stats"].items()}}
        else:
            record = {**record, "stats": {k: {f: x for f, x in v.items() if f != "mean_l2_rest"}
                                          for k, v in record["stats"].items()}}
        old.add(record)
    assert old.drifted_chunks == 3 and "mean_l2" in {d.figure for d in old.drifts}


def test_engine_check_hf_agrees_and_a_failed_or_slow_check_only_warns(clean):
    """`--verify-every 5 --verify-against hf` on the clean 20-chunk run: one real check of 2 rows of
    the newest chunk agrees; a check against a port nobody listens on is an error, one with a budget
    of 0.3 s (verify-data cannot even import torch in that time) a timeout: warnings, never critical."""
    out = str(clean[1])
    specs = {"hf": VerifySpec(5, "hf", sample=2), "slow": VerifySpec(5, "hf", sample=2, budget=0.3),
             "nobody": VerifySpec(5, f"http://127.0.0.1:{free_port()}", sample=2)}
    monitor = Monitor([JobConfig(name=n, out_dir=out, verify=v) for n, v in specs.items()],
                      use_watchdog=False)

    def verdicts() -> dict[str, dict] | None:
        monitor.tick(force_scan=True)
        jobs = {j["job"]: j for j in monitor.status_document()["jobs"]}
        done = all(j["output"]["data"]["verify"]["verdict"] not in (None, "running") for j in jobs.values())
        return jobs if done else None

    try:
        jobs = wait_until(verdicts, 300, interval=0.5, what="three engine checks")
        text = MetricsEndpoint(monitor).render().decode()
    finally:
        monitor.stop()
    v = jobs["hf"]["output"]["data"]["verify"]
    assert v["verdict"] == "agree" and v["chunk"] == "rows_57-60" and v["rows_checked"] == 2
    assert v["worst_cosine"] > 0.9999 and v["max_abs_diff"] < 1e-3 and v["reason"] is None
    assert v["against"] == f"hf:{_embedded()}" and v["checks_total"] == 1 and v["running_chunk"] is None
    assert v["checked_ts"] > 0 and v["seconds"] > 0
    assert not [h for h in jobs["hf"]["hints"] if "verify" in h["id"] or "engine" in h["id"]]
    slow = jobs["slow"]["output"]["data"]["verify"]
    assert slow["verdict"] == "timeout" and slow["reason"] == "no verdict within the budget of 0.3 s"
    assert [(h["id"], h["severity"]) for h in jobs["slow"]["hints"]] == [("verify-timeout", "warning")]
    nobody = jobs["nobody"]["output"]["data"]["verify"]
    assert nobody["verdict"] == "error" and nobody["worst_cosine"] is None, nobody
    (hint,) = jobs["nobody"]["hints"]
    assert hint["id"] == "verify-error" and hint["severity"] == "warning", hint
    assert "no SGLang server answers" in nobody["reason"] and nobody["reason"] in hint["message"]
    samples = {(s.name, s.labels.get("job"), s.labels.get("verdict")): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert samples[("hsmon_verify_checks_total", "hf", "agree")] == 1
    assert samples[("hsmon_verify_checks_total", "slow", "timeout")] == 1
    assert samples[("hsmon_verify_disagree", "hf", None)] == 0
    assert samples[("hsmon_verify_worst_cosine", "hf", None)] > 0.9999
    assert ("hsmon_verify_worst_cosine", "nobody", None) not in samples
    if shutil.which("promtool"):
        res = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                             timeout=30)
        assert res.returncode == 0, res.stdout + res.stderr
