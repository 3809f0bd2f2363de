"""The backend interface: token ids in, per-row hidden states out.

A backend owns the target model (in-process, or behind a server). For each row of a batch it
returns the last layer's hidden state after the final norm and the K capture points,
concatenated in order, exactly what the layout contract stores. Capture points are indices into
transformers' ``hidden_states`` tuple: point ``p`` is the residual stream after decoder layer
``p - 1`` (0-based), which is SGLang's aux-hidden-state layer id ``p - 1``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelInfo:
    """Facts about the target that the run records and checks rows against."""

    num_layers: int
    hidden_size: int
    vocab_size: int
    max_positions: int
    dtype: str  # "float32", "bfloat16", ...
    device: str  # "cpu", "cuda:0", ...


class BackendStopped(Exception):
    """A stop was requested while the backend waited (for a server, for room): not an error."""


@dataclass
class RunContext:
    """What a backend that talks to servers needs from the run: the event stream (``pause``,
    ``resume``, ``retry``), the shared counters (``paused``) and the stop request."""

    events: Any
    progress: Any
    stop_event: Any


@dataclass
class RowStates:
    """Hidden states of one row (CPU tensors): ``hidden_state`` [seq, H] after the final norm,
    ``aux_hidden_state`` [seq, K*H] (capture points concatenated in order)."""

    hidden_state: Any
    aux_hidden_state: Any


@dataclass
class RowRejected:
    """A row the backend could not compute while it computes others (a server's refusal, a row
    that fails alone): the run rejects it with ``reason`` and goes on."""

    reason: str


class Backend(ABC):
    """Something that computes hidden states for batches of token-id rows."""

    name: str = "?"
    info: ModelInfo
    capture_points: list[int]

    @abstractmethod
    def extract(self, batch: Sequence[Sequence[int]],
                rows: Sequence[int] | None = None) -> list[RowStates | RowRejected]:
        """Hidden states for each row of ``batch`` (rows may differ in length), or RowRejected for a
        row that fails on its own while the backend demonstrably works for other input. ``rows``
        are the rows' dataset indices, for backends that name their requests or files by row. A
        failure that is not one row's (server down, model broken) raises or waits, as before."""

    def describe(self) -> dict[str, Any]:
        """Backend-specific fields for the run's ``start`` event (e.g. server URLs)."""
        return {}

    def captured(self) -> dict[str, Any]:
        """The manifest ``run`` record's ``captured``: the points the engine really captures (in
        process: transformers' ``hidden_states[p]`` themselves)."""
        return {"points": list(self.capture_points), "engine": self.name}

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release the model or connection."""
