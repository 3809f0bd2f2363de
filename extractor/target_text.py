"""The embedded target's text side: its corpus (Python's standard library), chat format and tokenizer.

* corpus: the ``.py`` files of the running interpreter's standard library (tests excluded), in
  sorted order; files whose CRC-32 of the relative path is ``0 mod 10`` are held out for evaluation;
* tokenizer: byte-level BPE (the `tokenizers` library), vocabulary 2048, with the special tokens
  below and a chat template (`CHAT_TEMPLATE`) whose assistant turns are marked for loss masks.
"""

from __future__ import annotations

import ast
import json
import random
import sysconfig
import textwrap
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
SYSTEM, USER, ASSISTANT, END = "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"
SPECIAL_TOKENS = (PAD, BOS, EOS, SYSTEM, USER, ASSISTANT, END)

# Roles: OpenAI names and their ShareGPT aliases. Assistant content and its closing <|end|> sit
# inside {% generation %}, so apply_chat_template(..., return_assistant_tokens_mask=True) gives
# the loss mask. The role tokens themselves are never in the mask.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% set role = message['role'] if 'role' in message else message['from'] %}"
    "{% set content = message['content'] if 'content' in message else message['value'] %}"
    "{% if role == 'system' %}<|system|>{{ content }}<|end|>"
    "{% elif role in ('user', 'human') %}<|user|>{{ content }}<|end|>"
    "{% elif role in ('assistant', 'gpt') %}<|assistant|>"
    "{% generation %}{{ content }}<|end|>{% endgeneration %}"
    "{% else %}{{ raise_exception('unknown role: ' + role) }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

HELDOUT_MODULUS = 10
MAX_FILE_BYTES = 200_000
EXCLUDED_DIRS = frozenset({"test", "tests", "site-packages", "dist-packages", "idle_test"})


# ---------------------------------------------------------------------------------------------
# Corpus: pure selection logic plus file reading.


