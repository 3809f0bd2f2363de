"""The first-chunk check of `hsmon extract --backend sglang` on an untested SGLang release.

A server whose release is outside the capture plugin's tested set (started with
``hsmon sglang-serve --allow-untested-sglang``) says ``tested: false`` in ``/server_info``. For
such a run, the first chunk this run completes is checked against transformers before hours are
spent: ``hsmon verify-data OUT --backend hf --chunk rows_A-B`` runs in a child process (the model
on the client's CPU) while the extraction goes on. AGREE: one line, the run goes on. DISAGREE:
the run stops (exit status 1) with the rows written so far kept, and the error says what to do.
A check that cannot run (exit 2: the model does not load here, say) is reported and the run goes
on unchecked. ``--skip-first-chunk-check`` turns it off (docs/extract.md, "Supported SGLang
releases").
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


@dataclass(frozen=True)
class Untested:
    """One server on an untested release: what the check's lines name."""

    url: str
    sglang_version: str
    adapter: str


def untested_servers(facts: Sequence[Any]) -> list[Untested]:
    """The servers whose capture plugin says ``tested: false`` (preflight's ServerFacts)."""
    found = []
    for fact in facts:
        plugin = fact.plugin if isinstance(fact.plugin, dict) else {}
        if plugin.get("tested") is False:
            found.append(Untested(fact.url, str(plugin.get("sglang_version") or "unknown"),
                                  str(plugin.get("adapter") or "aux-return")))
    return found


def start(out: Path, model: Path, backend: Any, skip: bool,
          stop_event: threading.Event) -> FirstChunkCheck | None:
    """The check of this run, started, or None (no untested server, or ``--skip-first-chunk-check``)."""
    servers = untested_servers(getattr(backend, "facts", None) or [])
    if not servers:
        return None
    if skip:
        log("first-chunk check skipped (--skip-first-chunk-check): the data of an untested SGLang release "
            f"goes unchecked; `hsmon verify-data {out} --backend hf --chunk rows_A-B` checks a chunk later")
        return None
    check = FirstChunkCheck(out, model, servers, stop_event)
    check.start()
    return check


class FirstChunkCheck(threading.Thread):
    """Waits for the first chunk with rows the run completes (``chunk_done``, from the writer
    thread), then runs verify-data on it. ``error`` holds the run's error after a disagreement."""

    def __init__(self, out: Path, model: Path, servers: list[Untested], stop_event: threading.Event,
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
            releases = ", ".join(f"{s.url} (SGLang {s.sglang_version}, {s.adapter})" for s in self.servers)
            log(f"first-chunk check: {chunk} of an untested SGLang release ({releases}) against "
                f"transformers: {' '.join(self.command(chunk)[1:])}")
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
            self.error = (f"first-chunk check: DISAGREE: layers {', '.join(report.get('differ', []))} of "
                          f"{chunk} differ from transformers ({self.model}): the untested SGLang release "
                          f"({releases}) does not capture what the model computes; the rows written are "
                          "kept but do not train on them: serve the target with a tested SGLang release "
                          "(docs/extract.md, \"Supported SGLang releases\"), or check the model given")
            self.stop_event.set()
        elif not self.stop_event.is_set():
            self.verdict = "failed"
            why = (err.strip().splitlines() or [f"exit status {status}"])[-1]
            log(f"first-chunk check: could not run ({why}); the run goes on UNCHECKED: run "
                f"`hsmon verify-data {self.out} --chunk {chunk}` where the model fits")
