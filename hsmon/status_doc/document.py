"""The top level of the status document, and its JSON: encode, decode, schema."""

from __future__ import annotations

from typing import Any

import msgspec

from hsmon.status_doc.base import Section
from hsmon.status_doc.engine import GpuSection
from hsmon.status_doc.job import JobStatus

# The schema's major version (docs/status-api.md, "Compatibility"): a field added later is optional
# with a default and does not change it; removing or retyping a field does, and readers refuse a
# document of a major version newer than theirs in one line.
STATUS_VERSION = 1


class FutureVersionError(msgspec.ValidationError):
    """A status document of a major version newer than this reader's."""


class DaemonInfo(Section):
    """The process that answers: the daemon, or ``hsmon status``/the TUI in-process."""

    version: str
    pid: int
    started_ts: float
    source: str  # daemon | inprocess
    scans_total: int
    overflows_total: int
    ticks_total: int
    tick_seconds_last: float
    tracker_errors: dict[str, int]  # tracker -> exceptions it raised


class StatusDocument(Section):
    """``/api/v1/status`` and ``hsmon status --json`` (docs/status-api.md)."""

    v: int
    generated_ts: float
    daemon: DaemonInfo
    jobs: list[JobStatus]
    gpus: GpuSection


class _Versioned(msgspec.Struct):
    v: int


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(StatusDocument)
_version_decoder = msgspec.json.Decoder(_Versioned)


def encode(doc: StatusDocument) -> bytes:
    """The document as JSON (NaN and infinities become null: the JSON stays valid)."""
    return _encoder.encode(doc)


def check_version(v: object) -> None:
    """Refuse (one line) a document of a major version newer than this reader's."""
    if isinstance(v, int) and v > STATUS_VERSION:
        raise FutureVersionError(
            f"status document v{v} is newer than this hsmon reads (v{STATUS_VERSION} and older): "
            "upgrade hsmon where you read it"
        )


def decode(data: bytes | str) -> StatusDocument:
    """A JSON status document as types; raises ``msgspec.ValidationError`` naming the bad field, or
    ``FutureVersionError`` for a newer major version. Fields it does not know are ignored; fields
    added after v1 are optional (docs/status-api.md, "Compatibility")."""
    try:
        version = _version_decoder.decode(data).v
    except msgspec.DecodeError:
        version = None  # the full decoding names what is wrong
    check_version(version)
    return _decoder.decode(data)


def to_builtins(value: Any) -> Any:
    """The document (or any section) as plain dicts and lists, as its JSON would parse."""
    return msgspec.to_builtins(value)


def from_builtins(value: Any, type_: type = StatusDocument) -> Any:
    """A parsed JSON document (or section of ``type_``) as types."""
    if type_ is StatusDocument and isinstance(value, dict):
        check_version(value.get("v"))
    return msgspec.convert(value, type_)


def schema() -> dict[str, Any]:
    """The JSON Schema of the status document (docs/status-schema.json)."""
    out = msgspec.json.schema(StatusDocument)
    out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out["title"] = "hsmon status document (/api/v1/status, hsmon status --json)"
    return out
