"""A recording of NVML's answers, replayed through the subset of the pynvml API that
hsmon/core/trackers/gpu.py calls. A stand-in for a GPU (there is none here), not for any part of hsmon.

    python tests/nvml_recording.py --capture OUT.json [--frames 4 --every 5]

captures such a recording on a machine with a GPU (needs nvidia-ml-py and a driver; it has not run
here: this machine has no GPU).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

FIXTURE = Path(__file__).parent / "fixtures" / "nvml_recording.json"


class NVMLError(Exception):
    """Raised as pynvml raises its NVMLError (the tracker catches ``nvml.NVMLError``)."""


class RecordedNvml:
    """Replays one frame of the recording at a time; ``advance()`` moves to the next one."""

    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = 0

    def __init__(
        self, path: Path = FIXTURE, pid_map: dict[int, int] | None = None, init_error: str = ""
    ) -> None:
        self.frames = json.loads(Path(path).read_text())["frames"]
        self.frame = 0
        self.pid_map = pid_map or {}
        self.init_error = init_error
        self.calls = 0

    def advance(self) -> None:
        self.frame = min(self.frame + 1, len(self.frames) - 1)

    def _dev(self, handle: int) -> dict[str, Any]:
        self.calls += 1
        return self.frames[self.frame]["devices"][handle]

    def nvmlInit(self) -> None:
        if self.init_error:
            raise NVMLError(self.init_error)

    def nvmlDeviceGetCount(self) -> int:
        return len(self.frames[self.frame]["devices"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self._dev(handle)["name"]

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return SimpleNamespace(**self._dev(handle)["utilization"])

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(**self._dev(handle)["memory"])

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        value = self._dev(handle)["power_mw"]
        if value is None:
            raise NVMLError("Not Supported")
        return value

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return self._dev(handle)["temperature"]

    def _procs(self, handle: int, key: str) -> list[Any]:
        return [
            SimpleNamespace(pid=self.pid_map.get(p["pid"], p["pid"]), usedGpuMemory=p["usedGpuMemory"])
            for p in self._dev(handle)[key]
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        return self._procs(handle, "compute_processes")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[Any]:
        return self._procs(handle, "graphics_processes")


def capture(out: str, frames: int, every: float) -> None:
    """Record what the real NVML answers, in the fixture's format (run on a GPU machine)."""
    import pynvml as nv

    nv.nvmlInit()

    def safe(fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except nv.NVMLError:
            return None

    recorded = []
    for n in range(frames):
        devices = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            util, mem = nv.nvmlDeviceGetUtilizationRates(h), nv.nvmlDeviceGetMemoryInfo(h)
            devices.append({
                "name": nv.nvmlDeviceGetName(h),
                "utilization": {"gpu": util.gpu, "memory": util.memory},
                "memory": {"used": mem.used, "total": mem.total},
                "power_mw": safe(nv.nvmlDeviceGetPowerUsage, h),
                "temperature": safe(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                "compute_processes": [{"pid": p.pid, "usedGpuMemory": p.usedGpuMemory}
                                      for p in safe(nv.nvmlDeviceGetComputeRunningProcesses, h) or []],
                "graphics_processes": [{"pid": p.pid, "usedGpuMemory": p.usedGpuMemory}
                                       for p in safe(nv.nvmlDeviceGetGraphicsRunningProcesses, h) or []],
            })
        recorded.append({"t": n * every, "devices": devices})
        if n + 1 < frames:
            time.sleep(every)
    Path(out).write_text(json.dumps({"about": "captured with tests/nvml_recording.py --capture",
                                     "frames": recorded}, indent=1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capture", required=True, metavar="OUT")
    parser.add_argument("--frames", type=int, default=4)
    parser.add_argument("--every", type=float, default=5.0)
    a = parser.parse_args()
    capture(a.capture, a.frames, a.every)
