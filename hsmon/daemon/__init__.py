"""`hsmon daemon`: watch jobs; serve /metrics, /api/v1/status and /healthz, and the control API.

    cli.py            the flags, the configuration, the run (start-up, signals, shutdown)
    api.py            the HTTP endpoints and the token-guarded control
    http_pool.py      the HTTP server: a fixed pool of handler threads behind one reader
    security.py       TLS, the token file, the allowed roots, who sees command lines
    reload.py         SIGHUP: what a reload applies
    notify.py         webhooks on state transitions (Slack, generic JSON), retried, never blocking a tick
    memory_trim.py    glibc's free heap pages given back every 5 minutes
    scrape_latency.py a scrape not held behind a tick (GIL switch interval, frozen start-up objects)
    process.py        `hsmon daemon` started as a child process, its URL once it listens
"""

from hsmon.daemon.cli import add_arguments, build_config, run
from hsmon.daemon.process import DaemonStartError, spawn

__all__ = ["DaemonStartError", "add_arguments", "build_config", "run", "spawn"]
