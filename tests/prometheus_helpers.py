"""A real Prometheus (Debian's `prometheus`) configured from the committed example
(dashboards/prometheus/prometheus.yml: honor_labels, the committed alert rules), with 1 s scrape
and evaluation intervals, scraping the given daemons. Shared by the tests that watch an alert fire."""

from __future__ import annotations

import json
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from daemon_helpers import REPO, Procs, free_port

PROM_EXAMPLE = REPO / "dashboards" / "prometheus" / "prometheus.yml"
RULES = REPO / "dashboards" / "prometheus" / "hsmon-alerts.yml"


class Prometheus:
    """One Prometheus process (owned by ``procs``) and its HTTP API."""

    def __init__(self, procs: Procs, tmp: Path, targets: list[str]) -> None:
        prom = yaml.safe_load(PROM_EXAMPLE.read_text())
        prom["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        prom["rule_files"] = [str(RULES)]
        prom.pop("alerting", None)
        prom["scrape_configs"] = [c for c in prom["scrape_configs"] if c["job_name"] == "hsmon"]
        prom["scrape_configs"][0]["static_configs"] = [{"targets": targets}]
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(prom))
        self.port = free_port()
        self.proc = procs.start(
            ["prometheus", f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=open(tmp / "prometheus.log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
        )

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.loads(resp.read())

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.api("query", query=expr)["data"]["result"]

    def alerts(self, name: str) -> list[dict[str, Any]]:
        return [a for a in self.api("alerts")["data"]["alerts"] if a["labels"]["alertname"] == name]
