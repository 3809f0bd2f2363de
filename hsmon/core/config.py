"""Job and daemon configuration, and reading it from a TOML file (several jobs per daemon); the
command-line flags that make one job are in hsmon/job_flags.py.

# hsmon.toml
[daemon]
host = "127.0.0.1"
port = 9108
scan_interval = 2.0
notify_webhook = "http://127.0.0.1:9000/hook"

[[job]]
name = "extract"
kind = "extract"
dump_dir = "/dev/shm/sglang_hs"
out_dir = "/data/out"
events = "/data/out/events.jsonl"
match = "extract_hs\\.py"
stall_after = 300

[[job.process]]          # more processes of the same job, each with a role
role = "server"
match = "sglang.launch_server"

[[job.server]]           # inference servers the job talks to (hsmon/core/trackers/server.py)
url = "http://127.0.0.1:30000"
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from hsmon.core.verify_watch import VERIFY_KEYS, VerifySpec, spec_from_table

JOB_KINDS = ("extract", "train", "regenerate", "external")
PROCESS_ROLES = ("extractor", "server", "trainer", "regenerator")
DEFAULT_STALL_AFTER = 300.0
DEFAULT_SCAN_INTERVAL = 2.0
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9108
DEFAULT_CLIENT_TIMEOUT = 60.0  # seconds an idle HTTP connection to the daemon stays open


DEFAULT_SERVER_INTERVAL = 5.0
DEFAULT_HEALTH_INTERVAL = 15.0
# No forward completed for this long, while /health_generate goes unanswered: hung. SGLang's own
# /health_generate gives up by itself after SGLANG_HEALTH_CHECK_TIMEOUT (20 s) with a 503, which is
# one fact among others (a long forward makes it), never a verdict alone.
DEFAULT_HEALTH_TIMEOUT = 25.0
DEFAULT_BUSY_AFTER = 5.0  # SGLang answers /health_generate within ~1 s when a forward runs


class ConfigError(ValueError):
    """A configuration problem, with a one-line message that names the input and the fix."""


@dataclass
class ProcessSpec:
    """How to find one process of a job: exactly one of pid, pidfile, match."""

    role: str = "extractor"
    pid: int | None = None
    pidfile: str | None = None
    match: str | None = None

    def describe(self) -> str:
        if self.pid is not None:
            return f"PID {self.pid}"
        if self.pidfile:
            return f"pidfile {self.pidfile}"
        return f"command line matching /{self.match}/"


@dataclass
class ServerSpec:
    """An inference server a job talks to, and how often to look at it."""

    url: str
    interval: float = DEFAULT_SERVER_INTERVAL  # liveness and load (/metrics, /model_info)
    health_interval: float = DEFAULT_HEALTH_INTERVAL  # a real forward (/health_generate)
    health_timeout: float = DEFAULT_HEALTH_TIMEOUT
    busy_after: float = DEFAULT_BUSY_AFTER  # a health_generate slower than this: busy

    def checked(self, job: str) -> ServerSpec:
        """Validated (and normalised) self, for specs built outside a JobConfig."""
        self.validate(job)
        return self

    def validate(self, job: str) -> None:
        if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", self.url or ""):
            raise ConfigError(
                f"job {job}: server URL {self.url!r} is not valid: give http://HOST:PORT of the server"
            )
        self.url = self.url.rstrip("/")
        for key in ("interval", "health_interval", "health_timeout", "busy_after"):
            value = getattr(self, key)
            if not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"job {job}: server {self.url}: {key} must be a positive number of seconds")


@dataclass
class JobConfig:
    """What one job is and where to look at it. Every path is optional."""

    name: str = "job"
    kind: str = "external"
    dump_dir: str | None = None
    out_dir: str | None = None
    events: str | None = None
    pid: int | None = None
    pidfile: str | None = None
    match: str | None = None
    role: str | None = None
    processes: list[ProcessSpec] = field(default_factory=list)
    servers: list[ServerSpec] = field(default_factory=list)
    # how often to look at servers given by flags or named by the start event
    server_interval: float = DEFAULT_SERVER_INTERVAL
    health_interval: float = DEFAULT_HEALTH_INTERVAL
    health_timeout: float = DEFAULT_HEALTH_TIMEOUT
    busy_after: float = DEFAULT_BUSY_AFTER
    stall_after: float = DEFAULT_STALL_AFTER
    shm_dir: str = "/dev/shm"
    rows_total: int | None = None
    needed_bytes: int | None = None
    verify: VerifySpec | None = None  # the engine check during the run (hsmon/core/verify_watch.py)
    # where in ``events`` the job begins: a training launched again into the same directory appends
    # to the events of the runs before it, which are not this job's (hsmon/launch/watch.py)
    events_from: int = 0
    # named by default ("job": `hsmon daemon` flags without --job, no event yet): the name the
    # events give (their `job`) replaces it once they arrive (hsmon/core/monitor.py)
    name_from_events: bool = False

    def __post_init__(self) -> None:
        self.validate()

    @property
    def default_role(self) -> str:
        return self.role or {"train": "trainer", "regenerate": "regenerator"}.get(self.kind, "extractor")

    def server_spec(self, url: str) -> ServerSpec:
        """A server of this job looked at with the job's intervals (validated)."""
        spec = ServerSpec(
            url, self.server_interval, self.health_interval, self.health_timeout, self.busy_after
        )
        return spec.checked(self.name)

    def process_specs(self) -> list[ProcessSpec]:
        """The main process (pid/pidfile/match) followed by the extra ones."""
        specs = []
        if self.pid is not None or self.pidfile or self.match:
            specs.append(ProcessSpec(self.default_role, self.pid, self.pidfile, self.match))
        return specs + list(self.processes)

    def validate(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", self.name or ""):
            raise ConfigError(f"job name {self.name!r} is not valid: use 1-64 letters, digits, _ . : -")
        if self.kind not in JOB_KINDS:
            raise ConfigError(
                f"job {self.name}: kind {self.kind!r} is unknown; use one of {', '.join(JOB_KINDS)}"
            )
        if sum(x is not None and x != "" for x in (self.pid, self.pidfile, self.match)) > 1:
            raise ConfigError(f"job {self.name}: give only one of pid, pidfile, match")
        for spec in self.process_specs():
            if spec.role not in PROCESS_ROLES:
                raise ConfigError(
                    f"job {self.name}: process role {spec.role!r} is unknown; "
                    f"use one of {', '.join(PROCESS_ROLES)}"
                )
            if spec.match:
                try:
                    re.compile(spec.match)
                except re.error as exc:
                    raise ConfigError(
                        f"job {self.name}: --match {spec.match!r} is not a valid regex ({exc})"
                    ) from None
        if not self.stall_after or self.stall_after <= 0:
            raise ConfigError(f"job {self.name}: stall_after must be a positive number of seconds")
        for key in ("server_interval", "health_interval", "health_timeout", "busy_after"):
            value = getattr(self, key)
            if not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"job {self.name}: {key} must be a positive number of seconds")
        for server in self.servers:
            server.validate(self.name)
        if self.verify is not None:
            if not self.out_dir:
                raise ConfigError(f"job {self.name}: verify_every needs the job's out_dir (--out)")
            try:
                self.verify.validate(self.name)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        urls = [s.url for s in self.servers]
        if len(set(urls)) != len(urls):
            raise ConfigError(f"job {self.name}: server URLs must be unique (got {urls})")


