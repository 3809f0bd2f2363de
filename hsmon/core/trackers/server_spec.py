"""A speculative server's figures (pure but for reading the drafter's config.json): SGLang's
acceptance from its ``/metrics`` families (``sglang:spec_accept_length``, ``sglang:spec_accept_rate``,
``sglang:spec_verify_calls_total``, with --enable-metrics; parsed with the load, server_rules.py) and
``/server_info``
(``avg_spec_accept_length``, the drafter and its depth), and the drafter's training-time estimate
at that depth (its export's ``hsmon_estimate``, when the daemon can read the drafter's directory).
The server tracker (server.py) reads them; ``Speculative`` is the server entry's section."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hsmon.status_doc import Speculative


def spec_info(data: dict[str, Any]) -> dict[str, Any] | None:
    """What ``/server_info`` says of speculative decoding; None for a server that does not draft
    (no draft model: a capture server names EAGLE3 only to pick its capture convention)."""
    draft = data.get("speculative_draft_model_path")
    if not isinstance(draft, str) or not draft:
        return None
    states = data.get("internal_states")
    first = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    average = first.get("avg_spec_accept_length")
    return {
        "algorithm": _of(data.get("speculative_algorithm"), str),
        "draft_model": draft,
        "depth": _of(data.get("speculative_num_steps"), int),
        "draft_tokens": _of(data.get("speculative_num_draft_tokens"), int),
        "topk": _of(data.get("speculative_eagle_topk"), int),
        "avg_accept_length": float(average) if _number(average) else None,
    }


def drafter_estimate(draft_model: str, depth: int | None) -> tuple[float | None, str | None]:
    """The drafter's recorded training-time acceptance length at ``depth`` and where it came from;
    (None, why) when its directory cannot be read here (a remote server) or records none."""
    config = Path(draft_model) / "config.json"
    try:
        estimate = json.loads(config.read_text()).get("hsmon_estimate") or {}
    except (OSError, ValueError, AttributeError):
        return None, f"{config} is not readable here"
    value = (estimate.get("accept_length") or {}).get(str(depth)) if depth else None
    if not _number(value):
        return None, f"{config} records no estimate at depth {depth} (an export of hsmon export-drafter does)"
    return float(value), f"{config}: {estimate.get('source') or 'hsmon_estimate'}"


def speculative_of(info: dict[str, Any] | None, load: dict[str, float],
                   estimate: tuple[float | None, str | None]) -> Speculative | None:
    """The server entry's ``speculative`` section; None for a server that does not draft."""
    if info is None:
        return None
    length, rate = load.get("spec_accept_length"), load.get("spec_accept_rate")
    average = info.get("avg_accept_length")
    drafts, accepted = load.get("spec_verify_calls_total"), load.get("spec_accepted_tokens_total")
    if accepted is not None and drafts:  # vLLM: counters since start (no window gauges)
        average = 1 + accepted / drafts
        rate = accepted / load["spec_draft_tokens_total"] if load.get("spec_draft_tokens_total") else None
    return Speculative(
        algorithm=info.get("algorithm"), draft_model=info.get("draft_model"), depth=info.get("depth"),
        draft_tokens=info.get("draft_tokens"), topk=info.get("topk"),
        # SGLang's gauges read 0 until its first decode window is logged: no figure yet
        accept_length=length if length else None,
        accept_rate=rate if length or accepted is not None else None,
        verify_calls_total=load.get("spec_verify_calls_total"),
        generated_tokens_total=load.get("generation_tokens_total"),
        avg_accept_length=average,
        estimate=estimate[0], estimate_source=estimate[1],
    )


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _of(value: Any, kind: type) -> Any:
    if kind is int:
        return value if type(value) is int else None
    return value if isinstance(value, kind) else None
