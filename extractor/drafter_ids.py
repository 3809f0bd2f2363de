"""A drafter export served by an engine: its layer ids in that engine's convention, converted when the
export was written for the other engine (``hsmon_capture.engine``), never fed one layer off.

`hsmon vllm-serve --draft` and `hsmon sglang-serve --draft` call ``for_engine``: an export for the
serving engine is served as it is; one for the other engine is served from a converted copy (its
config.json with the ids the serving engine needs for the recorded points, the weights linked),
which is removed when the server ends; a drafter with no record (not an hsmon export) is served as
it is, with a line saying its ids are taken as that engine's.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path

from hsmon.contracts.engines import capture_record, record_engine


class DrafterIdsError(ValueError):
    """The export's recorded points cannot be captured by the serving engine: one line."""


def _target_class(target: Path) -> tuple[str, int]:
    config = json.loads((target / "config.json").read_text())
    arch = str((config.get("architectures") or ["LlamaForCausalLM"])[0])
    return arch, int(config.get("text_config", config).get("num_hidden_layers", 0))


def for_engine(draft: Path, engine: str, target: Path) -> tuple[Path, str | None]:
    """(the directory to serve, a line to print or None) for ``draft`` served by ``engine`` on ``target``."""
    config = json.loads((draft / "config.json").read_text())
    record = config.get("hsmon_capture")
    if not isinstance(record, dict) or "capture_points" not in record:
        return draft, (
            f"--draft {draft}: no hsmon_capture record in its config.json; its "
            f"eagle_aux_hidden_state_layer_ids are taken as {engine}'s (an hsmon export records them)"
        )
    if record_engine(record) == engine:
        return draft, None
    arch, num_layers = _target_class(target)
    points = [int(p) for p in record["capture_points"]]
    try:
        new = capture_record(points, engine, arch, num_layers)
    except ValueError as exc:
        raise DrafterIdsError(
            f"--draft {draft}: exported for {record_engine(record)} (points {points}); "
            f"{engine} cannot capture them: {exc}; export it again with "
            f"hsmon export-drafter --engine {engine}"
        ) from None
    config.setdefault("eagle_config", {})["eagle_aux_hidden_state_layer_ids"] = new["layer_ids"]
    if "eagle_aux_hidden_state_layer_ids" in config:
        config["eagle_aux_hidden_state_layer_ids"] = new["layer_ids"]
    config["hsmon_capture"] = {**new, "converted_from": record}
    copy = Path(tempfile.mkdtemp(prefix=f"hsmon-draft-{engine}-"))
    atexit.register(shutil.rmtree, copy, True)
    for entry in draft.iterdir():
        if entry.name != "config.json":
            os.symlink(entry.resolve(), copy / entry.name)
    (copy / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    was = record.get("layer_ids")
    return copy, (
        f"--draft {draft}: exported for {record_engine(record)} (layer ids {was}); served by "
        f"{engine} with ids {new['layer_ids']} for the points it was trained on, {points} "
        f"(a converted copy in {copy})"
    )
