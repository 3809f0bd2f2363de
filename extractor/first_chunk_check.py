"""The first-chunk check of `hsmon extract --backend sglang` where hsmon's tests never compared
SGLang's capture with transformers: an untested SGLang release, or a model class its conformance
tests cannot serve (``UNSERVED_CLASSES``).

A server whose release is outside the capture plugin's tested set (started with
``hsmon sglang-serve --allow-untested-sglang``) says ``tested: false`` in ``/server_info``; its
plugin also names the model class it loaded (``model_class``). For such a run, the first chunk
this run completes is checked against transformers before hours are spent: ``hsmon verify-data
OUT --backend hf --chunk rows_A-B`` runs in a child process (the model on the client's CPU) while
the extraction goes on. AGREE: one line, the run goes on. DISAGREE: the run stops (exit status
1) with the rows written so far kept, and the error says what to do. A check that cannot run
(exit 2: the model does not load here, say) is reported and the run goes on unchecked.
``--skip-first-chunk-check`` turns it off (docs/extract.md, "Supported SGLang releases").
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extractor.errors import log

SAMPLE = 8  # rows of the chunk re-extracted by transformers (verify-data's default)


# SGLang classes that serve a family hsmon's conformance tests cannot serve on CPU (so nothing
# here ever compared their capture with transformers), and why; their first chunk is checked by
# default, as an untested release's is.
UNSERVED_CLASSES: dict[str, str] = {
    "KimiK25ForConditionalGeneration": "Kimi-K2.5's wrapper: SGLang's multimodal processor for it needs "
    "Moonshot's remote code, so the conformance tests serve its DeepSeek-V3 text model only",
}


@dataclass(frozen=True)
class Unchecked:
    """One server whose capture hsmon's tests never compared with transformers, and why."""

    url: str
    why: str  # "an untested SGLang release (SGLang X, ADAPTER)" or "model class K, ..."
    untested_release: bool  # the fix differs: a tested release, or a report


def untested_servers(facts: Sequence[Any]) -> list[Unchecked]:
    """The servers to check (preflight's ServerFacts): an untested release (``tested: false``),
    or a model class of ``UNSERVED_CLASSES``."""
    found = []
    for fact in facts:
        plugin = fact.plugin if isinstance(fact.plugin, dict) else {}
        model_class = str(plugin.get("model_class") or "")
        if plugin.get("tested") is False:
            found.append(Unchecked(fact.url, f"an untested SGLang release (SGLang "
                                   f"{plugin.get('sglang_version') or 'unknown'}, "
                                   f"{plugin.get('adapter') or 'aux-return'})", True))
        elif model_class in UNSERVED_CLASSES:
            found.append(Unchecked(fact.url, f"model class {model_class}, which hsmon's conformance tests "
                                   "do not serve", False))
    return found


def start(out: Path, model: Path, backend: Any, skip: bool,
          stop_event: threading.Event) -> FirstChunkCheck | None:
    """The check of this run, started, or None (nothing unchecked, or ``--skip-first-chunk-check``)."""
    servers = untested_servers(getattr(backend, "facts", None) or [])
    if not servers:
        return None
    if skip:
        log(f"first-chunk check skipped (--skip-first-chunk-check): the data of {_servers(servers)} goes "
            f"unchecked; `hsmon verify-data {out} --backend hf --chunk rows_A-B` checks a chunk later")
        return None
    check = FirstChunkCheck(out, model, servers, stop_event)
    check.start()
    return check


class FirstChunkCheck(threading.Thread):
    """Waits for the first chunk with rows the run completes (``chunk_done``, from the writer
    thread), then runs verify-data on it. ``error`` holds the run's error after a disagreement."""

    def __init__(self, out: Path, model: Path, servers: list[Unchecked], stop_event: threading.Event,
                 sample: int = SAMPLE) -> None:
        super().__init__(name="hsmon-first-chunk-check", daemon=True)
        self.out, self.model, self.servers, self.sample = out, model, servers, sample
        self.stop_event = stop_event
        self.error: str | None = None
        self.verdict: str | None = None  # agree, disagree, failed (the check could not run)
        self._chunk: str | None = None
        self._wake = threading.Event()
        self._quit = False
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def chunk_done(self, record: dict[str, Any]) -> None:
        """The writer recorded a chunk: the first one with rows (not only rejects) is checked."""
        if not record.get("rows"):
            return
        with self._lock:
            if self._chunk is None:
                self._chunk = str(record["chunk"])
        self._wake.set()

    def finish(self, stopped: bool) -> None:
        """At the run's end: wait for a check under way (a stopped run ends it instead)."""
        with self._lock:
            self._quit = True
            if stopped and self._proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    self._proc.terminate()
        self._wake.set()
        self.join()

    def command(self, chunk: str) -> list[str]:
        return [sys.executable, "-m", "hsmon", "verify-data", str(self.out), "--backend", "hf",
                "--model", str(self.model), "--chunk", chunk, "--sample", str(self.sample), "--json"]

    def run(self) -> None:
        self._wake.wait()
        with self._lock:
            chunk = self._chunk
            if chunk is None or (self._quit and self.stop_event.is_set()):
                return
            releases = _servers(self.servers)
            log(f"first-chunk check: {chunk} of {releases} against transformers: "
                f"{' '.join(self.command(chunk)[1:])}")
            self._proc = subprocess.Popen(self.command(chunk), stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True)
        out, err = self._proc.communicate()
        self._judge(chunk, self._proc.returncode, out, err, releases)

    def _judge(self, chunk: str, status: int, out: str, err: str, releases: str) -> None:
        report: dict[str, Any] = {}
        with contextlib.suppress(ValueError):
            report = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        if status == 0 and report.get("verdict") == "agree":
            self.verdict = "agree"
            log(f"first-chunk check: AGREE: {len(report.get('rows', []))} rows of {chunk} match transformers "
                f"(worst cosine {report.get('worst_cosine', 0.0):.6f}, max abs diff "
                f"{report.get('max_abs_diff', 0.0):.3g}); the run goes on")
        elif status == 1 and report.get("verdict") == "disagree":
            self.verdict = "disagree"
            fix = ("serve the target with a tested SGLang release (docs/extract.md, \"Supported SGLang "
                   "releases\")" if any(s.untested_release for s in self.servers) else
                   "report the model class (docs/extract.md, \"Supported SGLang releases\")")
            self.error = (f"first-chunk check: DISAGREE: layers {', '.join(report.get('differ', []))} of "
                          f"{chunk} differ from transformers ({self.model}): {releases} does not capture "
                          "what the model computes; the rows written are kept but do not train on them: "
                          f"{fix}, or check the model given")
            self.stop_event.set()
        elif not self.stop_event.is_set():
            self.verdict = "failed"
            why = (err.strip().splitlines() or [f"exit status {status}"])[-1]
            log(f"first-chunk check: could not run ({why}); the run goes on UNCHECKED: run "
                f"`hsmon verify-data {self.out} --chunk {chunk}` where the model fits")


def _servers(servers: Sequence[Unchecked]) -> str:
    """``URL (an untested SGLang release (SGLang X, A))``, joined: what the check's lines name."""
    return ", ".join(f"{s.url} ({s.why})" for s in servers)
