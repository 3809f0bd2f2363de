"""TUI cost while a job streams 1,000 events/s, and start to first paint.

A real job (tests/tui_job_writer.py) appends 1,000 progress events per second to its events
file; a real `hsmon daemon` watches it; the real `hsmon tui --url ...` runs on a pseudo-terminal
at 160x48 whose output is drained like a terminal would. Measured:
  - first_paint_s: from starting the TUI process to the first frame that shows the job's state;
  - cpu_pct: the TUI's CPU time over 20 s of streaming, as % of one core (goal <= 5 at the default
    refresh); beside it the same TUI's CPU while the job is frozen (SIGSTOP: no events), the
    baseline measured in the same run, and the daemon's own CPU for scale.

    python bench/tui_cpu.py [--seconds 20] [--rate 1000]
Last line: RESULT cpu_pct=... first_paint_s=... idle_cpu_pct=... events_per_s=...
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
from pathlib import Path

import psutil

from hsmon import daemon as daemon_process

ROOT = Path(__file__).resolve().parent.parent
WRITER = ROOT / "tests" / "tui_job_writer.py"


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

    def wait_for(self, needle: bytes, timeout: float) -> float:
        """Seconds from the start until ``needle`` was first written."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if needle in self.output:
                    return time.monotonic() - self.started
            if self.proc.poll() is not None:
                raise SystemExit(f"the TUI exited early: {bytes(self.output[-2000:])!r}")
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


def cpu_percent(proc: psutil.Process, seconds: float) -> float:
    before = proc.cpu_times()
    time.sleep(seconds)
    after = proc.cpu_times()
    used = (after.user - before.user) + (after.system - before.system)
    return 100.0 * used / seconds


def lines_in(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(1 for _ in fh)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="measuring window (default 20)")
    parser.add_argument("--rate", type=float, default=1000.0, help="events per second (default 1000)")
    args = parser.parse_args()

    env = dict(os.environ, PYTHONPATH=str(ROOT), TERM="xterm-256color")
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    with tempfile.TemporaryDirectory(prefix="hsmon-tui-bench-") as tmp_name:
        tmp = Path(tmp_name)
        events = tmp / "events.jsonl"
        writer = subprocess.Popen(
            [
                sys.executable,
                str(WRITER),
                "--out",
                str(tmp / "out"),
                "--events",
                str(events),
                "--rows",
                "100000000",
                "--rate",
                str(args.rate),
                "--chunk-size",
                "5000",
                "--reject-every",
                "50",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
        )
        try:
            daemon, url = daemon_process.spawn(
                [
                    "--job", "extract",
                    "--kind", "extract",
                    "--out", str(tmp / "out"),
                    "--events", str(events),
                    "--pid", str(writer.pid),
                ],
                tmp / "port",
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
        except daemon_process.DaemonStartError as exc:
            writer.kill()
            raise SystemExit(f"bench: {exc}") from exc
        tui = None
        try:
            time.sleep(2.0)  # the job is running and the daemon has seen it
            tui = PtyProcess([sys.executable, "-m", "hsmon", "tui", "--url", url], 160, 48, env)
            first_frame = tui.wait_for(b"hsmon", 30)
            first_paint = tui.wait_for(b"RUNNING", 30)
            print(f"start to first frame:            {first_frame:.2f} s")
            print(f"start to first paint (job state): {first_paint:.2f} s   (goal < 1.5 s)")

            time.sleep(3.0)  # past start-up
            tui_ps, daemon_ps = psutil.Process(tui.proc.pid), psutil.Process(daemon.pid)
            lines_before, t0 = lines_in(events), time.monotonic()
            daemon_before = daemon_ps.cpu_times()
            streaming = cpu_percent(tui_ps, args.seconds)
            rate = (lines_in(events) - lines_before) / (time.monotonic() - t0)
            daemon_after = daemon_ps.cpu_times()
            daemon_pct = (
                100.0
                * ((daemon_after.user - daemon_before.user) + (daemon_after.system - daemon_before.system))
                / args.seconds
            )
            rss = tui_ps.memory_info().rss

            writer.send_signal(signal.SIGSTOP)  # baseline: same TUI, same daemon, no events
            time.sleep(2.0)
            idle = cpu_percent(tui_ps, min(args.seconds, 10.0))
            writer.send_signal(signal.SIGCONT)

            print(f"events written:                   {rate:,.0f}/s")
            print(f"TUI CPU while streaming:          {streaming:.2f} % of one core   (goal <= 5 %)")
            print(f"TUI CPU, job frozen (baseline):   {idle:.2f} % of one core")
            print(
                f"ratio streaming / baseline:       {streaming / idle:.2f}"
                if idle > 0
                else "ratio streaming / baseline:       n/a (baseline 0)"
            )
            print(f"daemon CPU while streaming:       {daemon_pct:.2f} % of one core")
            print(f"TUI RSS:                          {rss / 1e6:.1f} MB")
            print(
                f"RESULT cpu_pct={streaming:.2f} first_paint_s={first_paint:.2f} idle_cpu_pct={idle:.2f} "
                f"events_per_s={rate:.0f}"
            )
        finally:
            if tui is not None:
                tui.stop()
            for proc in (daemon, writer):
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT) if proc is writer else None
                    proc.terminate()
                    try:
                        proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
