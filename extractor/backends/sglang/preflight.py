"""Checks a SGLang server before the first row: health, server info, capture flags, radix cache,
the capture plugin. Every failure is one line naming the flag or option to change (exit status 2).

SGLang's own ``/server_info`` carries its launch arguments; the hsmon capture plugin adds
``hsmon_plugin`` (version, modes, ``dump_root``) when it is loaded in the server.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import requests

from extractor.errors import UsageError, log
from hsmon.contracts.capture_points import capture_points_of, sglang_layer_ids

PLUGIN_VERSION = "1"
INFO_PATHS = ("/server_info", "/get_server_info")
GENERATED_TOKENS = 1  # each request generates one token (prefill only): it needs a position


class PreflightError(UsageError):
    """The server cannot serve this extraction as launched: one line, exit status 2."""


class ServerNotReady(PreflightError):
    """No answer, or /health not 200 yet: a server that may still be loading its model."""


@dataclass
class ServerFacts:
    """What the client needs from one server's info."""

    url: str
    layer_ids: list[int]
    dtype: str
    chunked_prefill_size: int  # <= 0: chunked prefill off
    max_running_requests: int | None
    max_total_tokens: int | None
    model_path: str
    plugin: dict[str, Any] | None
    raw: dict[str, Any] = field(repr=False, default_factory=dict)
    max_input: int | None = None  # the longest input it accepts (None: it does not say)
    context_length: int | None = None
    captured_points: list[int] | None = None  # read back from the loaded model by the plugin
    # the dtype it computes in: the plugin's word (SGLang's own resolution), else its --dtype when
    # not auto; None until `check_servers` applies SGLang's auto rule to the model's config
    computes: str | None = None


def fetch_info(url: str, timeout: float) -> dict[str, Any]:
    """GET the server's health and info; PreflightError when it does not answer as SGLang."""
    try:
        health = requests.get(url + "/health", timeout=timeout)
    except requests.RequestException as exc:
        raise ServerNotReady(f"--url {url}: no SGLang server answers ({type(exc).__name__}); start one "
                             "(hsmon sglang-serve) or fix the URL") from None
    if health.status_code != 200:
        raise ServerNotReady(f"--url {url}: /health answered {health.status_code}; wait until the server "
                             "is ready, then run again")
    for path in INFO_PATHS:
        try:
            resp = requests.get(url + path, timeout=timeout)
        except requests.RequestException:
            continue
        if resp.status_code == 200:
            try:
                info = resp.json()
            except ValueError:
                continue
            if isinstance(info, dict) and "model_path" in info:
                return info
    raise PreflightError(f"--url {url}: no /server_info (is it an SGLang server?)")


def facts_of(url: str, info: dict[str, Any]) -> ServerFacts:
    def opt_int(key: str) -> int | None:
        value = info.get(key)
        return int(value) if isinstance(value, (int, float)) and value > 0 else None

    chunk = info.get("chunked_prefill_size")
    return ServerFacts(
        url=url, layer_ids=[int(i) for i in info.get("return_aux_hidden_state_layer_ids")
                            or (_plugin_layer_ids(info) if _plugin_captures(info) else [])],
        dtype=str(info.get("dtype", "auto")), chunked_prefill_size=int(chunk) if chunk else -1,
        max_running_requests=opt_int("max_running_requests"), max_total_tokens=opt_int("max_total_tokens"),
        model_path=str(info.get("model_path", "")), plugin=info.get("hsmon_plugin"), raw=info,
        max_input=max_input_of(info), context_length=opt_int("context_length"),
        captured_points=_plugin_points(info), computes=computes_of(info))


# SGLang's --dtype spellings, as the dtype stored
DTYPE_FLAGS = {"float32": "float32", "float": "float32", "float16": "float16", "half": "float16",
               "bfloat16": "bfloat16"}


