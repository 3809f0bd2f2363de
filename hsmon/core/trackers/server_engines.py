"""The engines a server tracker (server.py) can watch, and what differs between them (I/O only).

- SGLang: ``/server_info`` (its launch arguments and the capture plugin's counters), a real forward
  through ``/health_generate``.
- vLLM: no ``/server_info`` and no ``/health_generate``; it is known by ``/v1/models`` (``owned_by:
  vllm``) and ``/version``; the real forward is a one-token ``/v1/completions`` (on a capture server its
  hidden-states file is removed once vLLM's writer lets go of it); the speculative decoding it runs is
  read from the local process's own ``--speculative-config`` (vLLM publishes it nowhere else) and its
  acceptance from ``/metrics`` (``vllm:spec_decode_*``, server_rules.LOAD_SERIES).
Everything the state rule reads is the same for both (hsmon/core/state_server.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from hsmon.core.trackers.server_http import Unreachable, http_get, listening_pids

SGLANG, VLLM = "sglang", "vllm"
_health_ids = itertools.count(1)


def vllm_facts(url: str, timeout: float) -> dict[str, Any] | None:
    """``{"model", "version", "max_model_len"}`` of a vLLM server, or None when ``url`` is not one."""
    try:
        status, body = http_get(url + "/v1/models", timeout)
        models = json.loads(body) if status == 200 else None
        first = (models or {}).get("data", [None])[0]
    except (Unreachable, ValueError, AttributeError, IndexError, TypeError):
        return None
    if not isinstance(first, dict) or first.get("owned_by") != VLLM:
        return None
    version = None
    with contextlib.suppress(Unreachable, ValueError, AttributeError):
        status, body = http_get(url + "/version", timeout)
        version = json.loads(body).get("version") if status == 200 else None
    return {"model": first.get("id"), "version": version, "max_model_len": first.get("max_model_len")}


def vllm_forward(url: str, model: str, timeout: float) -> tuple[bool, str | None, str | None]:
    """One one-token completion: (ok, error as "HTTP 503" / "timed out" / the reason, the file a capture
    server wrote for it or None)."""
    body = json.dumps({"model": model, "prompt": [0], "max_tokens": 1, "temperature": 0}).encode()
    request = urllib.request.Request(
        url + "/v1/completions",
        data=body,
        headers={
            "Content-Type": "application/json",
            "X-Request-Id": f"hsmon-health-{os.getpid()}-{next(_health_ids)}",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            answer = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return False, f"HTTP {exc.code}", None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = str(getattr(exc, "reason", exc))
        return False, "timed out" if "timed out" in reason else reason, None
    path = ((answer or {}).get("kv_transfer_params") or {}).get("hidden_states_path")
    return True, None, path if isinstance(path, str) else None


def discard_files(paths: list[str]) -> list[str]:
    """Remove the health checks' hidden-states files whose write has ended (their ``.lock`` free, or
    gone with the file there); the others are returned, to be tried again after the next check."""
    left = []
    for path in paths:
        try:
            fd = os.open(path + ".lock", os.O_RDONLY)
        except FileNotFoundError:
            if not os.path.exists(path):
                left.append(path)  # not written yet
                continue
        except OSError:
            continue  # not ours to read (a remote or foreign directory): nothing to do
        else:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                left.append(path)
                continue
            finally:
                os.close(fd)
        for victim in (path, path + ".lock"):
            with contextlib.suppress(OSError):
                os.unlink(victim)
    return left[-64:]  # a server that never writes them is not tracked forever


def vllm_launch(url: str) -> dict[str, Any] | None:
    """The ``--speculative-config`` of the local process that listens on ``url``'s port, as vLLM was
    started with it; None when the server is not local, not readable here, or decodes plainly."""
    import psutil

    try:
        for pid in listening_pids(url):
            args = psutil.Process(pid).cmdline()
            for i, arg in enumerate(args):
                text = args[i + 1] if arg == "--speculative-config" and i + 1 < len(args) else None
                if arg.startswith("--speculative-config="):
                    text = arg.split("=", 1)[1]
                if text:
                    found = json.loads(text)
                    return found if isinstance(found, dict) else None
    except (psutil.Error, OSError, ValueError):
        return None
    return None


def vllm_spec_info(launch: dict[str, Any] | None) -> dict[str, Any] | None:
    """A vLLM server's speculative decoding (server_spec.speculative_of's ``info``) from its launch; None
    for a server that does not draft (extract_hidden_states is capture, not drafting)."""
    if not launch or not launch.get("model") or launch.get("method") in (None, "extract_hidden_states"):
        return None
    depth = launch.get("num_speculative_tokens")
    depth = depth if type(depth) is int else None
    return {
        "algorithm": str(launch.get("method")).upper(),
        "draft_model": str(launch["model"]),
        "depth": depth,
        "draft_tokens": depth + 1 if depth else None,
        "topk": 1,
        "avg_accept_length": None,
    }


@dataclass(frozen=True)
class VLLMReading:
    """What a vLLM server says of itself at a connect (its ``info`` as server_rules.info_of reads it)."""

    model: str | None
    info: dict[str, Any]
    drafting: dict[str, Any] | None
    estimate: tuple[float | None, str | None]


def read_vllm(url: str, timeout: float) -> VLLMReading | None:
    """A vLLM server's facts and speculative decoding (with its drafter's estimate), or None: not vLLM."""
    from hsmon.core.trackers.server_spec import drafter_estimate

    facts = vllm_facts(url, timeout)
    if facts is None:
        return None
    drafting = vllm_spec_info(vllm_launch(url))
    estimate = drafter_estimate(drafting["draft_model"], drafting["depth"]) if drafting else (None, None)
    info = {"version": facts["version"], "model_path": facts["model"], "engine": VLLM}
    return VLLMReading(facts["model"], info, drafting, estimate)
