"""`hsmon daemon`'s reload: SIGHUP (`systemctl reload hsmon-daemon`, the unit's ExecReload) reads the
configuration again and applies it without a restart (the jobs' plan: hsmon/core/reload.py): the
jobs, `allow_roots`, the notifications, `scan_interval`, `retire_grace`, `client_timeout`, the
control token read again from its file (changed in place or a new file; a file that no longer
reads, or a token too short, refused and the old token kept), and the TLS certificate and key read
again from their files (a bad pair refused, the old one kept). What takes a restart (`host`,
`port`, TLS turned on or off) is named in one log line.
docs/daemon.md lists what a reload does with each key."""

from __future__ import annotations

import gc
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from hsmon.core import config as cfgmod
from hsmon.daemon import security
from hsmon.daemon.security import redact_url

log = logging.getLogger("hsmon.daemon")


class Reloader:
    """SIGHUP (`systemctl reload hsmon-daemon`): the configuration read again and applied without a
    restart (hsmon/core/reload.py); a configuration with an error is refused in one log line and
    the running jobs go on. Also retires the trainings it launched once they ended ``retire_grace``
    ago."""

    def __init__(self, read_config: Callable[[], cfgmod.DaemonConfig], cfg: cfgmod.DaemonConfig,
                 monitor: Any, stopping: threading.Event, server: Any = None, notifier: Any = None) -> None:
        self.read_config, self.cfg, self.monitor, self.stopping = read_config, cfg, monitor, stopping
        self.server, self.notifier = server, notifier  # hsmon.daemon.api.DaemonServer, notify.NotifierSlot
        self.configured = {job.name: job for job in cfg.jobs}
        # SIGHUPs, from the signal handler to the reload thread. A SimpleQueue's put takes no lock
        # (reentrant-safe): a handler that set a threading.Event took the Event's lock, and a second
        # SIGHUP handled inside it (on the same, main thread) waited for that lock for ever, or
        # recursed until the daemon died (tests/test_daemon_reload.py, a burst of SIGHUPs)
        self.requested: queue.SimpleQueue[None] = queue.SimpleQueue()

    def install(self) -> None:
        signal.signal(signal.SIGHUP, lambda _signum, _frame: self.requested.put(None))
        threading.Thread(target=self._run, name="hsmon-reload", daemon=True).start()
        self.monitor.add_tick_listener(self._retire_finished)

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.requested.get(timeout=0.5)
            except queue.Empty:
                continue
            while not self.requested.empty():  # SIGHUPs that came meanwhile: one reload for them all
                self.requested.get_nowait()
            self.reload()

    def reload(self) -> None:
        from hsmon.core.reload import apply_reload, plan_reload

        started = time.perf_counter()
        try:
            new = self.read_config()
            roots = self._roots(new)
        except cfgmod.ConfigError as exc:
            log.error("reload refused: %s; the %d jobs watched go on unchanged", exc, len(self.configured))
            return
        try:
            notes = self._notifications(new)
        except ValueError as exc:
            log.error("reload refused: %s; nothing changed", exc)
            return
        restart = [k for k in ("host", "port") if getattr(new, k) != getattr(self.cfg, k)]
        notes += self._tls(new, restart)
        notes += self._token(new, roots)
        if restart:
            log.warning("reload: %s changed, which takes a restart; the rest is applied", ", ".join(restart))
        plan = plan_reload(self.configured, new.jobs)
        apply_reload(self.monitor, plan, new.retire_grace)
        if plan.add or plan.change or plan.remove:
            # the removed jobs' objects collected here, not by a full collection that a later
            # scrape's allocations would trigger (~13 ms with 20 jobs); then /metrics is rendered
            # for the new set (a scrape after a reload sends it rather than render itself)
            gc.collect()
            self.monitor.jobs_changed()
        self.configured = {job.name: job for job in new.jobs}
        notes += self._settings(new, roots)
        log.info("reloaded in %.3f s: %s%s", time.perf_counter() - started, plan.summary(),
                 "".join(f"; {n}" for n in notes))

    def _roots(self, new: cfgmod.DaemonConfig) -> list[str]:
        """The new allowed roots, resolved; ConfigError when they are bad or too few for the
        address the daemon listens on."""
        roots = security.resolved_roots(new.allow_roots)
        if self.server is not None:
            security.check_exposure(self.cfg.host, self.server.token, roots)
        return roots

    def _notifications(self, new: cfgmod.DaemonConfig) -> list[str]:
        if self.notifier is None or not self.notifier.configure(new.notify_webhook, new.notify_format,
                                                               new.notify_repeat):
            return []
        self.cfg.notify_webhook, self.cfg.notify_format = new.notify_webhook, new.notify_format
        self.cfg.notify_repeat = new.notify_repeat
        return [f"notifications {'to ' + redact_url(new.notify_webhook) if new.notify_webhook else 'off'}"]

    def _tls(self, new: cfgmod.DaemonConfig, restart: list[str]) -> list[str]:
        """The certificate and key read again (a renewed pair at the same paths, or new paths);
        a bad pair is refused and the old one kept. TLS on or off takes a restart."""
        if self.server is None or (self.server.tls is None and not (new.tls_cert or new.tls_key)):
            return []
        if self.server.tls is None or not (new.tls_cert or new.tls_key):
            turned = "on" if self.server.tls is None else "off"
            restart.append(f"tls_cert/tls_key (TLS turned {turned})")
            return []
        try:
            ctx = security.tls_context(new.tls_cert, new.tls_key)
        except cfgmod.ConfigError as exc:
            log.error("reload: TLS refused: %s; the old certificate is kept", exc)
            return []
        self.server.tls = ctx
        self.cfg.tls_cert, self.cfg.tls_key = new.tls_cert, new.tls_key
        return [f"TLS certificate read again from {new.tls_cert}"]

    def _token(self, new: cfgmod.DaemonConfig, roots: list[str]) -> list[str]:
        """The control token read again (a token rewritten in its file takes effect now); a file
        that does not read, or a token the exposure rules refuse, keeps the old token."""
        if self.server is None:
            return []
        try:
            token = security.read_control_token(new.control_token_file)
            security.check_exposure(self.cfg.host, token, roots)
        except cfgmod.ConfigError as exc:
            log.error("reload: control token refused: %s; the old one is kept", exc)
            return []
        if token == self.server.token:
            return []
        self.server.token, self.cfg.control_token_file = token, new.control_token_file
        where = new.control_token_file or "$HSMON_CONTROL_TOKEN"
        return [f"control token read again from {where}" if token else "control endpoints off (no token)"]

    def _settings(self, new: cfgmod.DaemonConfig, roots: list[str]) -> list[str]:
        notes = []
        if self.server is not None and roots != self.server.roots:
            self.server.roots = roots
            notes.append(f"allow_roots {', '.join(roots) or 'none'}")
        if new.scan_interval != self.cfg.scan_interval:
            self.monitor.set_scan_interval(new.scan_interval)
            notes.append(f"scan_interval {new.scan_interval:g} s")
        if self.server is not None and new.client_timeout != self.cfg.client_timeout:
            self.server.set_client_timeout(new.client_timeout)
            notes.append(f"client_timeout {new.client_timeout:g} s")
        self.cfg.allow_roots, self.cfg.scan_interval = new.allow_roots, new.scan_interval
        self.cfg.client_timeout, self.cfg.retire_grace = new.client_timeout, new.retire_grace
        return notes

    def _retire_finished(self) -> None:
        from hsmon.core.reload import finished_launched

        grace = self.cfg.retire_grace
        watched = set(self.monitor.job_names())
        for name in finished_launched(self.monitor.job_statuses(), set(self.configured), watched,
                                      time.time(), grace):
            if self.monitor.remove_job(name):
                log.info("retired job %s: ended more than %.0f s ago", name, grace)
