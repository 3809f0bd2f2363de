"""Complete a test's partial status document into one that decodes as a ``StatusDocument``.

The TUI's tests write only the figures their screens show; the dashboard now receives the typed
document (hsmon/status_doc), whose fields are all required. ``complete`` adds every field a test
left out, as a tracker reports a figure it has not measured: null where the type allows it, else
an empty list/map, zero, false or an empty string; a missing ``gpus`` section reads as not
watched. The figures the test gave are kept as they are.
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec

from hsmon.status_doc import JobStatus, StatusDocument, from_builtins
from hsmon.tui.sources import FixedSource

_I = msgspec.inspect
_EMPTY: dict[type, Any] = {_I.IntType: 0, _I.FloatType: 0.0, _I.StrType: "", _I.BoolType: False}


def complete(document: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``document`` with every field it lacks (see the module docstring)."""
    out = copy.deepcopy(document)
    out.setdefault("gpus", {"available": False, "reason": None, "last_poll_ts": None, "devices": []})
    _fill(out, _I.type_info(StatusDocument))
    return out


def _neutral(tp: Any) -> Any:
    if isinstance(tp, _I.UnionType) and any(isinstance(t, _I.NoneType) for t in tp.types):
        return None
    if isinstance(tp, _I.ListType):
        return []
    if isinstance(tp, _I.DictType):
        return {}
    if isinstance(tp, _I.StructType):
        return _fill({}, tp)
    return _EMPTY.get(type(tp))


def _wants_int(tp: Any) -> bool:
    options = tp.types if isinstance(tp, _I.UnionType) else (tp,)
    kinds = {type(t) for t in options}
    return _I.IntType in kinds and _I.FloatType not in kinds


def _fill(value: Any, tp: Any) -> Any:
    """``value`` completed; a whole float where the type wants an int (``2.2e11`` bytes) as that int."""
    if isinstance(value, float) and value.is_integer() and _wants_int(tp):
        return int(value)
    if isinstance(tp, _I.UnionType):
        for option in tp.types:
            if isinstance(option, (_I.StructType, _I.ListType)):
                _fill(value, option)
    elif isinstance(tp, _I.StructType) and isinstance(value, dict):
        for f in tp.fields:
            if f.name in value and value[f.name] is None and not f.required and _neutral(f.type) is not None:
                del value[f.name]  # a figure the trainer did not send (``eval``: null) is left out
            elif f.name in value:
                value[f.name] = _fill(value[f.name], f.type)
            elif f.required:
                value[f.name] = _neutral(f.type)
    elif isinstance(tp, _I.ListType) and isinstance(value, list):
        value[:] = [_fill(item, tp.item_type) for item in value]
    return value


def fixed_source(documents: list[dict[str, Any]], **kwargs: Any) -> FixedSource:
    """A ``FixedSource`` of the test's documents, each completed first."""
    return FixedSource([complete(document) for document in documents], **kwargs)


def typed(document: dict[str, Any]) -> StatusDocument:
    """The test's document, completed, as the typed document a source delivers."""
    return from_builtins(complete(document))


def typed_job(job: dict[str, Any]) -> JobStatus:
    """One job of a test's document, completed, as its typed section."""
    return typed({"v": 1, "generated_ts": 0.0, "daemon": {}, "jobs": [job]}).jobs[0]


def shown_ts(app: Any, source_id: int = 0) -> float | None:
    """The ``generated_ts`` of the newest document the app received from a source."""
    document = app.documents.get(source_id)
    return None if document is None else document.generated_ts


def typed_as(value: dict[str, Any], type_: type) -> Any:
    """A section of a test's document (``type_``: e.g. ``GpuSection``), completed, as that type."""
    return from_builtins(_fill(copy.deepcopy(value), _I.type_info(type_)), type_)