def computes_of(info: dict[str, Any]) -> str | None:
    """The dtype a server computes in, as far as its info says: the plugin's (what SGLang resolved
    ``--dtype auto`` to), else its ``--dtype`` flag when that is not ``auto``."""
    plugin = info.get("hsmon_plugin")
    said = plugin.get("dtype") if isinstance(plugin, dict) else None
    if isinstance(said, str) and said in DTYPE_FLAGS:
        return DTYPE_FLAGS[said]
    return DTYPE_FLAGS.get(str(info.get("dtype", "auto")).lower())


def sglang_auto_dtype(config_dtype: str, model_type: str) -> str:
    """SGLang's ``--dtype auto`` for a model config (sglang/srt/configs/model_config.py): float32
    weights are served in float16 (bfloat16 for Gemma), any other dtype as it is."""
    if config_dtype == "float32":
        return "bfloat16" if model_type.startswith("gemma") else "float16"
    return config_dtype


def agreed_dtype(facts: list[ServerFacts]) -> str:
    """The one dtype every server computes in (a run stores one), or PreflightError naming a server to
    relaunch."""
    first = facts[0]
    for other in facts[1:]:
        if other.computes != first.computes:
            raise PreflightError(f"--url {other.url} computes in {other.computes}, --url {first.url} in "
                                 f"{first.computes}: a run stores one dtype; relaunch {other.url} with "
                                 f"--dtype {first.computes}")
    return str(first.computes)


def _plugin_captures(info: dict[str, Any]) -> bool:
    """The plugin captures the layers itself (adapter ``layer-capture``: SGLang releases without
    ``--enable-return-aux-hidden-states``, docs/extract.md "Supported SGLang releases")."""
    plugin = info.get("hsmon_plugin")
    return isinstance(plugin, dict) and plugin.get("adapter") in ("layer-capture", "whole-prefill")


def _plugin_points(info: dict[str, Any]) -> list[int] | None:
    """The capture points the server's model really captures (the plugin asked its class), or None."""
    plugin = info.get("hsmon_plugin")
    text = plugin.get("captured_points") if isinstance(plugin, dict) else None
    return [int(p) for p in str(text).replace(",", " ").split()] if text else None


def _plugin_layer_ids(info: dict[str, Any]) -> list[int]:
    ids = info["hsmon_plugin"].get("layer_ids") or ""
    return [int(i) for i in str(ids).replace(",", " ").split()]


def release_line(facts: ServerFacts) -> str:
    """``SGLang X, capture adapter Y`` for the start of a run (what the server's plugin says)."""
    plugin = facts.plugin or {}
    version = plugin.get("sglang_version") or facts.raw.get("version") or "unknown"
    line = f"{facts.url}: SGLang {version}, capture adapter {plugin.get('adapter', 'aux-return')}"
    from extractor.first_chunk_check import UNSERVED_CLASSES

    check = ("hsmon verify-data checks the first chunk against transformers before hours are spent "
             "(--skip-first-chunk-check skips it)")
    if plugin.get("tested") is False:  # started with --allow-untested-sglang
        line += f"; an untested release: {check}"
    elif plugin.get("model_class") in UNSERVED_CLASSES:
        line += f"; model class {plugin['model_class']}, not served by hsmon's conformance tests: {check}"
    return line


def _int(value: Any) -> int | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    return int(value) if ok else None


def max_input_of(info: dict[str, Any]) -> int | None:
    """The longest input (tokens) the server accepts for a one-token generation, from its info.

    SGLang 0.5.23 refuses (HTTP 400) an input when ``len + reserved >= context_length`` or
    ``len + reserved + max_new_tokens > context_length`` (its tokenizer manager; ``reserved`` is the
    EAGLE draft slots, 0 without a draft model), and when ``len >= max_req_input_len`` (its
    scheduler: ``min(context - 1, KV pool - 1) - 5``). None when the info has neither figure.
    """
    limits = []
    scheduler = _int(info.get("max_req_input_len"))
    if scheduler is not None:
        limits.append(scheduler - 1)
    context = _int(info.get("context_length"))
    if context is not None:
        reserved = 0
        if str(info.get("speculative_algorithm") or "").upper().startswith("EAGLE"):
            topk, steps = _int(info.get("speculative_eagle_topk")), _int(info.get("speculative_num_steps"))
            reserved = max((topk or 0) * (steps or 0), _int(info.get("speculative_num_draft_tokens")) or 0)
        limits.append(context - GENERATED_TOKENS - reserved)
    return max(min(limits), 1) if limits else None


