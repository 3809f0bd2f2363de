"""Record a status document from the real Monitor into tests/fixtures/status_document.json: every
section filled, for the typed document's round-trip test (tests/test_status_doc.py).

What runs for real: the Monitor and its trackers, tests/story_job.py (a process writing events,
dump files and an hsmon manifest with a plan), tests/standin_train.py (trainer events), the disk,
process, events and output trackers, a finished synthetic output (tests/synthetic_output.py)
watched with the PID of a process that has exited. Replayed: an SGLang server (the recorded answers of
tests/fixtures/sglang_recording, its /server_info given the capture plugin's section as the
plugin's own ``Stats.snapshot()`` builds it) and NVML (tests/fixtures/nvml_recording.json: no GPU
here), the recording's PIDs mapped onto the original job's.

    PYTHONPATH=. .venv/bin/python tests/record_status_document.py [OUT.json]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
FIXTURE = TESTS / "fixtures" / "status_document.json"
RECORDING = TESTS / "fixtures" / "sglang_recording"


def _plugin_section() -> dict:
    """One scheduler's ``hsmon_capture`` dict as the plugin builds it."""
    from extractor.sglang import serve

    sys.path.insert(0, str(serve.PLUGIN_ROOT))
    try:
        from hsmon_sglang_plugin.writer import Stats
    finally:
        sys.path.pop(0)
    stats = Stats(pool_limit_bytes=1 << 30, requests=12, files_written=12)
    stats.hook_samples.extend(("async", ms, 1.0) for ms in (0.2, 0.3, 0.4))
    return stats.snapshot()


def _serve_recorded() -> ThreadingHTTPServer:
    info = json.loads((RECORDING / "server_info.json").read_text())
    info["hsmon_plugin"] = {"version": "1"}
    first = (info.get("internal_states") or [{}])[0]
    info["internal_states"] = [{**first, "hsmon_capture": _plugin_section()}]
    answers = {
        "/metrics": (RECORDING / "metrics.txt").read_bytes(),
        "/model_info": (RECORDING / "model_info.json").read_bytes(),
        "/server_info": json.dumps(info).encode(),
        "/v1/models": (RECORDING / "v1_models.json").read_bytes(),
        "/health_generate": b"",
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = answers.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def record() -> dict:
    """Run the jobs and the Monitor a few seconds; the status document with every section filled."""
    from nvml_recording import RecordedNvml

    from hsmon.core.config import JobConfig, ServerSpec
    from hsmon.core.monitor import Monitor
    from hsmon.core.trackers.gpu import GpuTracker

    with tempfile.TemporaryDirectory(prefix="hsmon-record-") as tmp:
        root = Path(tmp)
        server = _serve_recorded()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        log = open(root / "story.log", "w")  # noqa: SIM115
        story = subprocess.Popen(
            [sys.executable, str(TESTS / "story_job.py"), str(root / "dump"), str(root / "out"),
             "--rows", "100000", "--delay", "0.02", "--events", str(root / "extract.jsonl"),
             "--manifest", "--plan", "--job", "extract"],
            stdout=log, stderr=subprocess.STDOUT)
        train = subprocess.Popen(
            [sys.executable, str(TESTS / "standin_train.py"), "train", str(root / "data"),
             "--out", str(root / "drafter"), "--events", str(root / "train.jsonl")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        from synthetic_output import write_synthetic_output

        # a finished extraction's output (per-layer statistics in its rows) whose process is gone
        write_synthetic_output(root / "written", 300, chunk_size=100, reject_every=50,
                               done=set(range(250)))
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        rec = RecordedNvml(pid_map={5001: story.pid, 5002: train.pid})
        jobs = [
            JobConfig(name="extract", kind="extract", dump_dir=str(root / "dump"),
                      out_dir=str(root / "out"), events=str(root / "extract.jsonl"), pid=story.pid,
                      servers=[ServerSpec(url, interval=0.2, health_interval=0.3)], stall_after=30.0),
            JobConfig(name="train", kind="train", events=str(root / "train.jsonl"), pid=train.pid),
            JobConfig(name="written", kind="extract", out_dir=str(root / "written"), pid=gone.pid),
        ]
        monitor = Monitor(jobs, use_watchdog=False, source="daemon",
                          gpu=GpuTracker(nvml=rec, interval=0.0))
        try:
            monitor.start()
            deadline = time.monotonic() + 30
            doc: dict = {}
            while time.monotonic() < deadline:
                time.sleep(0.5)
                doc = monitor.status_document()
                ext, tr, written = doc["jobs"]
                srv = (ext.get("servers") or [{}])[0]
                out = ext.get("output") or {}
                if (srv.get("capture") and srv.get("info") and srv.get("load")
                        and out.get("chunks_complete") and (out.get("data") or {}).get("drifts") is not None
                        and tr.get("training") and written.get("hints") and ext.get("progress")
                        and ext.get("state") == "running"):
                    break
            else:
                raise SystemExit(f"the document never filled every section: {json.dumps(doc)[:999]}")
            return json.loads(json.dumps(doc))
        finally:
            monitor.stop()
            for proc in (story, train):
                proc.terminate()
                proc.wait(timeout=10)
            log.close()
            server.shutdown()


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURE
    out.write_text(json.dumps(record(), indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
