"""Writes docs/reference/config.md: every key of the daemon's TOML configuration, from the code that reads it.

usage: python scripts/config_reference.py [--check]
(--check: exit 1 when the committed page differs from what the code says; tests/test_docs_site.py runs
it). The keys, their types and defaults come from hsmon/core/config.py and hsmon/core/verify_watch.py
(the key sets `load_toml` accepts and the dataclasses it fills); each key's meaning is written in
MEANINGS below, and a key the code reads without a meaning here (or a meaning for a key it no longer
reads) fails the script with one line naming the key. The page is generated, never edited by hand.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hsmon.core import config, verify_watch  # noqa: E402

PAGE = ROOT / "docs" / "reference" / "config.md"
HEADER = """# Configuration reference

Every key of a `hsmon.toml` (`hsmon daemon --config FILE`, `hsmon status --config FILE`, `hsmon tui
--config FILE`), generated from the code that reads it (`python scripts/config_reference.py`; a test
fails when this page and the code differ). A key the daemon does not know is refused with one line
naming it and the known keys. An example file, and what a reload (`kill -HUP`) does with each key:
[Several jobs](../daemon.md#several-jobs-config-hsmontoml). Command-line flags add one more job and
override `[daemon]` keys ([command line](../reference/cli.md#hsmon-daemon)).
"""

# Meaning of each key, per table. Types and defaults are read from the code; only the words live here.
MEANINGS: dict[str, dict[str, str]] = {
    "daemon": {
        "host": "address the HTTP API listens on (off the machine: TLS, a token and roots, "
                "[production guide](../operations.md))",
        "port": "port of the HTTP API (0: any free port)",
        "scan_interval": "seconds between two ticks of the monitor (reading every tracker)",
        "notify_webhook": "URL that state transitions are posted to (none: nothing is sent)",
        "notify_format": "body of a notification: `json`, or `slack` for a Slack-style text message",
        "notify_repeat": "seconds after which a state that still pages is sent again",
        "control_token_file": "file holding the bearer token of the control endpoints (none: they are off)",
        "tls_cert": "PEM certificate: the API is served over TLS (with `tls_key`)",
        "tls_key": "PEM private key of `tls_cert`",
        "allow_roots": "directories launched trainings may read and write (`POST /api/v1/train`)",
        "retire_grace": "seconds a removed or finished launched job stays readable in the status and metrics",
        "client_timeout": "seconds an idle HTTP connection to the daemon stays open",
    },
    "job": {
        "name": "the job's name: 1-64 letters, digits, `_ . : -`; unique in the file "
                "(default job1, job2, ...)",
        "kind": "`extract`, `train` or `external`; without it a job's start event says which",
        "dump_dir": "directory of the server's hidden-state dumps (its files, bytes and age are watched)",
        "out_dir": "the job's output directory (chunks, manifests, free disk)",
        "events": "the job's events file (JSON lines: start, progress, end)",
        "pid": "the job's main process, by PID (one of `pid`, `pidfile`, `match`)",
        "pidfile": "the job's main process, by a file holding its PID",
        "match": "the job's main process, by a regular expression over command lines",
        "role": "role of that main process: `extractor`, `server` or `trainer` (default from `kind`)",
        "stall_after": "seconds without progress after which a running job is stalled",
        "shm_dir": "shared-memory directory whose free space is watched",
        "rows_total": "rows the job will write, when no event says it (ETA and disk need)",
        "needed_bytes": "the job's own estimate of the bytes it still writes",
        "server_interval": "seconds between looks at a server's liveness and load "
                           "(`/metrics`, `/model_info`)",
        "health_interval": "seconds between real forwards on a server (`/health_generate`)",
        "health_timeout": "seconds with no forward completed (checks unanswered) before a server is hung",
        "busy_after": "a health forward slower than this many seconds: the server is busy",
        "verify_every": "the engine check: after every N complete chunks, re-extract rows of the newest one "
                        "and compare (needs `verify_against` and `out_dir`)",
        "verify_against": "what the check compares with: `http://HOST:PORT` of an SGLang server, or `hf`",
        "verify_model": "model directory for `hf` (default: the one the data was made with)",
        "verify_sample": "rows of the newest chunk per check",
        "verify_budget": "seconds before a check is killed (verdict `timeout`)",
    },
    "job.process": {
        "role": "`extractor`, `server` or `trainer`",
        "pid": "the process, by PID (one of `pid`, `pidfile`, `match`)",
        "pidfile": "the process, by a file holding its PID",
        "match": "the process, by a regular expression over command lines",
    },
    "job.server": {
        "url": "`http://HOST:PORT` of an inference server the job talks to (required; unique in the job)",
        "interval": "seconds between looks at its liveness and load (default: the job's `server_interval`)",
        "health_interval": "seconds between real forwards (default: the job's `health_interval`)",
        "health_timeout": "seconds with no forward completed before it is hung (default: the job's)",
        "busy_after": "a health forward slower than this: busy (default: the job's `busy_after`)",
    },
}

TITLES = {
    "daemon": "`[daemon]`: the daemon itself",
    "job": "`[[job]]`: one watched job (repeatable)",
    "job.process": "`[[job.process]]`: more processes of a job, each with a role (repeatable)",
    "job.server": "`[[job.server]]`: inference servers a job talks to (repeatable)",
}


def keys_read() -> dict[str, list[tuple[str, dataclasses.Field]]]:
    """Each table's keys, in the order of the dataclass that holds them, with that dataclass field."""
    def fields(cls: type, keys: set[str], prefix: str = "") -> list[tuple[str, dataclasses.Field]]:
        found = [(prefix + f.name, f) for f in dataclasses.fields(cls) if prefix + f.name in keys]
        missing = keys - {name for name, _ in found}
        if missing:
            raise SystemExit(f"{cls.__name__} has no field for the keys {sorted(missing)}: "
                             "update scripts/config_reference.py")
        return found

    process_keys = {f.name for f in dataclasses.fields(config.ProcessSpec)}
    return {
        "daemon": fields(config.DaemonConfig, config.DAEMON_KEYS),
        "job": fields(config.JobConfig, config._JOB_KEYS)
        + fields(verify_watch.VerifySpec, verify_watch.VERIFY_KEYS, "verify_"),
        "job.process": fields(config.ProcessSpec, process_keys),
        "job.server": fields(config.ServerSpec, config._SERVER_KEYS),
    }


def default_text(name: str, field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        return "none" if field.default is None else f"`{field.default!r}`".replace("'", '"')
    if field.default_factory is not dataclasses.MISSING:
        return f"`{field.default_factory()!r}`"
    return "none: no check" if name.startswith("verify_") else "required"


def table_section(table: str, keys: list[tuple[str, dataclasses.Field]]) -> list[str]:
    meanings = MEANINGS[table]
    names = [name for name, _ in keys]
    if set(names) != set(meanings):
        raise SystemExit(
            f"[{table}]: keys read by the code {sorted(set(names) - set(meanings))} have no meaning, "
            f"meanings {sorted(set(meanings) - set(names))} have no key: update MEANINGS in "
            "scripts/config_reference.py")
    lines = [f"## {TITLES[table]}", "", "| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for name, field in keys:
        kind = str(field.type).replace("|", "or")
        lines.append(f"| `{name}` | {kind} | {default_text(name, field)} | {meanings[name]} |")
    return [*lines, ""]


def render() -> str:
    lines = [HEADER]
    for table, keys in keys_read().items():
        lines += table_section(table, keys)
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    from generated_page import write_or_check  # beside this file

    return write_or_check(PAGE, render(), "code", "scripts/config_reference.py")

if __name__ == "__main__":
    raise SystemExit(main())
