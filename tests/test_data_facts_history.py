"""The per-layer history of chunk norms in ``output.data`` (the TUI's data sparkline): bounded, in
the order the chunks completed, kept as chunk records are read (nothing re-read)."""

from __future__ import annotations

from hsmon.contracts.data_facts import HISTORY_CHUNKS, DataFacts


def chunk(index: int, norm: float) -> dict:
    stats = {layer: {"mean_l2": norm + shift, "std": 1.0, "max_abs": 3.0, "nonfinite": 0}
             for layer, shift in (("final", 0.0), ("2", 100.0))}
    return {"type": "chunk", "chunk": f"rows_{index * 10}-{index * 10 + 10}", "rows": 10, "stats": stats}


def row(index: int) -> dict:
    return {"type": "row", "row": index, "stats": {"final": [4, 40.0, 8, 0.0, 8.0, 2.0, 0],
                                                   "2": [4, 40.0, 8, 0.0, 8.0, 2.0, 0]}}


def test_history_keeps_the_newest_chunks_of_each_layer_in_order() -> None:
    facts = DataFacts()
    facts.add(row(0))
    assert facts.snapshot()["layers"]["final"]["history"] == []  # no chunk yet
    for index in range(HISTORY_CHUNKS + 8):
        facts.add(chunk(index, float(index)))
    facts.add(chunk(3, 999.0))  # a chunk record read twice counts once
    layers = facts.snapshot()["layers"]
    assert layers["final"]["history"] == [float(i) for i in range(8, HISTORY_CHUNKS + 8)]
    assert layers["2"]["history"] == [100.0 + i for i in range(8, HISTORY_CHUNKS + 8)]
    assert HISTORY_CHUNKS == 32
