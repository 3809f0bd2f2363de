"""Why rows were rejected, in a few classes a person (and a metric label) can read.

The reason written to ``rejects.jsonl`` is the full message (the server's own words, the
exception); the class is derived from it here, so the extractor, the monitor and the exporter
agree, and an old manifest's reasons are classed the same way. Light: no torch, no extractor.
"""

from __future__ import annotations

# class -> what a person reads after "N rows ..."; the order is the order of a summary
REASON_TEXT = {
    "too_long": "longer than --max-length (--no-truncate)",
    "out_of_vocabulary": "with a token id outside the vocabulary",
    "invalid_row": "not valid (JSON, fields, roles, loss mask)",
    "server_too_long": "refused by the server: input longer than context",
    "server_refused": "refused by the server (HTTP 4xx)",
    "server_failing": "failed on the server again and again while other rows succeeded",
    "out_of_memory": "out of memory even alone",
    "backend_error": "on which the model failed even alone",
    "truncated": "whose regenerated answer was cut at --max-new-tokens (--truncated reject)",
}
# the same, in a few words (a dashboard's subtitle)
REASON_SHORT = {
    "too_long": "too long", "out_of_vocabulary": "vocabulary", "invalid_row": "invalid",
    "server_too_long": "server: too long", "server_refused": "server refused",
    "server_failing": "server failing", "out_of_memory": "out of memory", "backend_error": "model error",
    "truncated": "cut answer",
}
# prefixes the extractor writes before the server's or the model's own message
SERVER_REFUSED = "refused by the server"
SERVER_FAILING = "failed on the server"
BACKEND_FAILED = "the model failed on this row alone"
TRUNCATED = "answer cut at --max-new-tokens"  # hsmon regenerate --truncated reject
_TOO_LONG_WORDS = ("context length", "maximum allowed length", "longer than", "too long", "exceeds")


def classify(reason: str) -> str:
    """The class of a reject reason (one of REASON_TEXT's keys)."""
    text = reason.lower()
    if text.startswith(SERVER_REFUSED):
        return "server_too_long" if any(w in text for w in _TOO_LONG_WORDS) else "server_refused"
    if text.startswith(SERVER_FAILING):
        return "server_failing"
    if text.startswith(BACKEND_FAILED):
        return "out_of_memory" if "out of memory" in text else "backend_error"
    if text.startswith(TRUNCATED):
        return "truncated"
    if text.startswith("too long"):
        return "too_long"
    if "outside the vocabulary" in text:
        return "out_of_vocabulary"
    return "invalid_row"


def count_by_class(reasons: list[str] | tuple[str, ...]) -> dict[str, int]:
    """{class: rows} of some reject reasons, in REASON_TEXT's order."""
    counts: dict[str, int] = {}
    for reason in reasons:
        key = classify(reason)
        counts[key] = counts.get(key, 0) + 1
    return {k: counts[k] for k in REASON_TEXT if k in counts}


def summary(by_class: dict[str, int] | None) -> str:
    """'3 rows refused by the server: input longer than context; 1 row with a token id outside
    the vocabulary' ('' when nothing was rejected)."""
    parts = []
    for key, n in (by_class or {}).items():
        if n:
            parts.append(f"{n} row{'s' if n != 1 else ''} {REASON_TEXT.get(key, key)}")
    return "; ".join(parts)


def short_summary(by_class: dict[str, int] | None) -> str:
    """'2 server: too long, 1 vocabulary' ('' when nothing was rejected)."""
    return ", ".join(f"{n} {REASON_SHORT.get(k, k)}" for k, n in (by_class or {}).items() if n)


def clean_counts(value: object) -> dict[str, int] | None:
    """A ``rejects_by_reason`` field read from an event or a record: {class: count}, or None when
    it is not one (a few keys at most, so that a strange writer cannot flood a metric)."""
    if not isinstance(value, dict):
        return None
    out = {}
    for key, n in list(value.items())[:16]:
        count_ok = isinstance(n, int) and not isinstance(n, bool) and n >= 0
        if isinstance(key, str) and len(key) <= 40 and count_ok:
            out[key] = n
    return out
