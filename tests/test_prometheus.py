"""A real Prometheus (Debian's `prometheus` package, installed by `make sysdeps`) scrapes a real
daemon; promtool lints the exposition."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request

import pytest
from daemon_helpers import STORY, Daemon, free_port, procs, wait_until  # noqa: F401

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("prometheus") is None, reason="prometheus not installed: run `make sysdeps`"
    ),
]


def test_promtool_accepts_the_exposition(procs, tmp_path):  # noqa: F811
    story = procs.start(
        [sys.executable, STORY, str(tmp_path / "dump"), str(tmp_path / "out"), "--delay", "0.05"],
        stdout=subprocess.DEVNULL,
    )
    daemon = Daemon(
        procs,
        tmp_path,
        [
            "--dump-dir",
            str(tmp_path / "dump"),
            "--out",
            str(tmp_path / "out"),
            "--pid",
            str(story.pid),
            "--scan-interval",
            "0.5",
        ],
    )
    wait_until(lambda: daemon.job()["state"] == "silent", 15)
    text = urllib.request.urlopen(daemon.url + "/metrics", timeout=10).read()
    res = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, timeout=30)
    assert res.returncode == 0, res.stdout.decode() + res.stderr.decode()
    for line in text.decode().splitlines():
        if line.startswith("hsmon_"):
            assert "pid=" not in line and "path=" not in line  # low-cardinality labels only
    daemon.stop()


def test_real_prometheus_scrapes_the_daemon(procs, tmp_path):  # noqa: F811
    story = procs.start(
        [sys.executable, STORY, str(tmp_path / "dump"), str(tmp_path / "out"), "--delay", "0.05"],
        stdout=subprocess.DEVNULL,
    )
    daemon = Daemon(
        procs,
        tmp_path,
        [
            "--job",
            "story",
            "--dump-dir",
            str(tmp_path / "dump"),
            "--out",
            str(tmp_path / "out"),
            "--pid",
            str(story.pid),
            "--scan-interval",
            "0.5",
        ],
    )
    prom_port = free_port()
    (tmp_path / "prometheus.yml").write_text(f"""
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: hsmon
    honor_labels: true
    static_configs:
      - targets: ["{daemon.url.removeprefix("http://")}"]
""")
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115
    procs.start(
        [
            "prometheus",
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    query = urllib.parse.quote('hsmon_job_state{job="story",state="silent"}')

    def silent_in_prometheus():
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{prom_port}/api/v1/query?query={query}", timeout=5
            ) as r:
                result = json.loads(r.read())["data"]["result"]
        except OSError:
            return None
        return result and result[0]["value"][1] == "1" and result

    result = wait_until(silent_in_prometheus, 60, interval=0.5, what="hsmon_job_state in Prometheus")
    # honor_labels keeps hsmon's own `job` label (the watched job) instead of the scrape job's
    assert result[0]["metric"]["__name__"] == "hsmon_job_state"
    up = urllib.parse.quote("up")
    with urllib.request.urlopen(f"http://127.0.0.1:{prom_port}/api/v1/query?query={up}", timeout=5) as r:
        assert json.loads(r.read())["data"]["result"][0]["value"][1] == "1"
    daemon.stop()
    log.close()