def resolve_max_length(requested: int | None, facts: list[ServerFacts], max_positions: int) -> int:
    """``--max-length`` for the sglang backend: by default the smallest server's longest input (the
    model's positions less the generated token when no server says); an explicit value that no
    server accepts is a PreflightError naming the server, its context length and the fix."""
    known = [(f.max_input, f) for f in facts if f.max_input is not None]
    if requested is None:
        return min((n for n, _ in known), default=max_positions - GENERATED_TOKENS)
    if known and len(known) == len(facts):
        most, best = max(known, key=lambda pair: pair[0])
        if requested > most:
            context = f"context length {best.context_length}" if best.context_length else "its context length"
            raise PreflightError(
                f"--max-length {requested}: no server accepts inputs that long: {best.url} takes at most "
                f"{most} tokens ({context}, less the position of the one generated token and SGLang's "
                f"own margin); pass --max-length {most} or less, or leave it out (the default fits the "
                "smallest server)")
    return requested


def check_server(facts: ServerFacts, capture_points: list[int], transport: str, dtype: str,
                 dump_dir: str | None) -> None:
    """Raise PreflightError naming the flag to add or fix; return when the server fits."""
    info, url = facts.raw, facts.url
    want = sglang_layer_ids(capture_points)
    ids = " ".join(str(i) for i in want)
    missing = []  # every flag to add, so that one relaunch fixes them all
    if not info.get("enable_return_hidden_states"):
        missing.append("--enable-return-hidden-states")
    if not info.get("enable_return_aux_hidden_states") and not _plugin_captures(info):
        missing.append(f"--enable-return-aux-hidden-states --speculative-algorithm EAGLE3 "
                       f"--return-aux-hidden-state-layer-ids {ids}")
    if not info.get("disable_radix_cache"):
        missing.append("--disable-radix-cache")
    if missing:
        why = []
        if len(missing) > 1 or "radix" not in missing[0]:
            why.append("it does not capture the hidden states")
        if "--disable-radix-cache" in missing:
            why.append("its radix cache is on (a cached prefix returns no hidden states)")
        raise PreflightError(f"--url {url}: {' and '.join(why)}; relaunch it with {' '.join(missing)} "
                             "(hsmon sglang-serve sets them all)")
    if facts.captured_points is not None:
        if facts.captured_points != list(capture_points):
            model = (facts.plugin or {}).get("model_class") or "its model"
            got = ",".join(map(str, facts.captured_points))
            raise PreflightError(f"--url {url}: {model} on the server captures points {got} (SGLang "
                                 f"layer ids {facts.layer_ids}), this run needs {list(capture_points)}; "
                                 f"relaunch it with hsmon sglang-serve --layers "
                                 f"{','.join(map(str, capture_points))}, or pass --layers {got}")
    elif facts.layer_ids != want:
        raise PreflightError(f"--url {url}: the server captures SGLang layer ids {facts.layer_ids}, this run "
                             f"needs {want} (capture points {capture_points} minus 1); relaunch it with "
                             f"--return-aux-hidden-state-layer-ids {ids}, or pass --layers "
                             f"{','.join(map(str, capture_points_of(facts.layer_ids)))}")
    if int(info.get("pp_size") or 1) > 1:
        raise PreflightError(f"--url {url}: pipeline parallelism (--pp-size {info.get('pp_size')}) is not "
                             "supported: only the last stage captures; use --tp-size/--dp-size instead")
    computes = facts.computes or DTYPE_FLAGS.get(facts.dtype)
    if computes is not None and computes != dtype:
        raise PreflightError(
            f"--url {url}: the server computes in {computes}, this run asks for {dtype} (--dtype {dtype}): "
            f"relaunch the server with --dtype {dtype} (hsmon sglang-serve ... -- --dtype {dtype}), or leave "
            f"--dtype out to store the server's {computes}")
    plugin = facts.plugin
    if plugin is None:
        raise PreflightError(f"--url {url}: the hsmon capture plugin is not loaded (needed for the last "
                             f"layer with --transport {transport}); launch the server with hsmon "
                             "sglang-serve, or install the plugin in the server's environment "
                             "(docs/extract.md)")
    if str(plugin.get("version")) != PLUGIN_VERSION:
        raise PreflightError(f"--url {url}: the server's hsmon plugin speaks version "
                             f"{plugin.get('version')}, this client version {PLUGIN_VERSION}; use the same "
                             "hsmon on both sides")
    mode = "dump" if transport == "shm" else "pack"
    if mode not in plugin.get("modes", []):
        raise PreflightError(f"--url {url}: the server's hsmon plugin has no {mode} mode; upgrade it")
    if transport == "shm" and dump_dir is not None:
        root = plugin.get("dump_root")
        real = os.path.realpath(dump_dir)
        if root and not (real == os.path.realpath(root) or real.startswith(os.path.realpath(root) + os.sep)):
            raise PreflightError(f"--dump-dir {dump_dir}: the server accepts dump dirs under {root} only; "
                                 f"pass --dump-dir {root}/<job>, or relaunch with hsmon sglang-serve "
                                 "--dump-dir")


