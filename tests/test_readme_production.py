"""README's "Production on a GPU node", run as written on CPU: `hsmon sglang-serve` (a preset name
for `/models/target`, no `--dtype`: SGLang's auto serves the embedded target's float32 weights in
float16), `hsmon extract --backend sglang` (no `--dtype`: it stores what the server computes in,
agreed in the preflight), `hsmon daemon --server` (the server's load from its /metrics, which
sglang-serve enables) and `hsmon status`. Only the paths and ports are replaced.

The same server (one per module: a server start is the cost here) then shows the preflight's
refusal of a `--dtype` the server does not compute in, before any row, in one line naming the flag
on each side."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from daemon_helpers import Daemon, Procs, free_port, get_json, wait_until
from extract_helpers import events_of, extract_env, make_dataset
from sglang_server import ROOT, SGLangServer, sglang_python

from hsmon.contracts.manifest_reader import read_manifest

pytestmark = pytest.mark.slow


def readme_commands() -> list[list[str]]:
    """The production block of README.md, one argv per line (comments dropped)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"\*\*Production on a GPU node\*\*.*?```\n(.*?)```", text, re.S)
    assert block, "README.md lost its production block"
    return [shlex.split(line.split("#", 1)[0]) for line in block.group(1).splitlines() if line.strip()]


@dataclass
class ReadmeServer(SGLangServer):
    """`hsmon sglang-serve` exactly as README's line gives it (paths and port replaced)."""

    argv: list[str] = field(default_factory=list)

    def command(self) -> list[str]:
        python = [] if "HSMON_SGLANG_VENV" not in os.environ else ["--python", str(sglang_python())]
        return [sys.executable, "-m", *self.argv, *python]


