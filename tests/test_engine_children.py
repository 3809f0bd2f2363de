"""Children that end and never block, with real processes: a process group whose
leader has exited is still stopped whole; `eval-drafter --engine`'s own server writes its output
to a file, never into a pipe read only until "ready"; an HTTP error from the server ends the run in
one line. The server of the last two is a stand-in (a real process and a real HTTP server, named as
such): what is tested is the plumbing around it, which a real SGLang server only makes slower."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

from daemon_helpers import child_env, wait_until

from extractor.sglang.supervise import stop_session
from trainer.engine_eval import started_server

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_DRAFTER = ROOT / "hsmon" / "demo" / "reference-drafter"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_stop_session_ends_the_whole_group_even_when_its_leader_is_gone():
    leader = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; "
         "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); print(p.pid)"],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    member = int(leader.stdout.readline())  # type: ignore[union-attr]
    leader.wait(timeout=30)  # the leader is gone; its child lives on in the group
    assert alive(member)
    try:
        stop_session(leader, grace=10)
        wait_until(lambda: not alive(member), 10, what="the group's last member stopped")
    finally:
        if alive(member):
            os.kill(member, 9)


# A stand-in for `hsmon sglang-serve`: says "ready at", then writes a line per request as uvicorn
# does (1 MiB of them, past any pipe's size), then leaves a mark that it was never blocked.
CHATTY = """
import sys, time
print("hsmon sglang-serve: ready at http://127.0.0.1:{port}", flush=True)
for i in range(16_000):
    print(f'INFO:     127.0.0.1:4{{i:04d}} - "POST /generate HTTP/1.1" 200 OK' + " " * 8, flush=True)
open(sys.argv[1], "w").close()
time.sleep(120)
"""


def test_the_servers_output_never_blocks_it(tmp_path):
    mark = tmp_path / "wrote-everything"

    def command(port: int) -> list[str]:
        return [sys.executable, "-c", CHATTY.format(port=port), str(mark)]

    with started_server(REFERENCE_DRAFTER, tmp_path, 3, command=command) as url:
        assert url.startswith("http://127.0.0.1:")
        wait_until(mark.exists, 30, what="the server wrote its whole output without a reader")


class ErrorServer(BaseHTTPRequestHandler):
    """A stand-in speculative server: its /server_info says EAGLE at depth 3, /generate fails."""

    def do_GET(self) -> None:
        body = json.dumps({"speculative_draft_model_path": "/d", "speculative_eagle_topk": 1,
                           "speculative_num_steps": 3}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"error": "the scheduler died"}'
        self.send_response(500)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_an_http_error_from_the_server_ends_the_run_in_one_line(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), ErrorServer)
    Thread(target=server.serve_forever, daemon=True).start()
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"input_ids": [5, 6, 7, 8]}\n')
    try:
        started = time.monotonic()
        res = subprocess.run(
            [sys.executable, "-m", "hsmon", "eval-drafter", "--engine", "sglang", "--server",
             f"http://127.0.0.1:{server.server_address[1]}", "--drafter", str(REFERENCE_DRAFTER),
             "--prompts", str(prompts), "--max-new-tokens", "4", "--threads", "1"],
            capture_output=True, text=True, timeout=300, env=child_env(OMP_NUM_THREADS="1"))
    finally:
        server.shutdown()
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("hsmon eval-drafter: http://127.0.0.1:"), last
    assert "answered HTTP 500 to prompt 1 of 1" in last
    assert "the scheduler died" in last and time.monotonic() - started < 120
