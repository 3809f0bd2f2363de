"""A drafter exported for one engine and served by the other (docs/vllm.md): `hsmon vllm-serve --draft`
and `hsmon sglang-serve --draft` serve it from a converted copy with the serving engine's ids, never
one layer off; ids the serving engine cannot express are refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from drafter_exports import REFERENCE, TARGET, export_for

from extractor.drafter_ids import DrafterIdsError, for_engine


def ids_of(directory: Path) -> list[int]:
    config = json.loads((directory / "config.json").read_text())
    return config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]


def test_an_export_for_sglang_is_served_by_vllm_with_vllms_ids(tmp_path):
    export = export_for("sglang", tmp_path / "for-sglang")
    assert ids_of(export) == [1, 3, 4]
    served, note = for_engine(export, "vllm", TARGET)
    assert served != export and ids_of(served) == [2, 4, 5]  # the points it was trained on, by vLLM's rule
    record = json.loads((served / "config.json").read_text())["hsmon_capture"]
    assert record["engine"] == "vllm" and record["converted_from"]["engine"] == "sglang"
    assert (served / "model.safetensors").resolve() == (REFERENCE / "model.safetensors").resolve()
    assert note and "exported for sglang (layer ids [1, 3, 4]); served by vllm with ids [2, 4, 5]" in note
    assert for_engine(export, "sglang", TARGET) == (export, None)  # its own engine: as it is
    shutil.rmtree(served)


def test_an_export_for_vllm_is_served_by_sglang_with_sglangs_ids(tmp_path):
    export = export_for("vllm", tmp_path / "for-vllm")
    assert ids_of(export) == [2, 4, 5]
    served, _ = for_engine(export, "sglang", TARGET)
    assert ids_of(served) == [1, 3, 4]
    assert for_engine(export, "vllm", TARGET) == (export, None)
    shutil.rmtree(served)


def test_points_vllm_cannot_capture_in_order_are_refused_in_one_line(tmp_path):
    export = export_for("sglang", tmp_path / "unordered", aux_ids=(4, 1, 3))  # trained on points 5,2,4
    with pytest.raises(DrafterIdsError, match=r"vllm cannot capture them: .*ascending.*hsmon export-drafter"):
        for_engine(export, "vllm", TARGET)


def test_a_drafter_without_a_record_is_served_as_it_is_with_a_line(tmp_path):
    served, note = for_engine(REFERENCE, "vllm", TARGET)
    assert served == REFERENCE and "no hsmon_capture record" in note and "taken as vllm's" in note