def stdlib_dir() -> Path:
    """The running interpreter's standard-library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relpath: str) -> bool:
    """Whether a corpus file (by its path relative to the stdlib) is held out for evaluation."""
    return zlib.crc32(relpath.encode()) % HELDOUT_MODULUS == 0


def corpus_files(root: Path | None = None) -> tuple[list[Path], list[Path]]:
    """(train, heldout) standard-library source files, each list in sorted relative-path order."""
    root = root or stdlib_dir()
    train: list[Path] = []
    heldout: list[Path] = []
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root).as_posix()
        parts = rel.split("/")
        if any(part in EXCLUDED_DIRS for part in parts[:-1]) or parts[-1].startswith("test_"):
            continue
        try:
            if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
                continue
        except OSError:
            continue
        (heldout if is_heldout(rel) else train).append(path)
    if not train or not heldout:
        raise RuntimeError(f"no Python sources found under {root}; the embedded target needs the stdlib")
    return train, heldout


def read_texts(paths: Sequence[Path], max_chars: int) -> list[str]:
    """UTF-8 texts of ``paths`` in order, until ``max_chars`` are gathered; unreadable files skipped."""
    texts: list[str] = []
    total = 0
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if not text.strip():
            continue
        texts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return texts


def render_chat(messages: Sequence[dict[str, str]]) -> str:
    """`CHAT_TEMPLATE` rendered in plain Python (OpenAI-style messages), without the leading bos."""
    opening = {"system": SYSTEM, "user": USER, "assistant": ASSISTANT}
    return "".join(f"{opening[m['role']]}{m['content']}{END}" for m in messages)


def function_requests(paths: Sequence[Path], max_code_chars: int = 4000) -> Iterator[tuple[str, str, str]]:
    """(function name, request, source) for each documented function of ``paths``, in order.

    The request is "Write a Python function `name`: <first paragraph of its docstring>", the form
    the embedded target's chat documents take (and `make demo`'s rows and held-out prompts).
    """
    for path in paths:
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        lines = source.splitlines(keepends=True)
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            doc = ast.get_docstring(node)
            # Slicing lines, not ast.get_source_segment: that one re-splits the file per call.
            code = textwrap.dedent("".join(lines[node.lineno - 1 : node.end_lineno or node.lineno])).rstrip()
            if not doc or not code or len(code) > max_code_chars:
                continue
            request = doc.strip().split("\n\n")[0].strip()
            yield node.name, f"Write a Python function `{node.name}`: {request}", code


def conversation_texts(paths: Sequence[Path], max_chars: int) -> list[str]:
    """Chat-formatted training documents: a function's docstring asks, its source answers.

    They teach the model the chat layout, so `{"conversations": ...}` rows get structured
    predictions too.
    """
    texts: list[str] = []
    total = 0
    for _, request, code in function_requests(paths):
        text = render_chat([{"role": "user", "content": request}, {"role": "assistant", "content": code}])
        texts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return texts


def spread_order(paths: Sequence[Path], seed: int) -> list[Path]:
    """A seeded shuffle, so that a character budget draws from the whole library, not one corner."""
    shuffled = list(paths)
    random.Random(seed).shuffle(shuffled)
    return shuffled


# ---------------------------------------------------------------------------------------------
# Tokenizer.


def train_tokenizer(texts: Sequence[str], vocab_size: int) -> Any:
    """A byte-level BPE `tokenizers.Tokenizer` trained on ``texts``, special tokens first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def wrap_tokenizer(tokenizer: Any, max_length: int) -> Any:
    """The transformers fast tokenizer around a trained `tokenizers.Tokenizer`, with chat template."""
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[SYSTEM, USER, ASSISTANT, END],
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def make_tokenizer_config_portable(directory: Path) -> None:
    """Let transformers 4.x load the tokenizer that transformers 5 saved.

    v5 names its own class (``TokenizersBackend``), lists extra special tokens under a key that
    v4 reads as a dict, and keeps the chat template only in ``chat_template.jinja``. The generic
    class name, the v4 key and an inline template load the same in both.
    """
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = config.pop("extra_special_tokens", None)
    if isinstance(extra, list):
        config["additional_special_tokens"] = extra
    config["chat_template"] = CHAT_TEMPLATE
    path.write_text(json.dumps(config, indent=2) + "\n")


def document_stream(tokenizer: Any, texts: Sequence[str]) -> list[int]:
    """Token ids of ``texts`` as one stream: <|bos|> text <|eos|> per document."""
    bos = tokenizer.token_to_id(BOS)
    eos = tokenizer.token_to_id(EOS)
    stream: list[int] = []
    for encoding in tokenizer.encode_batch(list(texts)):
        stream.append(bos)
        stream.extend(encoding.ids)
        stream.append(eos)
    return stream


# The standard-library files the demo and the tests draw their sample rows from.
DEMO_SOURCES = (
    "argparse.py",
    "textwrap.py",
    "shutil.py",
    "pathlib.py",
    "json/__init__.py",
    "csv.py",
    "difflib.py",
    "calendar.py",
    "string.py",
    "random.py",
    "statistics.py",
    "fractions.py",
    "heapq.py",
    "bisect.py",
    "functools.py",
    "inspect.py",
    "tempfile.py",
    "zipfile/__init__.py",
    "tarfile.py",
    "ipaddress.py",
)


def docstrings(limit: int, sources: tuple[str, ...] = DEMO_SOURCES) -> list[tuple[str, str]]:
    """(name, docstring) pairs of standard-library functions and classes, from ``sources``."""
    root = stdlib_dir()
    found: list[tuple[str, str]] = []
    for name in sources:
        path = root / name
        if not path.is_file():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 40:
                    found.append((f"{path.stem}.{node.name}", doc[:1200]))
                    if len(found) >= limit:
                        return found
    return found
