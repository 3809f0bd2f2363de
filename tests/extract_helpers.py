"""Shared pieces of the `hsmon extract` tests: tiny models, datasets, real subprocesses."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hsmon.contracts import events as ev
from hsmon.contracts import layout
from hsmon.contracts.manifest_reader import read_manifest, read_row_records

TIMEOUT = 300


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 8-layer Llama (hidden 64) with a byte-level BPE tokenizer and no chat template."""
    from extractor.tiny_model import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same kind of model, with a chat template."""
    from extractor.tiny_model import CHAT_TEMPLATE, make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tinychat") / "model", chat_template=CHAT_TEMPLATE)


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    """A 4 MiB tmpfs of the test's own (a disk that really fills); needs root and mount."""
    import contextlib
    import shutil

    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a tmpfs")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            subprocess.run(["umount", "-l", str(mount)], check=True)


def text_lines() -> list[str]:
    from extractor.tiny_model import stdlib_text

    return [line for line in stdlib_text(200_000).splitlines() if line.strip()]


def make_dataset(
    path: Path, rows: int, seed: int = 0, bad_every: int = 0, min_lines: int = 2, max_lines: int = 8
) -> Path:
    """A JSONL dataset mixing text, ShareGPT, OpenAI and pre-tokenized rows (and bad rows)."""
    rng = random.Random(seed)
    lines = text_lines()
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(rows):
            if bad_every and i % bad_every == bad_every - 1:
                fh.write(
                    rng.choice(
                        [
                            '{"text": ""}',
                            "not json",
                            '{"conversations": [{"role": "alien", "content": "x"}]}',
                            '{"input_ids": [1, 99999]}',
                        ]
                    )
                    + "\n"
                )
                continue
            k = rng.randint(min_lines, max_lines)
            j = rng.randint(0, len(lines) - k)
            text = "\n".join(lines[j : j + k])
            kind = i % 4
            if kind == 0:
                obj: dict[str, Any] = {"text": text}
            elif kind == 1:
                obj = {
                    "conversations": [{"from": "human", "value": text[:60]}, {"from": "gpt", "value": text}]
                }
            elif kind == 2:
                obj = {
                    "conversations": [
                        {"role": "system", "content": "Be brief."},
                        {"role": "user", "content": text[:50]},
                        {"role": "assistant", "content": text},
                    ]
                }
            else:
                ids = [rng.randint(3, 500) for _ in range(10 * k)]
                obj = {"input_ids": ids, "loss_mask": [rng.randint(0, 1) for _ in ids]}
            fh.write(json.dumps(obj) + "\n")
    return path


def extract_env() -> dict[str, str]:
    """The environment of an extraction subprocess: one compute thread, because on a small shared
    machine OpenMP threads that wait for each other at every op are several times slower."""
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def extract_cmd(data: Path, out: Path, model: Path, *extra: str, events: Path | None = None) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "hsmon",
        "extract",
        str(data),
        "--out",
        str(out),
        "--model",
        str(model),
        "--min-free",
        "1M",
        "--heartbeat",
        "0.5",
        "--disk-poll",
        "0.2",
        *extra,
    ]
    if events is not None:
        cmd += ["--events", str(events)]
    return cmd


def run_extract(
    data: Path, out: Path, model: Path, *extra: str, events: Path | None = None, timeout: float = TIMEOUT
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        extract_cmd(data, out, model, *extra, events=events),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=extract_env(),
    )


