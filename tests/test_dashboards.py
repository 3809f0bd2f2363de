"""dashboards/: the Grafana dashboard (code and committed JSON agree, and the JSON has what Grafana
needs), the alert rules (`promtool check rules`, and `promtool test rules` with a firing and a
quiet case for every alert), the example Prometheus, Alertmanager and Grafana provisioning files.
The queries themselves run against a real Prometheus in tests/test_prod_stack.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DASHBOARDS = REPO / "dashboards"
RULES = DASHBOARDS / "prometheus" / "hsmon-alerts.yml"
RULE_TESTS = REPO / "tests" / "promtool" / "hsmon-alerts.test.yml"
OPERATIONS = REPO / "docs" / "operations.md"
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool: run `make sysdeps`")


@pytest.fixture(scope="module")
def generator() -> Any:
    pytest.importorskip("grafana_foundation_sdk")
    sys.path.insert(0, str(DASHBOARDS))
    try:
        import hsmon_dashboard
    finally:
        sys.path.pop(0)
    return hsmon_dashboard


@pytest.fixture(scope="module")
def committed() -> dict[str, Any]:
    return json.loads((DASHBOARDS / "grafana" / "dashboards" / "hsmon.json").read_text())


def test_committed_dashboard_is_what_the_code_generates(generator: Any) -> None:
    text = (DASHBOARDS / "grafana" / "dashboards" / "hsmon.json").read_text()
    assert text == generator.render(), "run: python dashboards/hsmon_dashboard.py"
    assert generator.main(["--check"]) == 0


def test_dashboard_has_what_grafana_needs(committed: dict[str, Any]) -> None:
    panels = committed["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) and i > 0 for i in ids)
    assert committed["uid"] and committed["title"] and isinstance(committed["schemaVersion"], int)
    occupied: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] >= 1 and g["x"] + g["w"] <= 24, p["title"]
        assert g["h"] >= 1 and g["y"] >= 0
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & occupied, f"panel {p['title']!r} overlaps another"
        occupied |= cells
        if p["type"] == "row":
            continue
        assert p["targets"], p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        ref_ids = [t["refId"] for t in p["targets"]]
        assert len(set(ref_ids)) == len(ref_ids) and all(ref_ids)
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}" and t["expr"].strip(), p["title"]
    # the variables: datasource, job, instance (and SGLang's), each one used somewhere
    variables = {v["name"]: v for v in committed["templating"]["list"]}
    assert {"datasource", "job", "instance"} <= set(variables)
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    text = json.dumps(panels) + json.dumps([v.get("query", "") for v in variables.values()])
    for name in variables:
        assert re.search(r"\$\{?" + name + r"\b", text), f"variable {name} is not used"
    # the sections are there
    titles = " / ".join(p["title"] for p in panels)
    for needed in ("State", "Rows", "Tokens", "Chunks", "ETA", "Dump files", "Oldest dump file",
                   "/dev/shm free", "predict_linear", "Restarts", "Resident memory", "CPU",
                   "stdout buffered", "Loss", "Accuracy", "scans", "inotify", "Tick duration", "SGLang",
                   "Spool", "Online wait share"):
        assert needed in titles, needed


@needs_promtool
def test_promtool_checks_and_unit_tests_the_alert_rules() -> None:
    res = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    res = subprocess.run(["promtool", "test", "rules", str(RULE_TESTS)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_alert_is_tested_firing_and_quiet_and_has_a_runbook() -> None:
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    alerts = {r["alert"]: r for r in rules if "alert" in r}
    assert len(alerts) >= 13
    cases = [c for t in yaml.safe_load(RULE_TESTS.read_text())["tests"] for c in t["alert_rule_test"]]
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", OPERATIONS.read_text(), re.M)}
    for name, rule in alerts.items():
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c.get("exp_alerts") for c in mine), f"{name}: no case where it fires"
        assert any(not c.get("exp_alerts") for c in mine), f"{name}: no case where it stays quiet"
        ann = rule["annotations"]
        assert ann["summary"].strip() and ann["description"].strip(), name
        assert rule["labels"]["severity"] in ("info", "warning", "critical")
        path, _, anchor = ann["runbook_url"].partition("#")
        assert path == "docs/operations.md" and anchor == name.lower(), ann["runbook_url"]
        assert anchor in anchors, f"docs/operations.md has no runbook heading for {name}"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@needs_promtool
def test_example_prometheus_config_is_valid(tmp_path: Path) -> None:
    config = yaml.safe_load((DASHBOARDS / "prometheus" / "prometheus.yml").read_text())
    hsmon = next(c for c in config["scrape_configs"] if c["job_name"] == "hsmon")
    assert hsmon["honor_labels"] is True
    for name in ("prometheus.yml", "hsmon-alerts.yml"):
        shutil.copy(DASHBOARDS / "prometheus" / name, tmp_path / name)
    res = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_alertmanager_example_routes_hsmon_alerts() -> None:
    path = DASHBOARDS / "alertmanager" / "alertmanager.yml"
    config = yaml.safe_load(path.read_text())
    receivers = {r["name"] for r in config["receivers"]}
    routes = config["route"]["routes"]
    assert config["route"]["receiver"] in receivers and all(r["receiver"] in receivers for r in routes)
    severities = {m for r in routes for m in r["matchers"] if m.startswith("severity")}
    assert severities == {'severity="critical"', 'severity="warning"', 'severity="info"'}
    if shutil.which("amtool"):
        res = subprocess.run(["amtool", "check-config", str(path)], capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 0, res.stdout + res.stderr


def test_grafana_provisioning_points_at_the_dashboard() -> None:
    prov = DASHBOARDS / "grafana" / "provisioning"
    ds = yaml.safe_load((prov / "datasources" / "hsmon.yml").read_text())
    assert ds["apiVersion"] == 1 and ds["datasources"][0]["type"] == "prometheus"
    boards = yaml.safe_load((prov / "dashboards" / "hsmon.yml").read_text())
    provider = boards["providers"][0]
    assert provider["type"] == "file"
    assert provider["options"]["path"].startswith("/var/lib/grafana/dashboards")
    # the docker run line in the datasource file mounts the dashboards folder where the provider reads
    assert f"dashboards/grafana/dashboards:{provider['options']['path']}" in (
        prov / "datasources" / "hsmon.yml"
    ).read_text()
