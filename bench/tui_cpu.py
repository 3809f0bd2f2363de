"""TUI cost while a job streams 1,000 events/s and while it is frozen, against an empty Textual app.

A real job (tests/tui_job_writer.py) appends progress events to its events file at ``--rate``; a
real `hsmon daemon` watches it; the real `hsmon tui --url ...` runs on pseudo-terminals of 80x24,
120x40 and 160x48 whose output is drained like a terminal would. Beside each, on a pseudo-terminal
of the same size and in the same run, an empty Textual app with the same header and footer
(bench/_tui_empty_app.py): the baseline. CPU is read from /proc/PID/task/*/schedstat (nanoseconds).
Measured per size:
  - first_paint_s: from starting the TUI process to the first frame that shows the job's state;
  - cpu_pct: the TUI's CPU over ``--seconds`` of streaming, % of one core (goal <= 2 at 160x48);
  - frozen_cpu_pct: the TUI's CPU in the first seconds after the job is frozen (SIGSTOP): the rates
    fall to zero and the sparklines still move;
  - idle_cpu_pct: the TUI's CPU once the frozen job's screen has settled (``--settle`` s: a sparkline
    holds 60 readings), only the clock-derived figures tick (elapsed, uptime, event ages); goal
    <= 1 % and <= 1.5x the empty app (idle_ratio);
  - empty_idle_cpu_pct: the empty app's CPU over the same window.
The TUIs and the empty apps run side by side (the CPU of each is its own; they are started one
after the other, so that the first paints do not compete).

    python bench/tui_cpu.py [--seconds 20] [--rate 1000] [--settle 65] [--refresh 1]
Last line: RESULT cpu_pct=... idle_cpu_pct=... idle_ratio=... first_paint_s=... (160x48), then
the same per size (cpu_pct_80x24=... idle_ratio_80x24=... ...), events_per_s=... rss_mb=...

    python bench/tui_cpu.py --soak 600 --rate 10000 --refresh 0.1
RSS over a long run instead (one TUI at 160x48): RESULT soak_s=... rss_mb_start=... rss_mb_end=...
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from hsmon import daemon as daemon_process

ROOT = Path(__file__).resolve().parent.parent
WRITER = ROOT / "tests" / "tui_job_writer.py"
EMPTY_APP = ROOT / "bench" / "_tui_empty_app.py"
SIZES = ((80, 24), (120, 40), (160, 48))


class PtyProcess:
    """A process on a pseudo-terminal of a given size; its output is drained and searched."""

    def __init__(self, argv: list[str], width: int, height: int, env: dict[str, str]) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True, cwd=ROOT
        )
        os.close(slave)
        self.master = master
        self.output = bytearray()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            with self.lock:
                self.output += data
                del self.output[:-200_000]  # keep the tail: a long run writes a lot

    def wait_for(self, needle: bytes, timeout: float) -> float:
        """Seconds from the start until ``needle`` was first written."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if needle in self.output:
                    return time.monotonic() - self.started
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.proc.args} exited early: {bytes(self.output[-2000:])!r}")
            time.sleep(0.005)
        raise SystemExit(f"never saw {needle!r} within {timeout}s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.close(self.master)


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid`` (nanosecond schedstat; psutil's tick counts as fallback)."""
    total = 0.0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as fh:
                total += int(fh.read().split()[0]) / 1e9
        return total
    except (OSError, ValueError, IndexError):
        times = psutil.Process(pid).cpu_times()
        return times.user + times.system


def cpu_percent(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """% of one core each process used over the same ``seconds``."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    time.sleep(seconds)
    return {name: 100.0 * (cpu_seconds(pid) - before[name]) / seconds for name, pid in pids.items()}


def lines_in(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(1 for _ in fh)


def stop_all(*procs: subprocess.Popen[bytes] | None) -> None:
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def streaming_job(rate: float, env: dict[str, str]) -> Iterator[tuple[subprocess.Popen[bytes],
                                                                       subprocess.Popen[bytes], str, Path]]:
    """A job writing ``rate`` events/s and a daemon watching it: (writer, daemon, url, events)."""
    with tempfile.TemporaryDirectory(prefix="hsmon-tui-bench-") as tmp_name:
        tmp = Path(tmp_name)
        events = tmp / "events.jsonl"
        writer = subprocess.Popen(
            [sys.executable, str(WRITER), "--out", str(tmp / "out"), "--events", str(events),
             "--rows", "1000000000", "--rate", str(rate), "--chunk-size", "5000", "--reject-every", "50"],
            env=env, stdout=subprocess.DEVNULL,
        )
        daemon = None
        try:
            daemon, url = daemon_process.spawn(
                ["--job", "extract", "--kind", "extract", "--out", str(tmp / "out"), "--events", str(events),
                 "--pid", str(writer.pid)],
                tmp / "port", env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            time.sleep(2.0)  # the job is running and the daemon has seen it
            yield writer, daemon, url, events
        except daemon_process.DaemonStartError as exc:
            raise SystemExit(f"bench: {exc}") from exc
        finally:
            stop_all(daemon, writer)


def start_tuis(
    url: str, refresh: float, env: dict[str, str]
) -> tuple[dict[str, PtyProcess], dict[str, float]]:
    """The TUI and the empty app at every size, one after the other; first paint of each TUI."""
    started: dict[str, PtyProcess] = {}
    first_paint: dict[str, float] = {}
    for width, height in SIZES:
        size = f"{width}x{height}"
        tui = PtyProcess([sys.executable, "-m", "hsmon", "tui", "--url", url, "--refresh", str(refresh)],
                         width, height, env)
        started[f"tui {size}"] = tui
        first_paint[size] = tui.wait_for(b"RUNNING", 30)
        empty = PtyProcess([sys.executable, str(EMPTY_APP)], width, height, env)
        started[f"empty {size}"] = empty
        empty.wait_for(b"hsmon", 30)
    return started, first_paint


def measure(args: argparse.Namespace, env: dict[str, str]) -> int:
    with streaming_job(args.rate, env) as (writer, daemon, url, events):
        apps: dict[str, PtyProcess] = {}
        try:
            apps, first_paint = start_tuis(url, args.refresh, env)
            time.sleep(3.0)  # past start-up
            pids = {name: app.proc.pid for name, app in apps.items()} | {"daemon": daemon.pid}
            lines_before, t0 = lines_in(events), time.monotonic()
            streaming = cpu_percent(pids, args.seconds)
            rate = (lines_in(events) - lines_before) / (time.monotonic() - t0)
            rss = {name: psutil.Process(app.proc.pid).memory_info().rss / 1e6 for name, app in apps.items()}

            writer.send_signal(signal.SIGSTOP)  # no events from now on
            time.sleep(2.0)
            frozen = cpu_percent(pids, min(args.seconds, 10.0))
            time.sleep(max(0.0, args.settle - 12.0))
            idle = cpu_percent(pids, args.seconds)
            writer.send_signal(signal.SIGCONT)
        finally:
            for app in apps.values():
                app.stop()
    report(first_paint, streaming, frozen, idle, rss, rate, args)
    return 0


def report(first_paint: dict[str, float], streaming: dict[str, float], frozen: dict[str, float],
           idle: dict[str, float], rss: dict[str, float], rate: float, args: argparse.Namespace) -> None:
    print(f"events written: {rate:,.0f}/s; daemon CPU while streaming {streaming['daemon']:.2f} %, "
          f"refresh {args.refresh:g} s, settle {args.settle:g} s; CPU in % of one core")
    print(f"{'size':>8} {'first paint':>12} {'streaming':>10} {'frozen':>8} {'idle':>8} {'empty idle':>11} "
          f"{'idle ratio':>11} {'RSS MB':>7}")
    result: dict[str, str] = {}
    for width, height in SIZES:
        size = f"{width}x{height}"
        tui, empty = f"tui {size}", f"empty {size}"
        ratio = idle[tui] / idle[empty] if idle[empty] > 0 else float("inf")
        print(f"{size:>8} {first_paint[size]:>10.2f} s {streaming[tui]:>10.2f} {frozen[tui]:>8.2f} "
              f"{idle[tui]:>8.2f} {idle[empty]:>11.2f} {ratio:>11.2f} {rss[tui]:>7.1f}")
        result |= {f"cpu_pct_{size}": f"{streaming[tui]:.2f}", f"idle_cpu_pct_{size}": f"{idle[tui]:.2f}",
                   f"empty_idle_cpu_pct_{size}": f"{idle[empty]:.2f}", f"idle_ratio_{size}": f"{ratio:.2f}",
                   f"frozen_cpu_pct_{size}": f"{frozen[tui]:.2f}",
                   f"first_paint_s_{size}": f"{first_paint[size]:.2f}"}
    print("goals at 160x48: streaming <= 2 %, idle <= 1 % and <= 1.5x the empty app, first paint <= 1 s")
    default = "160x48"
    keys = ("cpu_pct", "idle_cpu_pct", "empty_idle_cpu_pct", "idle_ratio", "frozen_cpu_pct", "first_paint_s")
    head = {key: result[f"{key}_{default}"] for key in keys}
    tail = {key: value for key, value in result.items() if not key.endswith(default)}
    fields = head | tail | {"events_per_s": f"{rate:.0f}", "rss_mb": f"{rss['tui ' + default]:.1f}"}
    print("RESULT " + " ".join(f"{key}={value}" for key, value in fields.items()))


def soak(args: argparse.Namespace, env: dict[str, str]) -> int:
    """RSS of one TUI at 160x48 over ``--soak`` seconds of streaming."""
    with streaming_job(args.rate, env) as (_writer, _daemon, url, events):
        tui = PtyProcess([sys.executable, "-m", "hsmon", "tui", "--url", url, "--refresh", str(args.refresh)],
                         160, 48, env)
        try:
            tui.wait_for(b"RUNNING", 30)
            time.sleep(5.0)
            process = psutil.Process(tui.proc.pid)
            lines_before, t0 = lines_in(events), time.monotonic()
            cpu0 = cpu_seconds(tui.proc.pid)
            samples: list[tuple[float, float]] = []
            while (elapsed := time.monotonic() - t0) < args.soak:
                samples.append((elapsed, process.memory_info().rss / 1e6))
                print(f"  {elapsed:6.0f} s  RSS {samples[-1][1]:6.1f} MB", flush=True)
                time.sleep(min(30.0, max(1.0, args.soak / 20)))
            samples.append((time.monotonic() - t0, process.memory_info().rss / 1e6))
            cpu = 100.0 * (cpu_seconds(tui.proc.pid) - cpu0) / samples[-1][0]
            rate = (lines_in(events) - lines_before) / samples[-1][0]
        finally:
            tui.stop()
    half = [rss for t, rss in samples if t >= samples[-1][0] / 2]
    growth_per_h = (samples[-1][1] - half[0]) / (samples[-1][0] / 2) * 3600 if len(half) > 1 else 0.0
    documents = samples[-1][0] / args.refresh  # the soak's length ÷ the refresh: an estimate, not a count
    print(f"{samples[-1][0]:.0f} s at {rate:,.0f} events/s, a document every {args.refresh:g} s "
          f"({documents:,.0f} documents = {documents / 3600:.1f} h at the default 1 s); TUI CPU {cpu:.2f} %")
    print(f"RSS {samples[0][1]:.1f} MB -> {samples[-1][1]:.1f} MB (max {max(r for _, r in samples):.1f}); "
          f"second half grows {growth_per_h:+.1f} MB per hour of this run")
    print(f"RESULT soak_s={samples[-1][0]:.0f} events_per_s={rate:.0f} refresh_s={args.refresh:g} "
          f"documents={documents:.0f} rss_mb_start={samples[0][1]:.1f} rss_mb_end={samples[-1][1]:.1f} "
          f"rss_mb_max={max(r for _, r in samples):.1f} rss_growth_mb_per_h={growth_per_h:.1f} "
          f"cpu_pct={cpu:.2f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="each measuring window (default 20)")
    parser.add_argument("--rate", type=float, default=1000.0, help="events per second (default 1000)")
    parser.add_argument("--settle", type=float, default=65.0,
                        help="seconds frozen before the idle window (default 65: a sparkline holds "
                             "60 readings)")
    parser.add_argument("--refresh", type=float, default=1.0, help="the TUI's --refresh (default 1)")
    parser.add_argument("--soak", type=float, default=0.0, metavar="SECONDS",
                        help="measure RSS over a long run instead (one TUI at 160x48)")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT), TERM="xterm-256color")
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores at the start", flush=True)
    return soak(args, env) if args.soak else measure(args, env)


if __name__ == "__main__":
    raise SystemExit(main())
