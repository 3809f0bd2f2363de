"""The soak's Prometheus: started on the shipped alert rules, and the alerts it fires, each with the
moment it fired (Prometheus's activeAt plus the rule's `for:`)."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from datetime import datetime
from pathlib import Path

import yaml

from extractor.sglang.ports import free_stable_port

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "dashboards" / "prometheus" / "hsmon-alerts.yml"


def get(url: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


def start_prometheus(tmp: Path, target: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_stable_port()  # outside the ephemeral range: no port-0 bind takes it before Prometheus
    prom = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "hsmon", "honor_labels": True,
                                "static_configs": [{"targets": [target]}]}]}
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(prom))
    proc = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=open(tmp / "prometheus.log", "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    return proc, port


def rule_waits() -> dict[str, float]:
    """alert name -> its rule's `for:` in seconds (the shipped rules)."""
    units = {"s": 1, "m": 60, "h": 3600}
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    return {r["alert"]: float(r["for"][:-1]) * units[r["for"][-1]] if "for" in r else 0.0 for r in rules}


WAITS = rule_waits()


def firing(prom_port: int) -> list[tuple[str, str, float]]:
    """The firing alerts: (name, job, when it fired: Prometheus's activeAt + the rule's `for:`), so
    a delay does not depend on when the bench polled."""
    url = f"http://127.0.0.1:{prom_port}/api/v1/alerts"
    try:
        alerts = json.loads(get(url, 5))["data"]["alerts"]
    except OSError:
        return []
    out = []
    for a in alerts:
        if a.get("state") != "firing":
            continue
        name = a["labels"].get("alertname", "?")
        stamp = re.sub(r"(\.\d{6})\d*", r"\1", a["activeAt"]).replace("Z", "+00:00")
        fired = datetime.fromisoformat(stamp).timestamp() + WAITS.get(name, 0.0)
        out.append((name, a["labels"].get("job", ""), fired))
    return out