def start_extract(
    data: Path, out: Path, model: Path, *extra: str, events: Path, stderr: Any = subprocess.PIPE,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    """`hsmon extract` started; ``env`` adds to its environment (HSMON_HF_FORWARD_DELAY_S: an
    engine slow on purpose, so that a signal after the first rows lands mid-run)."""
    return subprocess.Popen(
        extract_cmd(data, out, model, *extra, events=events),
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
        env={**extract_env(), **(env or {})},
    )


def hsmon_status(*args: str) -> tuple[int, dict[str, Any]]:
    """`hsmon status ARGS --json` as a real subprocess: (exit status, the status document's one job)."""
    proc = subprocess.run(
        [sys.executable, "-m", "hsmon", "status", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=extract_env(),
    )
    assert proc.returncode in (0, 1), proc.stderr
    (job,) = json.loads(proc.stdout)["jobs"]
    return proc.returncode, job


def critical_hints(job: dict[str, Any]) -> list[str]:
    return [h["message"] for h in job["hints"] if h["severity"] == "critical"]


def events_of(path: Path) -> list[dict[str, Any]]:
    return list(ev.iter_events(path)) if path.exists() else []


def wait_for_event(
    path: Path, predicate: Any, proc: subprocess.Popen[str] | None = None, timeout: float = TIMEOUT
) -> dict[str, Any]:
    """Poll an events file until an event matches; fails if the process ends first."""
    reader = ev.EventFileReader(str(path))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in reader.poll():
            if predicate(event):
                return event
        if proc is not None and proc.poll() is not None:
            for event in reader.poll():
                if predicate(event):
                    return event
            raise AssertionError(
                f"process ended (rc {proc.returncode}) before the event: "
                f"{proc.stderr.read() if proc.stderr else ''}"
            )
        time.sleep(0.02)
    raise AssertionError("timed out waiting for an event")


def load_output(out: Path, manifest: str | None = None) -> dict[int, dict[str, Any]]:
    """Every row the manifests count as done, loaded with torch.load."""
    import torch

    return {
        row: torch.load(out / rec["chunk"] / layout.row_file_name(row), weights_only=True)
        for row, rec in sorted(read_row_records(out, name=manifest).items())
    }


def assert_same_output(got: Path, want: Path, exact: bool = True) -> None:
    """Same rows, tensor for tensor (``exact=False``: hidden states equal to float rounding, as rows
    batched otherwise give), no stray or temporary files, no row counted twice."""
    import torch

    a, b = load_output(got), load_output(want)
    assert sorted(a) == sorted(b), f"rows differ: {set(a) ^ set(b)}"
    for row in a:
        assert a[row].keys() == b[row].keys()
        for key in a[row]:
            if exact or not a[row][key].is_floating_point():
                assert torch.equal(a[row][key], b[row][key]), f"row {row} {key} differs"
            else:
                torch.testing.assert_close(a[row][key], b[row][key], rtol=1e-4, atol=1e-5)
    counted = {
        str(got / rec["chunk"] / layout.row_file_name(r)) for r, rec in read_row_records(got).items()
    }
    on_disk = {str(p) for p in got.glob("rows_*/*")}
    assert on_disk == counted, f"files not in the manifest: {sorted(on_disk - counted)[:5]}"
    for path in layout.manifest_paths(got):
        rows = [r["row"] for r in layout.iter_jsonl(path) if r.get("type") == "row"]
        assert len(rows) == len(set(rows)), f"{path.name} counts a row twice"
    chunks_a = {k: v["sha256"] for k, v in read_manifest(got).chunks.items()}
    chunks_b = {k: v["sha256"] for k, v in read_manifest(want).chunks.items()}
    assert chunks_a == chunks_b if exact else chunks_a.keys() == chunks_b.keys()


def sglang_equals_in_process(
    server_url: str, dump_root: str, data: Path, want: dict[int, Any], work: Path, model: Path, *extra: str,
    rows: list[list[int]] | None = None,
) -> dict[str, float]:
    """Extract ``data`` from the server over both transports (float32) and check each output's rows
    equal ``want`` (the in-process rows) within 1e-4, with no dump file left behind; ``rows``: also
    check each row has one position per token. Returns the max abs difference per transport."""
    import torch

    worst: dict[str, float] = {}
    for transport in ("json", "shm"):
        out, dump = work / transport, Path(dump_root) / f"job-{transport}"
        proc = run_extract(data, out, model, *extra, "--backend", "sglang", "--url", server_url,
                           "--transport", transport, "--dump-dir", str(dump), "--dtype", "float32")
        assert proc.returncode == 0, proc.stderr[-2000:]
        got = load_output(out)
        assert sorted(got) == sorted(want)
        worst[transport] = 0.0
        for row in want:
            if rows is not None:
                assert got[row]["aux_hidden_state"].shape[-2] == len(rows[row])  # rows == tokens
            for key in ("aux_hidden_state", "hidden_state"):
                torch.testing.assert_close(got[row][key], want[row][key], rtol=1e-4, atol=1e-4)
                worst[transport] = max(worst[transport], (got[row][key] - want[row][key]).abs().max().item())
        assert not dump.exists() or not any(dump.iterdir())  # no dump file left
    return worst
