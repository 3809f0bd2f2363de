"""What watching and resuming cost at 10k, 100k and 1 M rows: the monitor's cost must not grow with
the job.

For each size it builds a synthetic output directory with the project's own layout functions
(tests/synthetic_output.py: ``layout.append_jsonl`` and the extractor's ``ChunkBook``; a row record
with stats for 4 layers per row, a chunk record per 2,000 rows, no row files) and a pre-tokenized
dataset of the same rows, then measures, on real processes:

- ``hsmon daemon --out DIR``: time from its start to the first status that counts every row, its
  RSS then, its CPU while idle (``--idle-seconds``), the scrape time of /metrics (median of 200), and
  its CPU while rows are appended at 50 rows/s (``--append-seconds``; the status must count them);
- ``hsmon status --out DIR`` (one shot): wall time and peak RSS;
- ``hsmon extract DATA --out DIR --dry-run`` over that manifest (the resume's scan and bookkeeping)
  and over an empty directory, each with an empty scan cache: wall time and peak RSS, and the
  difference; then the resume again with the dataset's scan cached (``resume_cached``).

Ends with one RESULT line: the figures of the largest size and their ratio to the smallest's.

    .venv/bin/python bench/scale.py                       # 10k, 100k and 1M rows
    .venv/bin/python bench/scale.py --rows 10000 100000   # while developing
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from synthetic_output import row_record, write_synthetic_output  # noqa: E402

from hsmon.contracts import layout  # noqa: E402

PY = sys.executable
LAST_CPU_S = [0.0]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
APPEND_RATE = 50.0  # rows/s
GOALS = ("daemon RSS at the largest size <= 1.5x the smallest's and <= 150 MB; idle CPU <= 0.5 %; "
         "CPU while appending 50 rows/s <= 2 %; scrape <= 1.2x; status --out <= 10 s and <= 200 MB; "
         "resume bookkeeping <= 200 MB over an empty directory")


def write_dataset(path: Path, rows: int, seed: int = 0) -> list[int]:
    """A pre-tokenized dataset (no tokenizer cost: the scan measured is the manifest's); lengths."""
    rng = random.Random(seed)
    lengths = [rng.randint(8, 40) for _ in range(rows)]
    with open(path, "w") as fh:
        for n in lengths:
            fh.write(json.dumps({"input_ids": [rng.randint(3, 250) for _ in range(n)]}) + "\n")
    return lengths


def extract_settings(data: Path, scratch: Path) -> dict[str, Any]:
    """The run settings `hsmon extract` records for ``data`` (prepare() itself, so a resume matches)."""
    from extractor.cli import add_arguments
    from extractor.prepare import prepare

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    saved = os.environ.get("HSMON_CACHE")
    os.environ["HSMON_CACHE"] = str(scratch / "cache-probe")  # the scan cache: not the user's
    try:
        return prepare(parser.parse_args([str(data), "--out", str(scratch / "settings-probe")])).settings
    finally:
        if saved is None:
            os.environ.pop("HSMON_CACHE", None)
        else:
            os.environ["HSMON_CACHE"] = saved


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def get(url: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


# Runs a command and reports its peak RSS. A small launcher of its own: a child forked from this
# (large) process would report this process's RSS as its peak (the high-water mark survives exec).
LAUNCHER = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
            "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
            "print('CPU_S', u.ru_utime + u.ru_stime, 'PEAK_RSS_KB', u.ru_maxrss); sys.exit(code)")


def timed_child(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int, int, str]:
    """(wall s, peak RSS bytes, exit status, output) of a child process; its CPU seconds are in
    ``LAST_CPU_S`` (wall time on a loaded machine says little)."""
    started = time.perf_counter()
    proc = subprocess.run([PY, "-c", LAUNCHER, *cmd], env={**ENV, **(env or {})}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - started
    text, _, tail = proc.stdout.rpartition("CPU_S ")
    cpu, _, peak = tail.split()[:3]
    LAST_CPU_S[0] = float(cpu)
    return wall, int(peak) * 1024, proc.returncode, text


def measure_daemon(out: Path, rows: int, args: argparse.Namespace, work: Path) -> dict[str, float]:
    port_file = work / "port"
    port_file.unlink(missing_ok=True)
    started = time.perf_counter()
    proc = subprocess.Popen([PY, "-m", "hsmon", "daemon", "--out", str(out), "--port", "0",
                             "--port-file", str(port_file), "--job", "scale", "--log-level", "WARNING"],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    fig: dict[str, float] = {}
    try:
        while not port_file.exists():
            if proc.poll() is not None or time.perf_counter() - started > 120:
                raise RuntimeError("the daemon did not start")
            time.sleep(0.02)
        base = f"http://127.0.0.1:{int(port_file.read_text())}"
        answered: float | None = None
        while True:
            doc = json.loads(get(f"{base}/api/v1/status"))
            answered = answered or time.perf_counter() - started
            output = doc["jobs"][0].get("output") or {}
            if output.get("rows") == rows:
                break
            if time.perf_counter() - started > 600:
                raise RuntimeError(f"no correct status after 600 s: {output}")
            time.sleep(0.05)
        fig["first_answer_s"] = answered
        fig["first_status_s"] = time.perf_counter() - started
        time.sleep(3)  # let the reading's garbage go
        fig["rss_mb"] = proc_rss(proc.pid) / 1e6
        cpu0, t0 = proc_cpu_s(proc.pid), time.perf_counter()
        time.sleep(args.idle_seconds)
        fig["idle_cpu_pct"] = 100 * (proc_cpu_s(proc.pid) - cpu0) / (time.perf_counter() - t0)
        for _ in range(20):  # warm up
            get(f"{base}/metrics")
        samples = []
        for _ in range(200):
            t = time.perf_counter()
            get(f"{base}/metrics")
            samples.append((time.perf_counter() - t) * 1000)
        fig["scrape_ms"] = statistics.median(samples)
        fig["append_cpu_pct"], appended = append_rows(out, rows, proc.pid, args.append_seconds)
        deadline = time.perf_counter() + 30
        while time.perf_counter() < deadline:
            output = json.loads(get(f"{base}/api/v1/status"))["jobs"][0]["output"]
            if output["rows"] == rows + appended:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"the daemon counts {output['rows']} rows, {rows + appended} were written")
        fig["rss_after_append_mb"] = proc_rss(proc.pid) / 1e6
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return fig


def append_rows(out: Path, first: int, pid: int, seconds: float) -> tuple[float, int]:
    """Append row records at APPEND_RATE (one fsynced append each, as the writer's batches are);
    returns (the daemon's CPU % meanwhile, rows appended)."""
    rng = random.Random(7)
    manifest = out / layout.MANIFEST_NAME
    n = int(seconds * APPEND_RATE)
    cpu0, t0 = proc_cpu_s(pid), time.perf_counter()
    for i in range(n):
        layout.append_jsonl(manifest, [row_record(first + i, layout.DEFAULT_CHUNK_SIZE, rng)])
        time.sleep(max(0.0, t0 + (i + 1) / APPEND_RATE - time.perf_counter()))
    return 100 * (proc_cpu_s(pid) - cpu0) / (time.perf_counter() - t0), n


def measure_size(rows: int, args: argparse.Namespace, work: Path) -> dict[str, float]:
    size_dir = work / f"rows{rows}"
    size_dir.mkdir()
    data = size_dir / "data.jsonl"
    t = time.perf_counter()
    lengths = write_dataset(data, rows)
    settings = extract_settings(data, size_dir)
    out = size_dir / "out"
    write_synthetic_output(out, rows, settings=settings, lengths=lengths)
    mb = (out / layout.MANIFEST_NAME).stat().st_size / 1e6
    print(f"[{rows} rows] built in {time.perf_counter() - t:.0f} s: manifest {mb:.0f} MB", flush=True)
    fig = {"manifest_mb": mb}
    extract = [PY, "-m", "hsmon", "extract", str(data), "--dry-run"]
    # each with a scan cache of its own, empty: both scan the dataset, the resume reads the manifest too
    wall, peak, code, text = timed_child([*extract, "--out", str(size_dir / "empty")],
                                         {"HSMON_CACHE": str(size_dir / "cache-fresh")})
    fig["fresh_s"], fig["fresh_cpu_s"], fig["fresh_rss_mb"] = wall, LAST_CPU_S[0], peak / 1e6
    for key in ("resume", "resume_cached"):  # the scan cache cold, then warm
        wall, peak, code, text = timed_child([*extract, "--out", str(out)],
                                             {"HSMON_CACHE": str(size_dir / "cache-resume")})
        if "rows to extract 0" not in text:
            raise RuntimeError(f"the resume's dry run did not see every row done ({code}):\n{text[-2000:]}")
        fig[f"{key}_s"], fig[f"{key}_cpu_s"], fig[f"{key}_rss_mb"] = wall, LAST_CPU_S[0], peak / 1e6
    fig["resume_over_fresh_mb"] = fig["resume_rss_mb"] - fig["fresh_rss_mb"]
    wall, peak, code, text = timed_child([PY, "-m", "hsmon", "status", "--out", str(out), "--job", "scale"])
    if f" {rows} rows" not in text:
        raise RuntimeError(f"hsmon status --out did not count {rows} rows (exit {code}):\n{text[-2000:]}")
    fig["status_s"], fig["status_cpu_s"], fig["status_rss_mb"] = wall, LAST_CPU_S[0], peak / 1e6
    fig.update(measure_daemon(out, rows, args, size_dir))
    print(f"[{rows} rows] " + ", ".join(f"{k} {v:.3g}" for k, v in fig.items())
          + f" (load average now {os.getloadavg()[0]:.2f})", flush=True)
    if not args.keep:
        shutil.rmtree(size_dir)
    return fig


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--append-seconds", type=float, default=30.0)
    parser.add_argument("--keep", action="store_true", help="keep the synthetic directories")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(f"load average before: {load:.2f} on {os.cpu_count()} CPUs", flush=True)
    work = Path(tempfile.mkdtemp(prefix="hsmon-scale-"))
    try:
        results = {rows: measure_size(rows, args, work) for rows in sorted(args.rows)}
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    keys = list(next(iter(results.values())))
    print(f"\n{'figure':<22}" + "".join(f"{r:>14,}" for r in results))
    for key in keys:
        print(f"{key:<22}" + "".join(f"{results[r][key]:>14.3f}" for r in results))
    small, big = min(results), max(results)
    ratio = {k: results[big][k] / results[small][k] if results[small][k] else float("nan") for k in keys}
    print(f"goals: {GOALS}")
    fields = [f"rows={big}", f"baseline_rows={small}"]
    fields += [f"{k}={results[big][k]:.3f}" for k in keys]
    ratios = ("rss_mb", "idle_cpu_pct", "scrape_ms", "first_status_s", "status_s", "status_cpu_s",
              "status_rss_mb", "resume_s", "resume_cpu_s", "resume_rss_mb", "append_cpu_pct")
    fields += [f"{k}_ratio={ratio[k]:.2f}" for k in ratios]
    fields.append(f"load={load:.2f}")
    print("RESULT " + " ".join(fields))
    return 0


if __name__ == "__main__":
    sys.exit(main())