@dataclass
class DaemonConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    scan_interval: float = DEFAULT_SCAN_INTERVAL
    notify_webhook: str | None = None
    notify_format: str = "json"
    notify_repeat: float = 3600.0
    control_token_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    allow_roots: list[str] = field(default_factory=list)  # where launched trainings may read and write
    retire_grace: float = 900.0  # seconds a removed or finished launched job stays readable
    client_timeout: float = DEFAULT_CLIENT_TIMEOUT  # an idle HTTP connection is closed after it
    jobs: list[JobConfig] = field(default_factory=list)

    def validate(self, source: str | None = None) -> None:
        """One line naming the key (and the file when the value came from one) for a bad value."""
        where = f"{source}: [daemon] " if source else ""
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError(f"{where}host {self.host!r} is not valid: give an address such as 127.0.0.1")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(f"{where}port {self.port!r} is not valid: give a number from 0 to 65535")
        for key in ("scan_interval", "notify_repeat", "retire_grace", "client_timeout"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ConfigError(f"{where}{key} {value!r} is not valid: give a positive number of seconds")
        if not isinstance(self.allow_roots, list) or not all(isinstance(r, str) for r in self.allow_roots):
            raise ConfigError(
                f"{where}allow_roots {self.allow_roots!r} is not valid: give a list of directories")
        for key in ("notify_webhook", "control_token_file", "tls_cert", "tls_key"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{where}{key} {value!r} is not valid: give a string")


_JOB_KEYS = {
    "name",
    "kind",
    "dump_dir",
    "out_dir",
    "events",
    "pid",
    "pidfile",
    "match",
    "role",
    "stall_after",
    "shm_dir",
    "rows_total",
    "needed_bytes",
    "server_interval",
    "health_interval",
    "health_timeout",
    "busy_after",
}
_SERVER_KEYS = {"url", "interval", "health_interval", "health_timeout", "busy_after"}
DAEMON_KEYS = {
    "host",
    "port",
    "scan_interval",
    "notify_webhook",
    "notify_format",
    "notify_repeat",
    "control_token_file",
    "tls_cert",
    "tls_key",
    "allow_roots",
    "retire_grace",
    "client_timeout",
}


def _job_from_table(table: dict[str, Any], source: str, index: int) -> JobConfig:
    unknown = set(table) - _JOB_KEYS - VERIFY_KEYS - {"process", "server"}
    if unknown:
        raise ConfigError(
            f"{source}: [[job]] #{index + 1} has unknown keys {sorted(unknown)}; "
            f"known: {sorted(_JOB_KEYS | VERIFY_KEYS | {'process', 'server'})}"
        )
    kwargs = {k: v for k, v in table.items() if k in _JOB_KEYS}
    kwargs.setdefault("name", f"job{index + 1}")
    processes = []
    for proc in table.get("process", []):
        bad = set(proc) - {"role", "pid", "pidfile", "match"}
        if bad:
            raise ConfigError(f"{source}: [[job.process]] has unknown keys {sorted(bad)}")
        processes.append(ProcessSpec(**proc))
    servers = []
    for server in table.get("server", []):
        bad = set(server) - _SERVER_KEYS
        if bad or "url" not in server:
            raise ConfigError(
                f"{source}: [[job.server]] needs url and takes only {sorted(_SERVER_KEYS)} "
                f"(got {sorted(server)})"
            )
        defaults = {
            "interval": table.get("server_interval", DEFAULT_SERVER_INTERVAL),
            "health_interval": table.get("health_interval", DEFAULT_HEALTH_INTERVAL),
            "health_timeout": table.get("health_timeout", DEFAULT_HEALTH_TIMEOUT),
            "busy_after": table.get("busy_after", DEFAULT_BUSY_AFTER),
        }
        servers.append(ServerSpec(**{**defaults, **server}))
    try:
        verify = spec_from_table(table, str(kwargs["name"]))
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    try:
        return JobConfig(processes=processes, servers=servers, verify=verify, **kwargs)
    except TypeError as exc:
        raise ConfigError(f"{source}: job #{index + 1}: {exc}") from None


def load_toml(path: str) -> DaemonConfig:
    """Read a hsmon.toml into a DaemonConfig."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file; give the path of a hsmon.toml") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config {path}: not valid TOML ({exc}); fix the file") from None
    daemon = data.get("daemon", {})
    unknown = set(daemon) - DAEMON_KEYS
    if unknown:
        raise ConfigError(
            f"{path}: [daemon] has unknown keys {sorted(unknown)}; known: {sorted(DAEMON_KEYS)}"
        )
    cfg = DaemonConfig(**daemon)
    cfg.jobs = [_job_from_table(t, path, i) for i, t in enumerate(data.get("job", []))]
    names = [j.name for j in cfg.jobs]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: job names must be unique (got {names})")
    return cfg
