"""Checks a vLLM server before the first row: it answers, it is the extraction server hsmon vllm-serve
started (its description file beside its dumps), it captures the run's points, and in which dtype.
Every refusal is one line naming the option to change (exit status 2).

vLLM has no endpoint that says what it captures, so the preflight sends one short request: the
response names the connector's file, whose directory holds ``hsmon-vllm-serve.json`` (the points and
ids vllm-serve gave vLLM) and whose tensors give the layer count and the dtype the server computes in.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from extractor.backends.sglang.preflight import PreflightError, ServerNotReady
from extractor.backends.vllm import dumps

DESCRIPTION = "hsmon-vllm-serve.json"  # extractor/vllm/serve.py writes it
PROBE_IDS = [1, 2, 3]
GENERATED_TOKENS = 1


@dataclass
class VLLMFacts:
    """What the client knows of one vLLM server (the fields the sglang client's pool and limits read)."""

    url: str
    model: str  # the served model's name, sent with each request
    dump_root: Path
    captured_points: list[int]
    layer_ids: list[int]
    computes: str  # the dtype of its files
    max_input: int | None = None
    context_length: int | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int = -1
    plugin: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


def _models(url: str, timeout: float) -> dict[str, Any]:
    try:
        health = requests.get(url + "/health", timeout=timeout)
    except requests.RequestException as exc:
        raise ServerNotReady(
            f"--url {url}: no vLLM server answers ({type(exc).__name__}); start one "
            "(hsmon vllm-serve) or fix the URL"
        ) from None
    if health.status_code != 200:
        raise ServerNotReady(
            f"--url {url}: /health answered {health.status_code}; wait until the server is "
            "ready, then run again"
        )
    try:
        body = requests.get(url + "/v1/models", timeout=timeout).json()
        return dict(body["data"][0])
    except (requests.RequestException, ValueError, KeyError, IndexError, TypeError):
        raise PreflightError(f"--url {url}: no model in /v1/models (is it a vLLM server?)") from None


def _wait(url: str, timeout: float, wait_s: float, poll_s: float = 2.0) -> dict[str, Any]:
    start = next_line = time.monotonic()
    while True:
        try:
            return _models(url, timeout)
        except ServerNotReady:
            waited = time.monotonic() - start
            if waited + poll_s > wait_s:
                raise
            if time.monotonic() >= next_line:
                print(
                    f"hsmon extract: waiting for --url {url} to answer: {waited:.0f}s of {wait_s:.0f}s",
                    file=sys.stderr,
                    flush=True,
                )
                next_line = time.monotonic() + 30.0
            time.sleep(poll_s)


def probe_path(url: str, model: str, timeout: float) -> Path:
    """One short request; the connector's file it names (PreflightError when it names none)."""
    try:
        resp = requests.post(
            url + "/v1/completions",
            timeout=timeout,
            headers={"X-Request-Id": "hsmon-preflight"},
            json={"model": model, "prompt": PROBE_IDS, "max_tokens": 1, "temperature": 0},
        )
        body = resp.json()
    except (requests.RequestException, ValueError) as exc:
        raise PreflightError(f"--url {url}: a short request failed ({exc}); check the server's log") from None
    path = ((body or {}).get("kv_transfer_params") or {}).get("hidden_states_path")
    if not path:
        raise PreflightError(
            f"--url {url}: its answers name no hidden-states file: it does not capture; start "
            "it with hsmon vllm-serve --layers ... (vLLM's extract_hidden_states method)"
        )
    return Path(path)


def facts_of(url: str, timeout: float, wait_s: float) -> VLLMFacts:
    model = _wait(url, timeout, wait_s)
    path = probe_path(url, str(model.get("id")), timeout)
    try:
        data = dumps.take(path, 60.0, url, PROBE_IDS)
    except (OSError, ValueError) as exc:
        raise PreflightError(
            f"--url {url}: cannot read its file {path} ({exc}); the client must see vllm-serve "
            "--dump-dir (run it on the server's machine)"
        ) from None
    try:
        said = json.loads((path.parent / DESCRIPTION).read_text())
    except (OSError, ValueError):
        raise PreflightError(
            f"--url {url}: no {DESCRIPTION} beside its files in {path.parent}: start the server "
            "with hsmon vllm-serve --layers L1,L2,L3"
        ) from None
    points = [int(p) for p in said.get("capture_points", [])]
    states = data["hidden_states"]
    context = model.get("max_model_len")
    context = int(context) if isinstance(context, int) and context > 0 else None
    return VLLMFacts(
        url=url,
        model=str(model.get("id")),
        dump_root=path.parent,
        captured_points=points,
        layer_ids=[int(i) for i in said.get("layer_ids", [])],
        computes=str(states.dtype).removeprefix("torch."),
        max_input=context - GENERATED_TOKENS if context else None,
        context_length=context,
        raw={"description": said, "layers_in_file": int(states.shape[1]), "hidden": int(states.shape[2])},
    )


def check_server(facts: VLLMFacts, layers: list[int], dtype: str, hidden: int) -> None:
    url = facts.url
    if facts.captured_points != list(layers):
        got = ",".join(map(str, facts.captured_points))
        raise PreflightError(
            f"--url {url}: the server captures points {got} (vLLM layer ids {facts.layer_ids}), "
            f"this run needs {list(layers)}; relaunch it with hsmon vllm-serve --layers "
            f"{','.join(map(str, layers))}, or pass --layers {got}"
        )
    if facts.raw["layers_in_file"] != len(layers) + 1 or facts.raw["hidden"] != hidden:
        raise PreflightError(
            f"--url {url}: its files hold {facts.raw['layers_in_file']} layers of "
            f"{facts.raw['hidden']}, expected {len(layers) + 1} of {hidden}: is it serving the "
            "model of --model, started by hsmon vllm-serve?"
        )
    if facts.computes != dtype:
        raise PreflightError(
            f"--url {url}: the server computes in {facts.computes}, this run asks for {dtype}: "
            f"relaunch it with hsmon vllm-serve ... -- --dtype {dtype}, or leave --dtype out"
        )


def check_servers(
    urls: list[str],
    layers: list[int],
    dtype: str | None,
    hidden: int,
    timeout: float = 10.0,
    wait_s: float = 0.0,
) -> list[VLLMFacts]:
    """Preflight every URL: all capture ``layers`` in one dtype (``dtype``, or with None the first's)."""
    facts = [facts_of(url, timeout, wait_s) for url in urls]
    stored = dtype or facts[0].computes
    for fact in facts:
        check_server(fact, layers, stored, hidden)
    return facts


def release_line(facts: VLLMFacts) -> str:
    return (
        f"{facts.url}: vLLM, extract_hidden_states into {facts.dump_root} (points "
        f"{','.join(map(str, facts.captured_points))}, vLLM layer ids {facts.layer_ids})"
    )
