"""`hsmon sglang-serve --draft DIR`: serve with EAGLE speculative decoding from an hsmon export.

The drafter decodes as a chain (``--speculative-eagle-topk 1``) of ``--draft-tokens`` tokens per
verify (the last verified token and ``draft_tokens - 1`` drafted ones). SGLang's own speculative
flags after ``--`` (``--speculative-draft-model-path`` ...) work too; this module only adds what
is missing. On CPU, EAGLE's draft backend needs the intel_amx attention backend, which SGLang
rewrites to torch_native on a CPU without its AMX kernels when it comes as
``--attention-backend``; the split ``--prefill-attention-backend`` / ``--decode-attention-backend``
flags are kept, and the test stand-in for sgl-kernel (tests/sglang_stubs) implements the ops they
call. That CPU path is a test device: a GPU server runs SGLang's own kernels.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DRAFT_TOKENS = 4
CPU_SPEC_ATTENTION = ("--prefill-attention-backend", "intel_amx", "--decode-attention-backend", "intel_amx")
# What a capture server sets and a speculative one must not (the drafter's config names its layers).
CAPTURE_ONLY_FLAGS = ("--enable-return-aux-hidden-states", "--return-aux-hidden-state-layer-ids")


class DraftError(ValueError):
    """A bad drafter directory or flag: one line naming it and the fix."""


@dataclass(frozen=True)
class SpecPlan:
    """What sglang-serve adds for speculative decoding (empty when it serves plainly)."""

    args: tuple[str, ...] = ()
    active: bool = False


def _given(args: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def check_draft(draft: Path) -> None:
    """An hsmon export (or any EAGLE-3 drafter SGLang loads): config.json naming an Eagle3 class."""
    config_file = draft / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise DraftError(
            f"--draft {draft}: cannot read config.json ({exc}); pass the directory hsmon export-drafter wrote"
        ) from None
    arch = str((config.get("architectures") or [""])[0])
    if "Eagle3" not in arch:
        raise DraftError(
            f"--draft {draft}: config.json's architecture is {arch or 'missing'}, not an EAGLE-3 "
            "drafter; pass the directory hsmon export-drafter wrote"
        )
    if not (draft / "model.safetensors").is_file():
        raise DraftError(
            f"--draft {draft}: no model.safetensors; pass the directory hsmon export-drafter wrote"
        )


def _config_dtype(directory: Path) -> str | None:
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return None
    config = config.get("text_config", config) if isinstance(config.get("text_config"), dict) else config
    value = config.get("torch_dtype") or config.get("dtype")
    return str(value) if value else None


def shared_dtype(target: Path, draft: Path) -> str | None:
    """The ``--dtype`` that makes target and drafter run in one dtype, or None when SGLang's "auto"
    already does. "auto" is per model: a float32 config runs in float16 (bfloat16 for Gemma), others
    as configured; so a float32 target (run in float16) beside a bfloat16 export would feed the
    drafter float16 features for bfloat16 weights. The target's resolved dtype wins."""
    target_dtype, draft_dtype = _config_dtype(target), _config_dtype(draft)
    if target_dtype is None:
        return None
    resolved = target_dtype
    if target_dtype == "float32":
        model_type = json.loads((target / "config.json").read_text()).get("model_type", "")
        resolved = "bfloat16" if str(model_type).startswith("gemma") else "float16"
    return resolved if resolved != draft_dtype else None


def plan(draft: str | None, draft_tokens: int, cpu: bool, extra: list[str],
         target: Path | None = None) -> SpecPlan:
    """The flags for speculative decoding with ``draft`` (or with SGLang's own flags in ``extra``);
    ``target``: the target's directory (for the shared dtype when ``extra`` names none)."""
    own = _given(extra, "--speculative-draft-model-path")
    if draft and own:
        raise DraftError("--draft and --speculative-draft-model-path after -- both name a drafter; keep one")
    if not draft and not own:
        return SpecPlan()
    for flag in CAPTURE_ONLY_FLAGS:
        if _given(extra, flag):
            raise DraftError(
                f"{flag} after -- is for capture servers; a speculative server takes its layers "
                "from the drafter's config.json"
            )
    args: list[str] = []
    if draft:
        if draft_tokens < 2:
            raise DraftError(f"--draft-tokens {draft_tokens}: at least 2 (the verified token and one draft)")
        check_draft(Path(draft))
        served = Path(draft).resolve()
        if target is not None:  # an export for vLLM: served from a copy with SGLang's ids
            from extractor.drafter_ids import DrafterIdsError, for_engine

            try:
                served, note = for_engine(served, "sglang", target)
            except DrafterIdsError as exc:
                raise DraftError(str(exc)) from None
            if note:
                print(f"hsmon sglang-serve: {note}", file=sys.stderr, flush=True)
        args += ["--speculative-draft-model-path", str(served)]
        dtype = None if target is None or _given(extra, "--dtype") else shared_dtype(target, Path(draft))
        if dtype:
            args += ["--dtype", dtype]
    defaults = (
        ("--speculative-algorithm", "EAGLE3"),
        ("--speculative-eagle-topk", "1"),
        ("--speculative-num-steps", str(draft_tokens - 1)),
        ("--speculative-num-draft-tokens", str(draft_tokens)),
    )
    for flag, value in defaults:
        if not _given(extra, flag):
            args += [flag, value]
    if cpu:
        for flag, value in zip(CPU_SPEC_ATTENTION[::2], CPU_SPEC_ATTENTION[1::2], strict=True):
            if not _given(extra, flag):
                args += [flag, value]
    return SpecPlan(tuple(args), True)
