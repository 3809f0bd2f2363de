"""examples/: the Kubernetes Indexed Job passes kubectl-free validation (the YAML parses, the fields
a Job and its pod need are there and consistent, the commands are ones hsmon's parsers accept);
the shell scripts pass `bash -n` and run commands hsmon accepts."""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from extractor.shard_env import resolve_shard

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PARSERS = {"extract": "extractor.cli", "train": "trainer.cli", "daemon": "hsmon.daemon"}


def parse(command: str, argv: list[str]) -> argparse.Namespace:
    module = importlib.import_module(PARSERS[command])
    parser = argparse.ArgumentParser(prog=f"hsmon {command}", exit_on_error=False)
    module.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.fixture(scope="module")
def job() -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / "k8s-indexed-job.yaml").read_text())


def test_kubernetes_indexed_job_has_what_a_job_needs(job: dict[str, Any]) -> None:
    assert job["apiVersion"] == "batch/v1" and job["kind"] == "Job" and job["metadata"]["name"]
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] >= 2
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] in ("Never", "OnFailure")  # a Job refuses Always
    containers = pod["containers"] + pod.get("initContainers", [])
    names = [c["name"] for c in containers]
    assert len(names) == len(set(names))
    volumes = {v["name"] for v in pod["volumes"]}
    for c in containers:
        assert c["image"] and (c.get("command") or c.get("args"))
        for mount in c.get("volumeMounts", []):
            assert mount["name"] in volumes and mount["mountPath"].startswith("/")
    # the count hsmon reads equals the Job's completions
    extract = next(c for c in pod["containers"] if c["command"][:2] == ["hsmon", "extract"])
    env = {e["name"]: e["value"] for e in extract["env"]}
    assert int(env["HSMON_SHARD_COUNT"]) == spec["completions"]
    assert resolve_shard(None, {"JOB_COMPLETION_INDEX": "2", **env}) == f"2/{spec['completions']}"


def test_kubernetes_sidecar_daemon_watches_the_extraction(job: dict[str, Any]) -> None:
    pod = job["spec"]["template"]
    sidecar = pod["spec"]["initContainers"][0]
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar: the Job completes without it
    assert pod["spec"]["shareProcessNamespace"] is True
    port = sidecar["ports"][0]["containerPort"]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    index = {"$(JOB_COMPLETION_INDEX)": "1"}  # what Kubernetes substitutes

    def args(c: dict[str, Any]) -> list[str]:
        return [re.sub(r"\$\(JOB_COMPLETION_INDEX\)", index["$(JOB_COMPLETION_INDEX)"], a) for a in c["args"]]

    extract = next(c for c in pod["spec"]["containers"] if c["command"][:2] == ["hsmon", "extract"])
    e = parse("extract", args(extract))
    assert e.shard is None  # it comes from the environment
    d = parse("daemon", args(sidecar))
    assert d.events == e.events and d.out == e.out and d.port == port and d.host == "0.0.0.0"


def _expand(words: list[str]) -> list[str]:
    """Shell variables replaced by sample values (their names when no sample is needed)."""
    samples = {"port": "9108", "shard": "0", "NODE_RANK": "0", "NNODES": "2", "GPUS_PER_NODE": "8"}
    def one(m: re.Match[str]) -> str:
        return samples.get(m.group(1), m.group(1))

    return [re.sub(r"\$\{?(\w+)\}?", one, w) for w in words if w != "&"]


def _command_line(script: str, marker: str) -> list[str]:
    """The (backslash-joined) line of ``script`` that runs ``marker``, split as the shell would."""
    text = (EXAMPLES / script).read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if marker in line and not line.lstrip().startswith("#"))
    words = shlex.split(line)
    return words[words.index(marker.split()[-1]) + 1:]


@pytest.mark.parametrize("script", ["slurm-extract.sbatch", "torchrun-train.sh"])
def test_scripts_parse(script: str) -> None:
    res = subprocess.run(["bash", "-n", str(EXAMPLES / script)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr


def test_slurm_array_extracts_without_shard_flag() -> None:
    text = (EXAMPLES / "slurm-extract.sbatch").read_text()
    assert re.search(r"^#SBATCH --array=\d+-\d+", text, re.M)
    argv = _command_line("slurm-extract.sbatch", '"$HSMON" extract')
    args = parse("extract", _expand(argv))
    assert args.shard is None and args.events
    daemon = parse("daemon", _expand(_command_line("slurm-extract.sbatch", '"$HSMON" daemon')))
    assert daemon.events == args.events


def test_torchrun_launches_hsmon_train_with_resume() -> None:
    argv = _command_line("torchrun-train.sh", "exec torchrun")
    assert "--nnodes" in argv and "--node-rank" in argv and "--rdzv-endpoint" in argv
    module_at = argv.index("-m")
    assert argv[module_at + 1 : module_at + 3] == ["hsmon", "train"]
    args = parse("train", _expand(argv[module_at + 3 :]))
    assert args.resume and args.events
