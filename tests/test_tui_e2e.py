"""End to end: the real `hsmon tui` in tmux, against a real `hsmon daemon` watching a real job
process; the screen is read with `tmux capture-pane` and checked for what a person sees."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hsmon import daemon as daemon_process

pytestmark = pytest.mark.slow
WRITER = str(Path(__file__).with_name("tui_job_writer.py"))
REPO = str(Path(__file__).resolve().parent.parent)


def repo_env() -> dict[str, str]:
    """The environment for child processes: this checkout's hsmon first on the path."""
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{path}" if path else REPO)
TOKEN = "e2e-token-0123456789abcdef"


class Daemon:
    """`hsmon daemon` watching the job, on a port it picks (kept across restarts)."""

    def __init__(self, tmp_path: Path, job_pid: int) -> None:
        self.tmp_path = tmp_path
        self.job_pid = job_pid
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        (tmp_path / "token").write_text(TOKEN + "\n")
        (tmp_path / "token").chmod(0o600)  # the daemon refuses a token others may read

    def start(self) -> None:
        with open(self.tmp_path / "daemon.log", "ab") as log:
            try:
                self.proc, url = daemon_process.spawn(
                    [
                        "--job", "extract",
                        "--kind", "extract",
                        "--out", str(self.tmp_path / "out"),
                        "--events", str(self.tmp_path / "events.jsonl"),
                        "--pid", str(self.job_pid),
                        "--control-token-file", str(self.tmp_path / "token"),
                        "--scan-interval", "1",
                    ],
                    self.tmp_path / "port",
                    port=self.port,  # a restarted daemon comes back where the TUI looks
                    stdout=log,
                    stderr=log,
                    env=repo_env(),
                )  # fmt: skip
            except daemon_process.DaemonStartError as exc:
                raise AssertionError(f"{exc}: {(self.tmp_path / 'daemon.log').read_text()}") from exc
        self.port = int(url.rsplit(":", 1)[1])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Terminal:
    """A tmux session running one command; ``screen()`` is what a person would see."""

    def __init__(self, command: str, width: int, height: int) -> None:
        self.name = f"hsmon-e2e-{uuid.uuid4().hex[:8]}"
        subprocess.run(
            ["tmux", "new-session", "-d", "-s", self.name, "-x", str(width), "-y", str(height), command],
            check=True,
        )

    def screen(self) -> str:
        result = subprocess.run(
            ["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True, text=True
        )
        return result.stdout

    def keys(self, *keys: str) -> None:
        for key in keys:
            subprocess.run(["tmux", "send-keys", "-t", self.name, key], check=True)
            time.sleep(0.2)

    def resize(self, width: int, height: int) -> None:
        subprocess.run(
            ["tmux", "resize-window", "-t", self.name, "-x", str(width), "-y", str(height)], check=True
        )

    def wait_for(self, condition: Callable[[str], bool], what: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if condition(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"the screen never showed {what}; it shows:\n{screen}")
            time.sleep(0.25)

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


@pytest.fixture
def job(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [
            sys.executable,
            WRITER,
            "--out",
            str(tmp_path / "out"),
            "--events",
            str(tmp_path / "events.jsonl"),
            "--rows",
            "200000",
            "--rate",
            "20",
            "--chunk-size",
            "40",
            "--reject-every",
            "9",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=repo_env(),
    )
    yield proc
    proc.kill()
    proc.wait()


def tui_command(url: str, tmp_path: Path) -> str:
    env = f"PYTHONPATH={shlex.quote(repo_env()['PYTHONPATH'])} TERM=xterm-256color"
    return (
        f"env {env} {shlex.quote(sys.executable)} -m hsmon tui --url {url} --refresh 0.5 "
        f"--token-file {tmp_path / 'token'}; echo TUI-EXITED-$?; sleep 600"
    )


def rejects_alone_and_searched(term: Terminal) -> None:
    """With the rejects filter, the job's row events ("14:02:31 row 12") are filtered out; `/` and
    a row's number keep the one line that holds it; escape gives every reject back."""
    clock = r"\d\d:\d\d:\d\d"
    term.wait_for(lambda s: (re.search(rf"{clock} reject row \d+: too long", s)
                             and not re.search(rf"{clock} row \d+", s)),
                  "the rejects alone, each at its clock time")
    row = re.findall(r"reject row (\d+): too long", term.screen())[-1]
    term.keys("/", *f"row {row}:")
    term.wait_for(lambda s: f"/row {row}: (1 found" in s and len(re.findall(r"reject row \d+", s)) == 1,
                  "the one line the search finds")
    term.keys("Escape")
    term.wait_for(lambda s: len(re.findall(r"reject row \d+", s)) > 1, "the search cleared")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (make test installs it)")
def test_tui_in_tmux_against_a_real_daemon(tmp_path: Path, job: subprocess.Popen[bytes]) -> None:
    daemon = Daemon(tmp_path, job.pid)
    daemon.start()
    term = Terminal(tui_command(daemon.url, tmp_path), 160, 48)
    launched_pid = None
    try:
        # The connection bar is waited for with the job, not read off the first screen that shows the
        # job: when the first status arrives before Textual's first paint, that first frame has the job
        # but neither the bar nor the header's icon (Textual's own widget), and the next frame, 25-50 ms
        # later, has both (8 of 15 starts at load 2; frames read every 20 ms with tmux capture-pane).
        connected = f"● 127.0.0.1:{daemon.port}"
        screen = term.wait_for(lambda s: "RUNNING" in s and "extract" in s and connected in s,
                               "the running job and the connected daemon")
        assert "rows" in screen and "/ 200.0k" in screen and "ETA" in screen

        # Rows go up on screen while the job runs.
        def rows_done(s: str) -> int:
            line = next(line for line in s.splitlines() if " rows " in line and "/ 200.0k" in line)
            return int(line.split("/ 200.0k")[0].split()[-1].replace(",", ""))

        first = rows_done(screen)
        term.wait_for(lambda s: rows_done(s) > first, "the row count moving")

        # The daemon goes away: the TUI says so and keeps its last figures.
        daemon.stop()
        term.wait_for(lambda s: "disconnected, retrying" in s, "the disconnection")
        # It comes back on the same port: the TUI recovers by itself.
        daemon.start()
        screen = term.wait_for(lambda s: "disconnected" not in s and "RUNNING" in s, "the recovery")

        # Event filter: rejects only (the wide layout shows the log).
        term.wait_for(lambda s: "show:  all" in s and "─ rates ─" in s, "the 160x48 layout")
        term.keys("f", "f")
        rejects_alone_and_searched(term)

        # Resizes cleanly to 80x24: panels stack, nothing runs past the right edge.
        term.resize(80, 24)
        screen = term.wait_for(
            lambda s: "RUNNING" in s and "quit" in s and "─ rates ─" not in s.splitlines()[9],
            "the 80x24 layout",
        )
        assert max(len(line.rstrip()) for line in screen.splitlines()) <= 80
        # And back to wide: progress and rates side by side again.
        term.resize(160, 48)
        term.wait_for(
            lambda s: any("─ progress ─" in line and "─ rates ─" in line for line in s.splitlines()),
            "the wide layout again",
        )

        # Training: prefilled from the job, warns, launches through the daemon with the token.
        term.keys("t")
        screen = term.wait_for(lambda s: "launch a drafter training" in s, "the training screen")
        data_line = next(line for line in screen.splitlines() if "data directory" in line)
        assert str(tmp_path)[:30] in data_line and "unfinished" in screen, screen
        term.keys("l")
        screen = term.wait_for(lambda s: "launched" in s, "the launch confirmation")
        pidfile = tmp_path / "out-drafter" / "train.pid"
        deadline = time.monotonic() + 10
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        launched_pid = int(pidfile.read_text())
        term.keys("o")
        term.wait_for(lambda s: "train-out-drafter" in s, "a tab for the launched training")
        term.keys("?")
        term.wait_for(lambda s: "hsmon tui: keys" in s, "the help")
        term.keys("Escape")  # alone: an escape right before a key reads as alt+key in a terminal
        term.wait_for(lambda s: "hsmon tui: keys" not in s, "the help closed")
        term.keys("q")
        term.wait_for(lambda s: "TUI-EXITED-0" in s, "the TUI gone after q, exit status 0")
    finally:
        term.close()
        daemon.stop()
        if launched_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(launched_pid, signal.SIGKILL)
