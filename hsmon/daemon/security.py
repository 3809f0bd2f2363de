"""What makes the daemon's API safe to expose beyond loopback: TLS, a token file only its owner
reads, the allowed roots (checked on each launch by hsmon/launch/paths.py), command lines only
for authorised callers.

    ctx = tls_context(cert, key)                      # None without TLS; ConfigError in one line
    check_token_file(path)                            # ConfigError when group/others may read it
    doc = without_cmdlines(doc)                       # for a caller that is not authorised

docs/operations.md "Security" says what is exposed, to whom, and how to run it behind a proxy.
"""

from __future__ import annotations

import os
import ssl
import stat
import urllib.parse
from collections.abc import Iterable

import msgspec

from hsmon.core.config import ConfigError
from hsmon.status.client import is_loopback
from hsmon.status_doc import StatusDocument

REDACTED = "(hidden: send the control token to see command lines)"
MIN_TOKEN = 16


def tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """A server TLS context from a certificate chain and its key (PEM), or None without TLS."""
    if not cert and not key:
        return None
    if not cert or not key:
        raise ConfigError("TLS needs both --tls-cert FILE and --tls-key FILE (PEM)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc)
        raise ConfigError(f"--tls-cert {cert} / --tls-key {key}: cannot load them ({reason}); give a PEM "
                          "certificate and its private key") from None
    return ctx


def check_token_file(path: str) -> None:
    """Refuse a control-token file that its group or others may read (the token is a password)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # read_control_token says why in its own line
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"--control-token-file {path}: mode {stat.S_IMODE(mode):04o} lets group or others "
                          f"read the token; run chmod 600 {path}")


def redact_url(url: str) -> str:
    """A webhook URL as the log may show it: scheme and host only (its path, query and any
    credentials are the secret: a Slack or Teams hook is a bearer token in its path)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or "?"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}/(redacted)"


def read_control_token(path: str | None) -> str | None:
    """The control token from a file (first line) or env HSMON_CONTROL_TOKEN; None: control is off."""
    token = None
    if path:
        try:
            with open(path) as fh:
                token = fh.readline().strip()
        except OSError as exc:
            raise ConfigError(
                f"--control-token-file {path}: {exc.strerror}; give a readable file"
            ) from None
        if len(token) < MIN_TOKEN:
            raise ConfigError(f"--control-token-file {path}: the token must be at least {MIN_TOKEN} "
                                     "characters")
        check_token_file(path)
    elif os.environ.get("HSMON_CONTROL_TOKEN"):
        token = os.environ["HSMON_CONTROL_TOKEN"].strip()
        if len(token) < MIN_TOKEN:
            raise ConfigError(
                f"HSMON_CONTROL_TOKEN: the token must be at least {MIN_TOKEN} characters; give a longer one")
    return token or None


def check_exposure(host: str, token: str | None, roots: list[str]) -> None:
    """A control API on a non-loopback address must be limited to allowed roots."""
    if token is not None and not roots and not is_loopback(host):
        raise ConfigError(f"--host {host}: the control API (a token is set) listens beyond this machine: "
                          "give --allow-root DIR (repeatable; TOML allow_roots) to limit where trainings may "
                          "read and write, or bind 127.0.0.1")


def resolved_roots(roots: Iterable[str]) -> list[str]:
    out = []
    for root in roots:
        if not isinstance(root, str) or not root or not os.path.isabs(root):
            raise ConfigError(f"--allow-root {root!r}: give an absolute directory")
        out.append(os.path.realpath(root))
    return out


def without_cmdlines(doc: StatusDocument) -> StatusDocument:
    """The document with every process's command line replaced by a note (a copy)."""
    jobs = []
    for job in doc.jobs:
        if not any(p.cmdline for p in job.processes):
            jobs.append(job)
            continue
        procs = [msgspec.structs.replace(p, cmdline=REDACTED) if p.cmdline else p for p in job.processes]
        jobs.append(msgspec.structs.replace(job, processes=procs))
    return msgspec.structs.replace(doc, jobs=jobs)
