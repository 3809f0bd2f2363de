"""`hsmon daemon`'s reload: SIGHUP (`systemctl reload hsmon-daemon`, the unit's ExecReload) reads the
configuration again and applies it without a restart (the plan: hsmon/core/reload.py)."""

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

log = logging.getLogger("hsmon.daemon")


class Reloader:
    """SIGHUP (`systemctl reload hsmon-daemon`): the configuration read again and applied without a
    restart (hsmon/core/reload.py); a configuration with an error is refused in one log line and
    the running jobs go on. Also retires the trainings it launched once they ended ``retire_grace``
    ago."""

    def __init__(self, read_config: Callable[[], cfgmod.DaemonConfig], cfg: cfgmod.DaemonConfig,
                 monitor: Any, stopping: threading.Event) -> None:
        self.read_config, self.cfg, self.monitor, self.stopping = read_config, cfg, monitor, stopping
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
        except cfgmod.ConfigError as exc:
            log.error("reload refused: %s; the %d jobs watched go on unchanged", exc, len(self.configured))
            return
        fixed = [k for k in ("host", "port", "tls_cert", "tls_key", "control_token_file")
                 if getattr(new, k) != getattr(self.cfg, k)]
        if fixed:
            log.warning("reload: %s changed, which takes a restart; the rest is applied", ", ".join(fixed))
        plan = plan_reload(self.configured, new.jobs)
        apply_reload(self.monitor, plan, new.retire_grace)
        if plan.add or plan.change or plan.remove:
            # the removed jobs' objects collected here, not by a full collection that a later
            # scrape's allocations would trigger (~13 ms with 20 jobs); then /metrics is rendered
            # for the new set (a scrape after a reload sends it rather than render itself)
            gc.collect()
            self.monitor.jobs_changed()
        self.configured = {job.name: job for job in new.jobs}
        self.cfg.retire_grace = new.retire_grace
        log.info("reloaded in %.3f s: %s", time.perf_counter() - started, plan.summary())

    def _retire_finished(self) -> None:
        from hsmon.core.reload import finished_launched

        grace = self.cfg.retire_grace
        watched = set(self.monitor.job_names())
        for name in finished_launched(self.monitor.job_statuses(), set(self.configured), watched,
                                      time.time(), grace):
            if self.monitor.remove_job(name):
                log.info("retired job %s: ended more than %.0f s ago", name, grace)
