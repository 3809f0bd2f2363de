"""The status document (docs/status-api.md) as types: what the monitor knows, in one shape.

``hsmon.core.monitor.Monitor.status()`` builds a :class:`StatusDocument` once per request from the jobs'
:class:`JobStatus` (each built in one step per tick by ``hsmon.core.job_runtime.JobRuntime``); the HTTP
API and ``hsmon status --json`` encode it with :func:`encode`; readers that get it as JSON decode
it with :func:`decode`, in process they read the types. ``python -m hsmon.status_doc --schema``
prints the JSON Schema kept in docs/status-schema.json (checked by tests/test_status_doc.py).

The sections live in ``job.py`` (a job's own figures), ``output.py`` (the output directory and its
data facts), ``engine.py`` (servers and GPUs) and ``document.py`` (the top level).
"""

from __future__ import annotations

from hsmon.status_doc.document import (
    STATUS_VERSION,
    DaemonInfo,
    StatusDocument,
    decode,
    encode,
    from_builtins,
    schema,
    to_builtins,
)
from hsmon.status_doc.engine import (
    Capture,
    GpuDevice,
    GpuProcess,
    GpuSection,
    Health,
    Load,
    ServerEntry,
    ServerInfo,
    Speculative,
)
from hsmon.status_doc.job import (
    ENDED_STATES,
    DiskEntry,
    DumpSection,
    EventsSection,
    Hint,
    JobGpu,
    JobStatus,
    LogFile,
    ProcessEntry,
    Progress,
    StateEvent,
    TrainingSection,
    logs_of,
)
from hsmon.status_doc.online import OnlineSection, OnlineSide, online_of
from hsmon.status_doc.output import (
    ChunkStats,
    DataSection,
    DriftEntry,
    LayerReference,
    LayerStats,
    OutputSection,
    Reading,
    VerifySection,
)
from hsmon.status_doc.regenerate import RegenerateSection, regenerate_of

__all__ = [
    "ENDED_STATES", "STATUS_VERSION", "Capture", "ChunkStats", "DaemonInfo", "DataSection", "DiskEntry",
    "DriftEntry", "DumpSection", "EventsSection", "GpuDevice", "GpuProcess", "GpuSection", "Health", "Hint",
    "JobGpu", "JobStatus", "LayerReference", "LayerStats", "Load", "LogFile", "OnlineSection", "OnlineSide",
    "OutputSection", "ProcessEntry",
    "Progress", "Reading", "RegenerateSection", "ServerEntry", "ServerInfo", "Speculative", "StateEvent",
    "StatusDocument",
    "TrainingSection", "VerifySection", "decode", "encode", "from_builtins", "logs_of", "online_of",
    "regenerate_of", "schema", "to_builtins",
]
