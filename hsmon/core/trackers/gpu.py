"""GPU tracker: per GPU utilization, memory, power, temperature and the PIDs holding memory, via NVML.

NVML comes from the ``nvidia-ml-py`` package (module ``pynvml``), imported lazily: where the package
or the driver is missing the tracker says why once (``reason`` in the status document) and reads
nothing more. Reads are a few NVML calls per GPU, on the monitor's tick thread every ``interval``;
a scrape reads the last result from memory.

The live NVML path has not run on a machine with a GPU yet; the parsing and the idle logic are
tested on a recording of NVML's answers (tests/fixtures/nvml_recording.json).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from hsmon.status_doc import GpuSection, ProcessEntry

log = logging.getLogger("hsmon.gpu")

DEFAULT_INTERVAL = 5.0


def load_nvml() -> tuple[Any | None, str | None]:
    """(the pynvml module, initialised) or (None, why not)."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install 'hsmon[gpu]'): GPUs are not watched"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, f"NVML is not usable here ({exc}): no NVIDIA driver, GPUs are not watched"
    return pynvml, None


def _call(nvml: Any, fn: str, *args: Any) -> Any:
    """One NVML query; None when this GPU does not support it (or it fails)."""
    try:
        return getattr(nvml, fn)(*args)
    except nvml.NVMLError:
        return None


def read_device(nvml: Any, index: int) -> dict[str, Any]:
    """One GPU's figures as plain data (base units: bytes, watts, ratio 0-1)."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    name = _call(nvml, "nvmlDeviceGetName", handle)
    util = _call(nvml, "nvmlDeviceGetUtilizationRates", handle)
    mem = _call(nvml, "nvmlDeviceGetMemoryInfo", handle)
    power_mw = _call(nvml, "nvmlDeviceGetPowerUsage", handle)
    temp = _call(nvml, "nvmlDeviceGetTemperature", handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
    procs: dict[int, int | None] = {}
    for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        for proc in _call(nvml, fn, handle) or []:
            used = getattr(proc, "usedGpuMemory", None)
            procs[int(proc.pid)] = int(used) if isinstance(used, int) else procs.get(int(proc.pid))
    return {
        "index": index,
        "name": name.decode() if isinstance(name, bytes) else name,
        "utilization": None if util is None else util.gpu / 100.0,
        "memory_used_bytes": None if mem is None else int(mem.used),
        "memory_total_bytes": None if mem is None else int(mem.total),
        "power_watts": None if power_mw is None else power_mw / 1000.0,
        "temperature_celsius": temp,
        "processes": [{"pid": pid, "used_memory_bytes": used} for pid, used in sorted(procs.items())],
    }


def idle_since(devices: Iterable[dict[str, Any]], indices: Iterable[int]) -> float | None:
    """When every one of these GPUs last left non-zero utilization (None: one is busy or unknown)."""
    wanted = set(indices)
    chosen = [d for d in devices if d["index"] in wanted]
    if not chosen or any(d.get("zero_since_ts") is None for d in chosen):
        return None
    return max(d["zero_since_ts"] for d in chosen)


def gpus_of(devices: Iterable[dict[str, Any]], pids: set[int]) -> list[int]:
    """Indices of the GPUs on which one of these PIDs holds memory."""
    return [d["index"] for d in devices if any(p["pid"] in pids for p in d.get("processes") or [])]


def job_gpus(
    devices: list[dict[str, Any]], procs: list[ProcessEntry], cache: dict[int, tuple[float, set[int]]]
) -> tuple[list[int], float | None]:
    """The GPUs on which these processes (or their children) hold memory, and since when all of them
    idle. ``cache`` keeps each process's children for 30 s (a server's workers start once)."""
    import time

    import psutil

    pids: set[int] = set()
    mono = time.monotonic()
    for proc in procs:
        pid = proc.pid
        if not proc.alive or pid is None:
            continue
        cached = cache.get(pid)
        if cached is None or mono - cached[0] > 30:
            try:
                kids = {c.pid for c in psutil.Process(pid).children(recursive=True)}
            except psutil.Error:
                kids = set()
            cached = cache[pid] = (mono, kids)
        pids |= {pid, *cached[1]}
    indices = gpus_of(devices, pids)
    return indices, idle_since(devices, indices)


class GpuTracker:
    """Every GPU of the machine; ``poll`` reads NVML, ``snapshot`` reads memory. A machine-level
    tracker (hsmon.core.trackers.base.Tracker): the Monitor polls it once per tick for all its jobs."""

    name = "gpu"

    def __init__(self, nvml: Any | None = None, interval: float = DEFAULT_INTERVAL) -> None:
        self.interval = interval
        self._nvml = nvml
        self._lock = threading.Lock()
        self._initialised = False
        self.available = False
        self.reason: str | None = None
        self.devices: list[dict[str, Any]] = []
        self.last_poll_ts: float | None = None
        self.errors_total = 0
        self._zero_since: dict[int, float] = {}

    def _init(self) -> None:
        self._initialised = True
        if self._nvml is None:
            self._nvml, self.reason = load_nvml()
        else:
            try:
                self._nvml.nvmlInit()
            except self._nvml.NVMLError as exc:
                self._nvml, self.reason = None, f"NVML is not usable here ({exc}): GPUs are not watched"
        self.available = self._nvml is not None
        if self.reason:
            log.info("%s", self.reason)  # once: the status document keeps saying it

    def due(self, now: float) -> bool:
        return not self._initialised or (
            self.available and (self.last_poll_ts is None or now - self.last_poll_ts >= self.interval)
        )

    def poll(self, now: float) -> None:
        """Read every GPU (a no-op after NVML turned out to be missing)."""
        if not self._initialised:
            self._init()
        if not self.available:
            return
        nvml = self._nvml
        try:
            count = nvml.nvmlDeviceGetCount()
            devices = [read_device(nvml, i) for i in range(count)]
        except nvml.NVMLError as exc:
            self.errors_total += 1
            if self.errors_total == 1:
                log.warning("reading the GPUs failed: %s (keeping the last figures)", exc)
            return
        for dev in devices:
            if dev["utilization"] == 0:
                self._zero_since.setdefault(dev["index"], now)
            else:
                self._zero_since.pop(dev["index"], None)
            dev["zero_since_ts"] = self._zero_since.get(dev["index"])
        with self._lock:
            self.devices, self.last_poll_ts = devices, now

    def section(self, now: float) -> GpuSection:
        """The typed ``gpus`` section of the status document (``snapshot`` keeps the dict view)."""
        import msgspec

        return msgspec.convert(self.snapshot(), GpuSection)

    def snapshot(self) -> dict[str, Any]:
        """The ``gpus`` section of the status document."""
        with self._lock:
            return {
                "available": self.available,
                "reason": self.reason,
                "last_poll_ts": self.last_poll_ts,
                "devices": [dict(d) for d in self.devices],
            }
