"""A real SGLang server on CPU for tests, started through `hsmon sglang-serve`.

Use ``start_sglang_server(...)`` for a server of your own (kill/restart it in a test), or the
module-scoped ``sglang_server`` fixture (the embedded target, fp32, default capture points)::

    from tests.sglang_server import sglang_server  # noqa: F401  (pytest finds the fixture)

A missing .sglang-venv skips, or fails when HSMON_REQUIRE_SGLANG=1 (as `make test` sets).
HSMON_SGLANG_VENV=DIR runs every server on another SGLang environment (make test-sglang-matrix:
.sglang-venv-X, one per release of docs/extract.md's support table).
The server runs in its own process group; stop()/kill() end the whole group.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from extractor.sglang.ports import free_stable_port

ROOT = Path(__file__).resolve().parents[1]
SGLANG_VENV = Path(os.environ.get("HSMON_SGLANG_VENV") or ROOT / ".sglang-venv")
SGLANG_PYTHON = SGLANG_VENV / "bin" / "python"
EMBEDDED_MODEL = ROOT / "extractor" / "embedded"
READY_TIMEOUT = 420.0  # seconds; a CPU server is ready in ~15 s alone, minutes on a loaded machine
# SGLang's scheduler polls its sockets without sleeping while idle: half a core to a whole one per
# server, however long it waits (measured: 50-57 % each on the 2-core machine), which slowed every
# other process of the suite, servers starting included. With --sleep-on-idle it blocks in
# zmq.Poller.poll (1 s timeout, woken at once by a request): 1.6 % idle. Every server the tests
# start gets it (SGLang's own flag; no behaviour a test checks depends on the idle loop).
IDLE_ARGS = ("--sleep-on-idle",)


def sglang_python() -> Path:
    """SGLang's environment's Python, or skip (fail under HSMON_REQUIRE_SGLANG=1)."""
    if not SGLANG_PYTHON.exists():
        if os.environ.get("HSMON_REQUIRE_SGLANG"):
            raise AssertionError(f"{SGLANG_PYTHON} missing: run `make sglang-env`")
        pytest.skip("no .sglang-venv (make sglang-env builds it)")
    return SGLANG_PYTHON


_release: dict = {}


def sglang_release() -> dict:
    """The SGLang release of the environment the servers run on and the capture adapter it gets
    (the plugin's own probe, ``python -m hsmon_sglang_plugin.features``): the conformance tests
    run unchanged on every release of the matrix and take the release-specific facts from here."""
    if not _release:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "extractor" / "sglang" / "plugin_root")}
        out = subprocess.run([str(sglang_python()), "-m", "hsmon_sglang_plugin.features"], env=env,
                             capture_output=True, text=True, check=True, timeout=120).stdout
        _release.update(json.loads(out.strip().splitlines()[-1]))
    return _release


def free_port() -> int:
    """A port for a server to bind later: outside the ephemeral range, so that no other server's
    port-0 binds take it in between (extractor/sglang/ports.py)."""
    return free_stable_port()


def get_json(url: str, timeout: float = 30) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def post_json(url: str, body: dict, timeout: float = 120) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return json.loads(resp.read())


@dataclass
class SGLangServer:
    """One `hsmon sglang-serve` process (and SGLang's processes under it) on a port."""

    model_dir: Path
    workdir: Path
    layers: Sequence[int] | None = None
    chunked_prefill_size: int | None = None
    dump_root: Path | None = None
    extra_args: Sequence[str] = ()  # after --: SGLang's own
    dtype: str = "float32"
    serve_args: Sequence[str] = ()  # `hsmon sglang-serve`'s own options (--no-metrics)
    env: Mapping[str, str] = field(default_factory=dict)  # added to the environment (SGLANG_...)
    port: int = 0
    proc: subprocess.Popen | None = field(default=None, repr=False)
    log: Path | None = None
    starts: int = 0

    program = "sglang-serve"  # the hsmon command that starts it (tests/vllm_server.py: vllm-serve)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "hsmon", "sglang-serve", "--model-path", str(self.model_dir),
               "--port", str(self.port), "--python", str(sglang_python()), "--device", "cpu"]
        if self.layers:
            cmd += ["--layers", ",".join(str(p) for p in self.layers)]
        if self.dump_root is not None:
            cmd += ["--dump-dir", str(self.dump_root)]
        cmd += [*self.serve_args, "--", "--dtype", self.dtype, *IDLE_ARGS]
        if self.chunked_prefill_size:
            cmd += ["--chunked-prefill-size", str(self.chunked_prefill_size)]
        return cmd + list(self.extra_args)

    def start(self, timeout: float = READY_TIMEOUT) -> SGLangServer:
        """Start (again, on the same port) and wait until `hsmon sglang-serve` says ready."""
        return self.launch().wait_ready(timeout)

    def launch(self) -> SGLangServer:
        """Start the process and return at once (`wait_ready` waits for it): a fixture can let the
        server start while other work runs."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("server already running")
        self.port = self.port or free_port()
        self.starts += 1
        self.log = self.workdir / f"{self.program}-{self.port}-{self.starts}.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT), **self.env}
        env.setdefault("OMP_NUM_THREADS", "1")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                         cwd=self.workdir, start_new_session=True)
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> SGLangServer:
        """Wait until the launched server says ready; stop it and fail after ``timeout`` s."""
        assert self.proc is not None and self.log is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"hsmon {self.program} exited {self.proc.returncode}:\n{self.tail()}")
            if f"hsmon {self.program}: ready at" in self.log.read_text(errors="replace"):
                return self
            time.sleep(0.5)
        self.stop()
        raise AssertionError(f"hsmon {self.program}'s server not ready after {timeout:.0f} s:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        if self.log is None or not self.log.exists():
            return ""
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(line[:400] for line in text[-lines:])

    def _signal_group(self, signum: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signum)

    def kill(self) -> None:
        """SIGKILL the whole process group (a server crash)."""
        self._signal_group(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def stop(self, grace: float = 30) -> None:
        """SIGTERM the group, SIGKILL what is left after ``grace`` seconds; idempotent."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace)
        self._signal_group(signal.SIGKILL)  # SGLang's children, should any outlive their parent
        self.proc.wait()

    def restart(self, timeout: float = READY_TIMEOUT) -> SGLangServer:
        self.stop()
        return self.start(timeout)

    def server_info(self) -> dict:
        return get_json(self.url + "/server_info")

    def generate(self, body: dict, timeout: float = 120) -> dict:
        return post_json(self.url + "/generate", body, timeout)


def start_sglang_server(
    model_dir: Path | str,
    workdir: Path | str,
    *,
    layers: Sequence[int] | None = None,
    chunked_prefill_size: int | None = None,
    dump_root: Path | str | None = None,
    extra_args: Sequence[str] = (),
    dtype: str = "float32",
    env: Mapping[str, str] | None = None,
    port: int | None = None,
    timeout: float = READY_TIMEOUT,
) -> SGLangServer:
    """Start `hsmon sglang-serve` on a free port and wait until it is ready."""
    sglang_python()
    server = SGLangServer(
        Path(model_dir), Path(workdir), layers=layers, chunked_prefill_size=chunked_prefill_size,
        dump_root=None if dump_root is None else Path(dump_root), extra_args=tuple(extra_args),
        dtype=dtype, env=dict(env or {}), port=port or 0,
    )
    return server.start(timeout)


def scheduler_of(server: SGLangServer) -> psutil.Process:
    """The `sglang::scheduler` process under the server (the one that runs forwards)."""
    assert server.proc is not None
    for child in psutil.Process(server.proc.pid).children(recursive=True):
        if (child.cmdline() or [""])[0].startswith("sglang::scheduler"):
            return child
    raise AssertionError("no sglang::scheduler child")


def crash(server: SGLangServer) -> None:
    """SIGKILL SGLang's processes and `hsmon sglang-serve` (SGLang runs in a session of its own
    under it, so killing the wrapper's group alone would leave the server running)."""
    assert server.proc is not None
    groups = set()
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(server.proc.pid).children(recursive=True):
            with contextlib.suppress(OSError):
                groups.add(os.getpgid(child.pid))
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    server.kill()


CAPTURE_CHUNK = 64  # capture_server's --chunked-prefill-size
CAPTURE_CONTEXT = 512  # capture_server's --context-length


@pytest.fixture(scope="session")
def capture_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """capture_server's directory: its dump root is ``dump`` in it (a module's dump dirs go there)."""
    return tmp_path_factory.mktemp("sglang-capture")


@pytest.fixture(scope="session")
def capture_server(capture_workdir: Path) -> Iterator[SGLangServer]:
    """The embedded target (fp32, capture points [2, 4, 5]) with a small --chunked-prefill-size and
    --context-length 512, shared by the SGLang group's modules that extract and regenerate
    (tests/test_extract_sglang.py, tests/test_regenerate_sglang.py: one xdist group, one worker, so one
    server start a session). A test that stops, kills or slows it leaves it as it found it."""
    server = start_sglang_server(EMBEDDED_MODEL, capture_workdir, chunked_prefill_size=CAPTURE_CHUNK,
                                 dump_root=capture_workdir / "dump",
                                 extra_args=("--context-length", str(CAPTURE_CONTEXT)))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def sglang_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangServer]:
    """The embedded target (8 layers, hidden 128) in fp32, capture points [2, 4, 5], dump root
    in a temporary directory; one server per test module."""
    workdir = tmp_path_factory.mktemp("sglang-server")
    server = start_sglang_server(EMBEDDED_MODEL, workdir, dump_root=workdir / "dump")
    try:
        yield server
    finally:
        server.stop()
