"""GPU tracker: the absent path for real (no driver here; no package), and the parsing and the idle
hint on a recording of NVML's answers (tests/fixtures/nvml_recording.json, replayed through the
pynvml calls the tracker makes). The live NVML path has not run here: this machine has no GPU."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from daemon_helpers import child_env, procs  # noqa: F401
from nvml_recording import RecordedNvml

from hsmon.core.config import JobConfig
from hsmon.core.monitor import Monitor
from hsmon.core.trackers.gpu import GpuTracker, gpus_of, idle_since
from hsmon.metrics.exporter import MetricsEndpoint


def test_no_driver_here_is_said_once_and_the_monitor_works(caplog):
    caplog.set_level("INFO", logger="hsmon.gpu")
    monitor = Monitor([JobConfig(name="j", pid=1)], use_watchdog=False)
    for _ in range(3):
        monitor.tick(force_scan=True)
    gpus = monitor.status_document()["gpus"]
    assert gpus["available"] is False and gpus["devices"] == []
    assert "NVML" in gpus["reason"] and "GPUs are not watched" in gpus["reason"]
    assert len([r for r in caplog.records if r.name == "hsmon.gpu"]) == 1
    text = MetricsEndpoint(monitor).render().decode()
    assert "hsmon_gpu_available 0.0" in text and "hsmon_gpu_utilization_ratio{" not in text


def test_without_nvidia_ml_py_the_status_says_how_to_install_it(tmp_path):
    code = (
        "import sys, json, io, contextlib\n"
        "sys.modules['pynvml'] = None  # as on a machine without nvidia-ml-py: import fails\n"
        "from hsmon.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        f"    main(['status', '--out', {str(tmp_path)!r}, '--sample', '0', '--json'])\n"
        "print(json.dumps(json.loads(out.getvalue())['gpus']))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    gpus = json.loads(res.stdout.strip().splitlines()[-1])
    assert gpus["available"] is False
    assert gpus["reason"].startswith("nvidia-ml-py is not installed (pip install 'hsmon[gpu]')")


def test_recording_is_parsed_into_base_units_with_unsupported_fields_absent():
    tracker = GpuTracker(nvml=RecordedNvml())
    tracker.poll(100.0)
    doc = tracker.snapshot()
    assert doc["available"] is True and len(doc["devices"]) == 8
    gpu0, gpu7 = doc["devices"][0], doc["devices"][7]
    assert gpu0["name"] == "NVIDIA H100 80GB HBM3"
    assert gpu0["utilization"] == 0.97 and gpu7["utilization"] == 0.90
    assert gpu0["memory_used_bytes"] == 71_468_302_336 and gpu0["memory_total_bytes"] == 85_520_809_984
    assert gpu0["power_watts"] == 612.0 and gpu7["power_watts"] is None  # NOT_SUPPORTED on that one
    assert gpu0["temperature_celsius"] == 66
    assert gpu0["processes"] == [{"pid": 5000, "used_memory_bytes": 71_000_000_000}]
    assert gpu0["zero_since_ts"] is None


def test_zero_utilization_clock_restarts_when_a_gpu_moves():
    rec = RecordedNvml()
    tracker = GpuTracker(nvml=rec)
    for t in (100.0, 105.0, 110.0, 115.0):  # frames: busy, all zero, GPU 0 at 3 %, all zero
        tracker.poll(t)
        rec.advance()
    devices = tracker.snapshot()["devices"]
    assert devices[1]["zero_since_ts"] == 105.0 and devices[0]["zero_since_ts"] == 115.0
    assert gpus_of(devices, {5001, 5002, 99}) == [1, 2]
    assert idle_since(devices, [1, 2]) == 105.0
    assert idle_since(devices, [0, 1]) == 115.0
    assert idle_since(devices, []) is None


def test_idle_gpus_of_a_live_watched_process_give_the_hint_and_metrics(procs):  # noqa: F811
    worker = procs.start([sys.executable, "-c", "import time; time.sleep(60)"])
    rec = RecordedNvml(pid_map={5001: worker.pid, 5002: worker.pid})
    monitor = Monitor(
        [JobConfig(name="tp", pid=worker.pid, stall_after=1.0)],
        use_watchdog=False,
        gpu=GpuTracker(nvml=rec, interval=0.0),  # every tick reads the next frame
    )
    monitor.tick(force_scan=True)  # frame 0: busy
    job = monitor.status_document()["jobs"][0]
    assert job["gpu"]["indices"] == [1, 2] and "gpu-idle" not in {h["id"] for h in job["hints"]}
    rec.advance()
    monitor.tick()  # frame 1: every GPU at 0 %
    time.sleep(1.3)
    rec.advance()
    monitor.tick()  # frame 2: GPU 0 moved, 1 and 2 did not
    job = monitor.status_document()["jobs"][0]
    hint = next(h for h in job["hints"] if h["id"] == "gpu-idle")
    assert "GPU 1, 2" in hint["message"]
    text = MetricsEndpoint(monitor).render().decode()
    assert 'hsmon_gpu_utilization_ratio{gpu="0"} 0.03' in text
    assert 'hsmon_gpu_memory_total_bytes{gpu="7"} 8.5520809984e+10' in text
    assert 'hsmon_job_gpu{gpu="1",job="tp"} 1.0' in text
    assert 'hsmon_gpu_power_watts{gpu="7"}' not in text


def test_the_engine_families_are_rendered_by_the_tick_and_a_scrape_copies_them(procs):  # noqa: F811
    """A scrape serves the engine families as the last tick rendered them (the recording moving
    changes nothing until the next tick), and job plus engine sections form one valid exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    worker = procs.start([sys.executable, "-c", "import time; time.sleep(60)"])
    rec = RecordedNvml(pid_map={5001: worker.pid})
    monitor = Monitor([JobConfig(name="tp", pid=worker.pid)], use_watchdog=False,
                      gpu=GpuTracker(nvml=rec, interval=0.0))  # fmt: skip
    metrics = MetricsEndpoint(monitor)
    monitor.tick(force_scan=True)  # frame 0: GPU 0 at 97 %
    first = metrics.render().decode()
    assert 'hsmon_gpu_utilization_ratio{gpu="0"} 0.97' in first
    rec.advance()  # frame 1 (every GPU at 0 %) is what NVML would say now, but no tick has read it
    assert 'hsmon_gpu_utilization_ratio{gpu="0"} 0.97' in metrics.render().decode()
    monitor.tick()
    text = metrics.render().decode()
    assert 'hsmon_gpu_utilization_ratio{gpu="0"} 0.0' in text
    names = [f.name for f in text_string_to_metric_families(text)]
    assert len(names) == len(set(names))
    assert {"hsmon_job_state", "hsmon_gpu_available", "hsmon_server_up"} <= set(names)
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), lint
