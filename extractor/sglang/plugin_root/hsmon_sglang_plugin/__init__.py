"""hsmon's capture plugin for SGLang, loaded through the ``sglang.srt.plugins`` entry point group.

It lives in SGLang's environment, not hsmon's: it imports only what SGLang has (torch,
safetensors) and never hsmon. It is found through ``PYTHONPATH``: the directory that holds this
package also holds ``hsmon_sglang_plugin-1.dist-info/entry_points.txt``, which
``importlib.metadata`` finds on ``sys.path`` (``hsmon sglang-serve`` sets this up).

Requests opt in through ``sampling_params.custom_params["hsmon"]`` (see ``capture.py`` and
docs/extract.md, "SGLang server side"); all other traffic is stock SGLang.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

PLUGIN_VERSION = "1"
# The releases the conformance tests run on (make test-sglang-matrix; docs/extract.md's table).
TESTED_SGLANG_VERSIONS = ("0.5.14", "0.5.18", "0.5.22", "0.5.23")  # 0.5.14: chunked prefill off
ALLOW_UNTESTED_ENV = "HSMON_PLUGIN_ALLOW_UNTESTED"
DUMP_ROOT_ENV = "HSMON_PLUGIN_DUMP_ROOT"
DEFAULT_DUMP_ROOT = "/dev/shm/hsmon"


def version_refusal(sglang_version: str, env: Mapping[str, str]) -> str | None:
    """The one-line refusal for an SGLang version the plugin was not tested with, or None."""
    if sglang_version in TESTED_SGLANG_VERSIONS:
        return None
    if env.get(ALLOW_UNTESTED_ENV, "") not in ("", "0"):
        return None
    tested = ", ".join(TESTED_SGLANG_VERSIONS)
    return (
        f"hsmon capture plugin {PLUGIN_VERSION}: SGLang {sglang_version} is untested (tested: {tested}); "
        f"the hooks patch SGLang internals that change between versions. Install a tested SGLang, "
        f"or set {ALLOW_UNTESTED_ENV}=1 to try anyway (hsmon sglang-serve --allow-untested-sglang; "
        f"then check the dumps with hsmon verify-data)"
    )


def pp_refusal(pp_size: int) -> str | None:
    """The one-line refusal for pipeline parallelism, or None."""
    if pp_size <= 1:
        return None
    return (
        f"hsmon capture plugin: pipeline parallelism (--pp-size {pp_size}) is not supported: only the "
        "last stage sees the final hidden states and the captured layers live on other stages. "
        "Use tensor parallelism (--tp-size) instead"
    )


def dump_root(env: Mapping[str, str] | None = None) -> str:
    """The directory that request dump dirs must lie in (``hsmon sglang-serve --dump-dir``)."""
    env = os.environ if env is None else env
    return env.get(DUMP_ROOT_ENV) or DEFAULT_DUMP_ROOT


def register() -> None:
    """Entry point: refuse an untested SGLang, then register the hooks of the adapter its code
    calls for (``features.py``; ``capture.py``, ``layer_capture.py``)."""
    import sglang

    from hsmon_sglang_plugin.features import detect

    features = detect()
    refusal = version_refusal(sglang.__version__, os.environ) or features.refusal
    if refusal:
        # SGLang logs and ignores ordinary exceptions from a plugin; a refused plugin must stop
        # the server instead of letting it serve requests that silently lack the capture.
        raise SystemExit(refusal)
    from hsmon_sglang_plugin import capture, cpu_mla

    capture.install(features.adapter or "")
    cpu_mla.register_torch_native()  # DeepSeek-style MLA on the CPU engine
