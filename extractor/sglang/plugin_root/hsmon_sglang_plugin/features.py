"""Which capture adapter an SGLang installation gets, from what its code offers (not its version).

Read without importing SGLang (``hsmon sglang-serve`` asks before it launches, in SGLang's
environment: ``python -m hsmon_sglang_plugin.features`` prints one JSON line). The checks and
why they are the ones that matter are in docs/extract.md, "Supported SGLang releases":

- ``sglang/srt/plugins/hook_registry.py``: the hook registry the plugin registers with (0.5.14 on).
  Without it SGLang never loads the plugin: refused, naming the oldest supported release.
- ``last_hidden_states`` in ``sglang/srt/layers/logits_processor.py``: the logits processor keeps the
  last layer beside the captured ones (``--enable-return-aux-hidden-states``, 0.5.23): adapter
  ``aux-return``, SGLang captures everything and the plugin only reads it.
- ``_append_prefill_hidden_states(..., capture_hidden_mode, store)`` in the scheduler's batch-result
  processor: called for every chunked-prefill piece (0.5.18 on). 0.5.14's
  ``_append_prefill_hidden_states(req, logits_output, hidden_state_offset)`` is called for a
  finished prefill only, and the middle pieces of a chunked prefill are dropped before any hook:
  adapter ``whole-prefill``, ``layer-capture`` with chunked prefill off (``--chunked-prefill-size
  -1``, the server refuses to start without it: every prompt is one piece).
- otherwise adapter ``layer-capture``: the plugin turns on the model's own EAGLE-3 layer capture
  (``set_eagle3_layers_to_capture``; forward hooks on the decoder layers for a model class without
  it) and splits the logits processor's input into the captured layers and the last layer.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

OLDEST_SUPPORTED = "0.5.14 (with chunked prefill off; 0.5.18 with it on)"
AUX_RETURN = "aux-return"
LAYER_CAPTURE = "layer-capture"
WHOLE_PREFILL = "whole-prefill"


@dataclass(frozen=True)
class Features:
    sglang_version: str
    hook_registry: bool
    aux_return: bool
    adapter: str | None  # None: this SGLang cannot load the plugin
    refusal: str | None


def _sglang_dir() -> Path | None:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _version(root: Path) -> str:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:  # a source tree without metadata: its version.py
        text = (root / "version.py").read_text() if (root / "version.py").exists() else ""
        for line in text.splitlines():
            if line.startswith("__version__"):
                return line.split("=", 1)[1].strip().strip("\"'")
        return "unknown"


def detect(root: Path | None = None) -> Features:
    """The features of the SGLang at ``root`` (default: the importable one)."""
    root = root if root is not None else _sglang_dir()
    if root is None:
        return Features("none", False, False, None, "no sglang importable in this Python")
    version = _version(root)
    registry = (root / "srt" / "plugins" / "hook_registry.py").is_file()
    logits = root / "srt" / "layers" / "logits_processor.py"
    aux = logits.is_file() and "last_hidden_states" in logits.read_text()
    processor = root / "srt" / "managers" / "scheduler_components" / "batch_result_processor.py"
    match = re.search(r"def _append_prefill_hidden_states\(([^)]*)\)",
                      processor.read_text() if processor.is_file() else "")
    params = match.group(1) if match is not None else ""
    every_piece = "store:" in params and "capture_hidden_mode" in params
    whole = "hidden_state_offset" in params and "logits_output" in params  # 0.5.14: last piece only
    lacks = ("no plugin hook registry (sglang.srt.plugins)" if not registry else
             None if every_piece or whole else "no prefill hidden-state hook")
    if lacks:
        refusal = (f"hsmon capture plugin: SGLang {version} has {lacks}; the oldest supported release is "
                   f"{OLDEST_SUPPORTED}: upgrade SGLang")
        return Features(version, registry, aux, None, refusal)
    adapter = AUX_RETURN if aux else LAYER_CAPTURE if every_piece else WHOLE_PREFILL
    return Features(version, True, aux, adapter, None)


def main() -> int:
    from hsmon_sglang_plugin import TESTED_SGLANG_VERSIONS

    features = detect()
    print(json.dumps({**asdict(features), "tested": features.sglang_version in TESTED_SGLANG_VERSIONS}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
