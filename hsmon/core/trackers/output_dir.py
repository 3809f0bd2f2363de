"""Output directory tracker: complete and in-progress chunks, rows, tokens, bytes.

Understands three layouts:
- ``hsmon``: the manifest (hsmon.contracts.layout) says what is done; read incrementally (append-only).
  Its ``run`` records carry the plan (rows, tokens, chunks in all) and a ``done``/``stopped``
  record says the latest run ended on purpose (``rows_total``, ``ending``, ... in the snapshot).
- ``specforge``: plain ``rows_{a}-{b}/data_{i}.ckpt`` written by another tool; every row file
  counts; a chunk is complete when it holds all its rows.
- ``speculators``: vLLM-speculators style ``hs_*.safetensors`` files
  (hsmon.core.trackers.speculators_files).
- ``regenerate``: `hsmon regenerate`'s dataset and manifest (hsmon.core.trackers.regen_files).
In-progress files are hidden temporaries (hsmon.contracts.layout.is_temporary). A directory whose mtime has
not changed is not listed again (only the newest chunk is, since files there may still grow).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from msgspec.structs import replace

from hsmon.contracts import layout, regen_layout
from hsmon.contracts.data_facts import DataFacts, DataSummary, summarize
from hsmon.contracts.manifest_reader import JsonlTail, Manifest
from hsmon.core.trackers.regen_files import RegenFiles
from hsmon.core.trackers.speculators_files import SpeculatorsFiles
from hsmon.status_doc import DataSection, OutputSection, Reading

log = logging.getLogger("hsmon.monitor")

# More unread manifest than this (~30,000 rows) is read on a thread when the caller allows it (the
# daemon, the TUI): the tracker answers meanwhile with how far the reading is.
BACKGROUND_BYTES = 16 * 1024 * 1024
# A directory listing is reused while the directory's mtime stays what it was, once the listing is
# this much younger than that mtime (a change within the clock's granularity moves it again).
LISTING_SETTLE_S = 1.0
ChunkDirs = list[tuple[tuple[int, int], str]]  # ((a, b), "rows_a-b"), sorted


@dataclass
class _DirInfo:
    mtime_ns: int
    rows: int
    bytes: int
    temps: int
    row_ids: set[int] = field(default_factory=set)


class OutputDirTracker:
    """Figures of one output directory. ``scan()`` runs on one thread (the monitor's tick); a large
    manifest may be read on a thread of its own meanwhile (``scan(background=True)``)."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self._lock = threading.Lock()
        self._manifests: dict[str, JsonlTail] = {}
        self._facts = DataFacts()  # per-layer statistics of the rows and chunks read
        self._manifest = Manifest(accumulators=[self._facts])
        self._dirs: dict[str, _DirInfo] = {}
        self._speculators = SpeculatorsFiles(self.path)
        self.regen: RegenFiles | None = None  # a regeneration's manifest, once one is seen
        self._snap: OutputSection = self._empty(False, None)
        self.scans_total = 0
        self.last_growth_ts: float | None = None
        self.rows_total_hint: int | None = None  # the manifests' plan (their 'run' records)
        self._runs: dict[str, layout.RunLog] = {}  # manifest name -> its latest run and ending
        self._plan: dict[str, Any] = layout.summarize_runs(())
        self.newest_mtime: float | None = None  # newest chunk dir or manifest: work before we watched
        # (inode, mtime_ns), when listed, names, manifests, chunk dirs: reused while the dir is unchanged
        self._listing: tuple[tuple[int, int], float, list[str], list[str], ChunkDirs] | None = None
        self._loader: threading.Thread | None = None
        self._loader_reset = False  # the loader met a replaced manifest: start over at the next scan
        self._closing = threading.Event()
        self._load_done = threading.Event()
        self.on_read: Callable[[], None] | None = None  # called by the reading thread when it is done

    @property
    def manifest(self) -> Manifest:
        """The running totals of the manifests read so far (for readers on the scanning thread)."""
        return self._manifest

    @property
    def loading(self) -> bool:
        """True while a manifest is read on a thread, or read and not yet taken in by ``scan``."""
        return self._loader is not None

    @property
    def reading(self) -> dict[str, Any] | None:
        """While a large manifest is read on a thread: how far ({"bytes_done", "bytes_total"})."""
        if self._loader is None or self._load_done.is_set():
            return None
        tails = list(self._manifests.values())
        return {"bytes_done": sum(t.offset for t in tails), "bytes_total": sum(t.size for t in tails)}

    def close(self) -> None:
        """Stop a manifest read in progress (a job no longer watched)."""
        self._closing.set()

    def _empty(self, exists: bool, error: str | None) -> OutputSection:
        return OutputSection(
            path=self.path,
            exists=exists,
            error=error,
            layout="empty",
            chunks_complete=0,
            chunks_in_progress=0,
            rows=0,
            tokens=0,
            bytes=0,
            temp_files=0,
            reading=None,
            **layout.summarize_runs(()),
        )

    def scan(self, background: bool = False) -> None:
        """Bring the figures up to date (cheap when little changed). With ``background``, more than
        BACKGROUND_BYTES of unread manifest is read on a thread; until it is done the snapshot
        says how far it is (``reading``) and carries no figures."""
        if self._loader is not None:
            if not self._load_done.is_set():
                self._publish_reading()
                return
            self._loader.join()
            self._loader = None
        if self._loader_reset:
            self._loader_reset = False
            self._reset()
        listing = self._list()
        if listing is None:
            return
        names, manifests, chunk_dirs = listing
        for name in manifests:
            self._manifests.setdefault(name, JsonlTail(os.path.join(self.path, name)))
        if background and self._unread(manifests) > BACKGROUND_BYTES:
            self._load_done.clear()
            self._loader = threading.Thread(target=self._load, args=(manifests,), daemon=True,
                                            name=f"hsmon-manifest-{os.path.basename(self.path)}")
            self._loader.start()
            self._publish_reading()
            return
        for name in manifests:
            _, reset = self._manifests[name].poll(self._handler(name))
            if reset:  # a replaced manifest: reread all of them
                self._reset()
                self.scan(background)
                return
        self._plan = layout.summarize_runs(self._runs[n] for n in manifests if n in self._runs)
        self.rows_total_hint = self._plan["rows_total"]
        newest = chunk_dirs[-1][1] if chunk_dirs else None
        for name in ([newest] if newest else []) + manifests:
            try:
                mtime = os.stat(os.path.join(self.path, name)).st_mtime
            except OSError:
                continue
            self.newest_mtime = max(mtime, self.newest_mtime or 0.0)
        live = set()
        for _, name in chunk_dirs:
            live.add(name)
            if manifests and name in self._manifest.chunks and name in self._dirs:
                continue  # complete per the manifest: nothing there changes any more
            self._scan_chunk_dir(name, force=name == newest)
        if len(self._dirs) > len(live):
            for name in list(self._dirs):
                if name not in live:
                    del self._dirs[name]
        if self.regen is None and regen_layout.MANIFEST_NAME in names:
            self.regen = RegenFiles(self.path)
        if self.regen is not None:
            self.regen.poll()
            snap = self.regen.section(self._empty(True, None))
            self.rows_total_hint = snap.rows_total
        elif manifests:
            snap = self._hsmon_figures(chunk_dirs)
        elif chunk_dirs:
            snap = self._specforge_figures(chunk_dirs)
        else:
            snap = self._speculators_figures(names)
        self._publish(snap)

    def _list(self) -> tuple[list[str], list[str], ChunkDirs] | None:
        """(names, manifests, chunk dirs) of the directory, from the cache while it is unchanged;
        None (an empty snapshot published) when it cannot be listed."""
        try:
            st = os.stat(self.path)
            key = (st.st_ino, st.st_mtime_ns)
            cached = self._listing
            if cached is not None and cached[0] == key and cached[1] - st.st_mtime > LISTING_SETTLE_S:
                return cached[2], cached[3], cached[4]
            listed_at = time.time()
            names = os.listdir(self.path)
        except FileNotFoundError:
            self._reset()
            self._publish(self._empty(False, None))
            return None
        except NotADirectoryError:
            self._publish(self._empty(True, f"{self.path} is not a directory"))
            return None
        except PermissionError:
            self._publish(self._empty(True, f"permission denied reading {self.path}"))
            return None
        manifests = sorted(n for n in names if n.startswith("hsmon-manifest") and n.endswith(".jsonl"))
        chunk_dirs = sorted((b, n) for n in names if (b := layout.parse_chunk_dir_name(n)))
        self._listing = (key, listed_at, names, manifests, chunk_dirs)
        return names, manifests, chunk_dirs

    def _unread(self, manifests: list[str]) -> int:
        unread = 0
        for name in manifests:
            tail = self._manifests[name]
            try:
                unread += max(0, os.stat(tail.path).st_size - tail.offset)
            except OSError:
                continue
        return unread

    def _handler(self, name: str) -> Callable[[dict[str, Any]], None]:
        """What to do with each record of manifest ``name``: the totals and that manifest's run log."""
        runs = self._runs.setdefault(name, layout.RunLog())
        add = self._manifest.add

        def handle(record: dict[str, Any]) -> None:
            add(record)
            if record.get("type") != "row":
                runs.add(record)

        return handle

    def _load(self, manifests: list[str]) -> None:
        """The reading thread: every manifest to its current end (the next scan reads the rest)."""
        try:
            for name in manifests:
                _, reset = self._manifests[name].poll(self._handler(name), stop=self._closing.is_set)
                if reset:
                    self._loader_reset = True
                    return
        except Exception:  # the next scan reads on (or over again) in the tick's thread
            log.exception("reading the manifests of %s failed", self.path)
            self._loader_reset = True
        self._load_done.set()
        if self.on_read is not None:
            self.on_read()

    def _publish_reading(self) -> None:
        """A snapshot that says the manifest is being read, and how far; no figures yet (a monitor
        must not take the rows read so far for rows written just now)."""
        reading = self.reading
        snap = replace(self._empty(True, None), layout="hsmon", chunks_complete=None, chunks_in_progress=None,
                       rows=None, tokens=None, bytes=None, temp_files=None,
                       reading=Reading(**reading) if reading is not None else None)
        with self._lock:
            self._snap = snap

    def data_summary(self) -> DataSummary | None:
        """The data facts ``decide`` judges (non-finite rows, drift); None while a background
        reading of the manifest is under way. Call from the scanning thread."""
        return None if self.loading else summarize(self._facts)

    def _reset(self) -> None:
        self._manifests.clear()
        self._runs.clear()
        self._facts = DataFacts()
        self._manifest = Manifest(accumulators=[self._facts])
        self._dirs.clear()
        self._speculators.clear()
        self.regen = None
        self._listing = None

    def _scan_chunk_dir(self, name: str, force: bool) -> None:
        path = os.path.join(self.path, name)
        try:
            mtime_ns = os.stat(path).st_mtime_ns
        except OSError:
            self._dirs.pop(name, None)
            return
        old = self._dirs.get(name)
        if old is not None and old.mtime_ns == mtime_ns and not force:
            return
        rows = nbytes = temps = 0
        row_ids: set[int] = set()
        try:
            with os.scandir(path) as it:
                for entry in it:
                    if layout.is_temporary(entry.name):
                        temps += 1
                        continue
                    row = layout.parse_row_file_name(entry.name)
                    if row is None:
                        continue
                    try:
                        nbytes += entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
                    rows += 1
                    row_ids.add(row)
        except OSError:
            return
        self._dirs[name] = _DirInfo(mtime_ns, rows, nbytes, temps, row_ids)

    def _hsmon_figures(self, chunk_dirs: list[tuple[tuple[int, int], str]]) -> OutputSection:
        m = self._manifest
        done_chunks = set(m.chunks)
        in_progress = sum(
            1
            for _, n in chunk_dirs
            if n not in done_chunks and self._dirs.get(n) and (self._dirs[n].rows or self._dirs[n].temps)
        )
        return replace(
            self._empty(True, None),
            layout="hsmon",
            chunks_complete=len(done_chunks),
            chunks_in_progress=in_progress,
            rows=len(m.rows),
            tokens=m.tokens,
            bytes=m.bytes,
            temp_files=sum(d.temps for d in self._dirs.values()),
            rejects=len(m.rejects),
            rejects_by_reason=dict(m.reject_classes),
            data=msgspec.convert(self._facts.snapshot(), DataSection),
            **self._plan,
        )

    def _specforge_figures(self, chunk_dirs: list[tuple[tuple[int, int], str]]) -> OutputSection:
        complete = in_progress = rows = nbytes = temps = 0
        for (a, b), name in chunk_dirs:
            info = self._dirs.get(name)
            if info is None:
                continue
            rows += info.rows
            nbytes += info.bytes
            temps += info.temps
            if info.rows >= b - a:
                complete += 1
            elif info.rows or info.temps:
                in_progress += 1
        return replace(
            self._empty(True, None),
            layout="specforge",
            chunks_complete=complete,
            chunks_in_progress=in_progress,
            rows=rows,
            tokens=None,
            bytes=nbytes,
            temp_files=temps,
        )

    def _speculators_figures(self, names: list[str]) -> OutputSection:
        snap = self._empty(True, None)
        found = self._speculators.count(names)
        if found is not None:
            snap = replace(snap, layout="speculators", chunks_complete=found.rows, rows=found.rows,
                           bytes=found.bytes, tokens=found.tokens, temp_files=found.temp_files)
        return snap

    def _publish(self, snap: OutputSection) -> None:
        with self._lock:
            old = self._snap
            first = self.scans_total == 0  # a baseline, not growth (e.g. a daemon restarted mid-job)
            self.scans_total += 1
            if (
                not first
                and (snap.rows, snap.bytes, snap.temp_files) != (old.rows, old.bytes, old.temp_files)
                and snap.exists
            ):
                self.last_growth_ts = time.time()
            self._snap = snap

    def snapshot(self) -> OutputSection:
        """The status document's ``output`` section (published whole, never changed after)."""
        with self._lock:
            return self._snap