def check_servers(urls: list[str], capture_points: list[int], transport: str, dtype: str | None,
                  dump_dir: str | None, timeout: float = 10.0, wait_s: float = 0.0,
                  auto_dtype: str = "float16") -> list[ServerFacts]:
    """Preflight every URL; all must capture the same layers in the same dtype: ``dtype``, or with
    None (``--dtype auto``) the one they compute in (``facts[0].computes``). ``auto_dtype``: what
    SGLang's ``--dtype auto`` makes of this model (`sglang_auto_dtype`), for a server whose info
    does not say. A server that does not answer yet is waited for up to ``wait_s`` (a unit started
    beside a server that still loads its model), with a line every 30 s; any other refusal is at
    once."""
    facts = []
    for url in urls:
        fact = facts_of(url, wait_for_info(url, timeout, wait_s))
        fact.computes = fact.computes or auto_dtype
        facts.append(fact)
    stored = dtype or agreed_dtype(facts)
    for fact in facts:
        check_server(fact, capture_points, transport, stored, dump_dir)
    return facts


def wait_for_info(url: str, timeout: float, wait_s: float, poll_s: float = 2.0) -> dict[str, Any]:
    """``fetch_info`` again until it answers or ``wait_s`` has passed (then its refusal)."""
    import time

    start = next_line = time.monotonic()
    while True:
        try:
            return fetch_info(url, timeout)
        except ServerNotReady as exc:
            waited = time.monotonic() - start
            if waited + poll_s > wait_s:
                if wait_s > 0:
                    raise ServerNotReady(f"{exc} (waited {waited:.0f}s of --wait-for-server "
                                         f"{wait_s:.0f})") from None
                raise
            if time.monotonic() >= next_line:
                why = str(exc).split(": ", 1)[-1].split(";")[0]
                log(f"waiting for --url {url} to answer ({why}): {waited:.0f}s of {wait_s:.0f}s")
                next_line = time.monotonic() + 30.0
            time.sleep(poll_s)


def default_concurrency(facts: list[ServerFacts], longest_row: int, transport: str) -> int:
    """Requests in flight, over all servers: enough to keep each server's batch full, no more.

    Both transports get every chunked-prefill piece (the plugin keeps them in pack mode as in
    dump mode), so the chunk budget does not bound json's concurrency (``transport`` is kept
    for callers)."""
    total = 0
    longest = max(longest_row, 1)
    for fact in facts:
        per = 8
        if fact.max_running_requests:
            per = min(per, fact.max_running_requests)
        if fact.max_total_tokens:
            per = min(per, max(1, fact.max_total_tokens // longest))
        total += max(per, 1)
    return total