@pytest.fixture(scope="module")
def production(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    sglang_python()  # skip (or fail under HSMON_REQUIRE_SGLANG) without SGLang's environment
    base = tmp_path_factory.mktemp("readme")
    port = free_port()
    out = base / "hs"
    data = make_dataset(base / "data.jsonl", rows=12, seed=45, min_lines=1, max_lines=2)
    url = f"http://127.0.0.1:{port}"
    subst = {"/models/target": "embedded", "DATA.jsonl": str(data), "/data/hs": str(out),
             "http://127.0.0.1:30000": url, "30000": str(port)}

    def replaced(argv: list[str]) -> list[str]:
        return [subst.get(a, a.replace("/data/hs", str(out))) for a in argv]

    commands = [replaced(argv) for argv in readme_commands()]
    assert [argv[:2] for argv in commands] == [["hsmon", "sglang-serve"], ["hsmon", "extract"],
                                               ["hsmon", "daemon"], ["hsmon", "tui"]]
    server = ReadmeServer(Path("embedded"), base, port=port, argv=commands[0])
    server.start()
    held = server_shm(server)
    try:
        yield {"commands": commands, "server": server, "out": out, "data": data, "base": base}
    finally:
        stop_with_ctrl_c(server, held | server_shm(server))


def server_shm(server: SGLangServer) -> set[str]:
    """The /dev/shm files SGLang's processes hold (its load snapshot, its message queues)."""
    import psutil
    from stop_helpers import shm_held_by

    held: set[str] = set()
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(server.proc.pid)
        for proc in [root, *root.children(recursive=True)]:
            held |= shm_held_by(proc.pid)
    return held


def stop_with_ctrl_c(server: SGLangServer, held: set[str]) -> None:
    """Ctrl-C of sglang-serve's terminal (SIGINT to its group): it ends with one line, and SGLang's
    own /dev/shm files are gone after it (13 `sglang_loads_*.shm` had piled up before,
    and 160-250 MB of message queue per server on CPU)."""
    assert server.proc is not None and held, "SGLang held no /dev/shm file: nothing to check"
    try:
        os.killpg(server.proc.pid, signal.SIGINT)
        server.proc.wait(timeout=120)
    finally:
        server.stop()
    log = server.log.read_text(errors="replace") if server.log else ""
    assert "hsmon sglang-serve: stopped by SIGINT (Ctrl-C); the server exited with status" in log, log[-3000:]
    left = sorted(path for path in held if os.path.exists(path))
    assert not left, (left, log[-3000:])


def test_readme_production_commands_run_as_written_on_cpu(production: dict) -> None:
    """The daemon runs first (as on a node where it always runs), then the extraction: README's daemon
    line has only --out and --events, and watches the server, the dump directory and the job by the
    names the extraction's start event gives (before: the dump directory was never watched and the
    job was named `job`)."""
    commands, server, out = production["commands"], production["server"], production["out"]
    info = server.server_info()
    assert info["dtype"] == "auto" and info["enable_metrics"] is True  # no --dtype given; metrics on
    assert info["hsmon_plugin"]["dtype"] == "float16"  # what SGLang made of auto: the plugin says
    procs = Procs()
    try:
        daemon = Daemon(procs, production["base"], [*commands[2][2:], "--scan-interval", "0.5"])
        status_url = daemon.url  # README's tui line reads the daemon at this URL
        assert [j["job"] for j in daemon.status()["jobs"]] == ["job"]  # nothing written yet
        # each dump lies 2 s in the dump directory (12 rows, ~6 s): the daemon, which reads the
        # start event at its next tick, sees dumps come and go whatever the machine's speed
        extract = subprocess.run([sys.executable, "-m", *commands[1]], capture_output=True, text=True,
                                 timeout=600, env={**extract_env(), "HSMON_SGLANG_READ_DELAY_S": "2"})
        assert extract.returncode == 0, extract.stderr[-3000:]
        manifest = read_manifest(out)
        assert len(manifest.rows) == 12 and manifest.runs[-1]["settings"]["dtype"] == "float16"

        def server_up() -> dict | None:
            doc = get_json(status_url + "/api/v1/status")
            (job,) = doc["jobs"]
            srv = next((s for s in job["servers"] if s["state"] == "up" and s["load"]["running"] is not None),
                       None)
            return job if job["state"] == "done" and srv else None

        job = wait_until(server_up, 60, 0.5, what="the job done and the server up with its load")
        assert job["progress"]["rows_done"] == 12
        start = next(e for e in events_of(out / "events.jsonl") if e["kind"] == "start")
        assert job["job"] == start["job"] == "extract-hs", job["job"]
        dump = job["dump"]
        # watched from the start event on: its dumps seen coming and going
        assert dump and dump["path"] == start["dump_dir"] and dump["created_total"] >= 1, dump
        # every dump taken, none left (those already there at the first scan count as consumed only)
        assert dump["consumed_total"] >= dump["created_total"] and not dump["files"], dump
        status = subprocess.run([sys.executable, "-m", "hsmon", "status", "--url", status_url],
                                capture_output=True, text=True, timeout=60, env=extract_env())
        assert status.returncode == 0, status.stderr
        assert re.search(r"extract-hs.*: DONE for .*\n\s+rows\s+12 / 12 ", status.stdout), status.stdout
        line = next(x for x in status.stdout.splitlines() if x.strip().startswith(f"server {server.url}"))
        assert "UP: " in line and "running 0, queued 0" in line, line  # its load, from --enable-metrics
        daemon.stop()
    finally:
        procs.close()


def test_a_dtype_the_server_does_not_compute_in_is_refused_before_any_row(production: dict) -> None:
    server, base = production["server"], production["base"]
    out = base / "hs-fp32"
    argv = ["extract", str(production["data"]), "--out", str(out), "--model", "embedded", "--backend",
            "sglang", "--url", server.url, "--dtype", "float32"]
    run = subprocess.run([sys.executable, "-m", "hsmon", *argv], capture_output=True, text=True, timeout=300,
                         env=extract_env())
    assert run.returncode == 2, run.stderr
    (line,) = [x for x in run.stderr.strip().splitlines() if "float" in x]
    assert line == (f"hsmon extract: --url {server.url}: the server computes in float16, this run asks for "
                    "float32 (--dtype float32): relaunch the server with --dtype float32 (hsmon sglang-serve "
                    "... -- --dtype float32), or leave --dtype out to store the server's float16"), line
    assert not any(out.glob("hsmon-manifest*.jsonl")), "refused before any record"
    assert json.loads(json.dumps(server.server_info()))["hsmon_plugin"]["dtype"] == "float16"


def test_a_daemon_on_the_servers_port_names_sglang(production: dict, tmp_path: Path) -> None:
    """`hsmon daemon --port 30000` beside SGLang: one line naming SGLang's process."""
    server = production["server"]
    done = subprocess.run([sys.executable, "-m", "hsmon", "daemon", "--out", str(tmp_path), "--port",
                           str(server.port)], capture_output=True, text=True, timeout=60, env=extract_env())
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"hsmon daemon: port {server.port} on 127.0.0.1 is taken by PID "), line
    assert "sglang" in line and line.endswith("stop it, or give another --port (0: any free port)"), line
