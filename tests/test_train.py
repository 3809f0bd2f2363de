"""hsmon train / export-drafter / eval-drafter on a tiny trained target and data made from it."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from sglang_helpers import assert_sglang_loads_export
from train_helpers import make_tiny_target, markov_sequences, write_rows

from hsmon.contracts.events import iter_events
from hsmon.contracts.layout import MANIFEST_NAME
from hsmon.status_doc.numbers import fmt_num
from trainer.data import RowRef, build_draft_vocab, build_index, plan_epoch
from trainer.loop import STEP_DELAY_ENV
from trainer.speculative import ngram_draft

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--threads", "1", "--heartbeat", "0.3"]

torch.set_num_threads(1)


def hsmon(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "hsmon", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"hsmon {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def hsmon_together(*commands: list[str], timeout: float = 300,
                   umasks: tuple[int, ...] = ()) -> list[subprocess.CompletedProcess]:
    """Run independent ``hsmon`` commands at the same time (each with ``--threads 1`` or no torch
    work to share: on 2 cores the second one costs little) and check each exits 0, as `hsmon` does.
    ``umasks``: the umask of each command in turn (the rest inherit this process's)."""
    procs = [
        subprocess.Popen([sys.executable, "-m", "hsmon", *args], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=(lambda mask=mask: os.umask(mask)) if mask is not None else None)
        for args, mask in itertools.zip_longest(commands, umasks[:len(commands)])
    ]
    results = []
    try:
        for args, proc in zip(commands, procs, strict=True):
            out, err = proc.communicate(timeout=timeout)
            if proc.returncode != 0:
                raise AssertionError(f"hsmon {' '.join(args)} failed ({proc.returncode}):\n{err[-3000:]}")
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(target dir, data dir, prompts file): a tiny trained Llama and 64 extracted rows."""
    base = tmp_path_factory.mktemp("train")
    target = make_tiny_target(base / "target")
    data = base / "data"
    write_rows(target, data, markov_sequences(64, 56, seed=1))
    prompts = base / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"input_ids": s[:10]}) + "\n" for s in markov_sequences(4, 20, seed=5))
    )
    return target, data, prompts


def train_args(setup, out: Path, *extra: str) -> list[str]:
    target, data, _ = setup
    return [
        "train",
        str(data),
        "--target-model",
        str(target),
        "--out",
        str(out),
        "--batch-tokens",
        "512",
        "--lr",
        "3e-3",
        *FAST,
        *extra,
    ]


def model_state(out: Path) -> dict[str, torch.Tensor]:
    from trainer.checkpoint import latest_checkpoint, load_checkpoint

    return load_checkpoint(latest_checkpoint(out))


# ---------- pure pieces ----------


def test_draft_vocab_keeps_the_most_frequent_trained_tokens():
    counts = Counter({7: 50, 3: 40, 9: 30, 1: 1})
    d2t, t2d = build_draft_vocab(counts, vocab_size=12, draft_vocab_size=3)
    chosen = (torch.arange(3) + d2t).tolist()
    assert chosen == [3, 7, 9]
    assert t2d.nonzero().flatten().tolist() == chosen
    # smaller data than the draft vocab: topped up with unused ids, still a valid mapping
    d2t, t2d = build_draft_vocab(counts, vocab_size=12, draft_vocab_size=6)
    assert sorted((torch.arange(6) + d2t).tolist()) == (torch.arange(6) + d2t).tolist()
    assert int(t2d.sum()) == 6 and {1, 3, 7, 9} <= set(t2d.nonzero().flatten().tolist())
    # default: sized to the data (at least 256), never above the target vocabulary
    assert build_draft_vocab(counts, vocab_size=100, draft_vocab_size=None)[0].shape[0] == 100


def test_default_draft_vocab_covers_99_percent_of_the_trained_tokens():
    from trainer.data import draft_vocab_for

    # 100 frequent tokens (10,000 of 12,000) and 2000 seen once: 99 % takes 1880 of the rare ones,
    # 1980 tokens in all, rounded up to a multiple of 64
    counts = Counter({t: 1 for t in range(2000)} | {t: 100 for t in range(2000, 2100)})
    assert draft_vocab_for(counts, vocab_size=50_000) == 1984
    assert draft_vocab_for(Counter({1: 5, 2: 3}), vocab_size=50_000) == 256  # the floor
    assert draft_vocab_for(Counter({1: 5, 2: 3}), vocab_size=100) == 100  # the target's vocabulary
    assert draft_vocab_for(Counter({t: 1 for t in range(90_000)}), vocab_size=100_000) == 32_000
    assert draft_vocab_for(Counter(), vocab_size=50_000) == 32_000  # nothing counted: the cap


def test_epoch_plan_covers_every_row_once_within_the_token_budget():
    rows = [RowRef(f"r{i}", i, length) for i, length in enumerate([5, 80, 33, 12, 64, 7, 100, 41] * 10)]
    plan = plan_epoch(rows, batch_tokens=200, seed=3, epoch=1, window=16)
    flat = [i for batch in plan for i in batch]
    assert sorted(flat) == list(range(len(rows)))
    for batch in plan:
        assert len(batch) == 1 or max(rows[i].length for i in batch) * len(batch) <= 200
    assert plan == plan_epoch(rows, batch_tokens=200, seed=3, epoch=1, window=16)
    assert plan != plan_epoch(rows, batch_tokens=200, seed=3, epoch=2, window=16)
    # length bucketing: padding stays far below what random batching would waste
    padded = sum(max(rows[i].length for i in b) * len(b) for b in plan)
    real = sum(r.length for r in rows)
    assert padded < 1.3 * real


def test_ngram_drafter_proposes_what_followed_the_suffix_before():
    assert ngram_draft([1, 2, 3, 4, 9, 2, 3], depth=3, max_n=3) == [4, 9, 2]
    assert ngram_draft([5, 6, 7], depth=3, max_n=3) == []
    assert ngram_draft([1, 2, 1], depth=1, max_n=3) == [2]
    # a repeating pattern is continued past the end of what has been seen
    assert ngram_draft([7, 5, 6, 5, 6], depth=5, max_n=3) == [5, 6, 5, 6, 5]


# ---------- data over the layout ----------


def test_index_reads_only_rows_the_manifest_lists(setup, tmp_path):
    target, _, _ = setup
    data = tmp_path / "data"
    write_rows(target, data, markov_sequences(6, 20, seed=2))
    # a row written but never recorded (a crash before the manifest append) and a temporary file
    write_rows(target, data, markov_sequences(1, 20, seed=3), manifest=False, first_row=6)
    (data / "rows_0-8" / ".data_7.ckpt.tmp-123").write_bytes(b"partial")
    index = build_index(data)
    assert sorted(r.row for r in index.rows) == list(range(6))
    assert index.hidden_size == 32 and index.num_aux == 3
    # a SpecForge layout without a manifest: every readable row counts
    (data / MANIFEST_NAME).unlink()
    assert sorted(r.row for r in build_index(data).rows) == list(range(7))


def test_index_lists_the_manifest_rows_and_reads_only_a_sample(setup, tmp_path, monkeypatch):
    import trainer.data as data_mod

    target, _, _ = setup
    data = tmp_path / "data"
    sequences = markov_sequences(9, 20, seed=4)
    write_rows(target, data, sequences)
    (data / "rows_0-8" / "data_4.ckpt").unlink()  # listed in the manifest but gone
    loaded = []
    real_load = data_mod.load_row
    monkeypatch.setattr(data_mod, "load_row", lambda path: loaded.append(path) or real_load(path))
    monkeypatch.setattr(data_mod, "VOCAB_SAMPLE_ROWS", 3)
    index = build_index(data)
    assert [r.row for r in index.rows] == [0, 1, 2, 3, 5, 6, 7, 8]
    assert all(r.length == len(sequences[r.row]) for r in index.rows) and index.hidden_size == 32
    assert len(loaded) == 3 and sum(index.token_counts.values()) > 0


def test_train_rejects_bad_input_with_one_line_errors(setup, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    target, _, _ = setup
    proc = hsmon(
        "train", str(empty), "--target-model", str(target), "--out", str(tmp_path / "o"), check=False
    )
    assert (
        proc.returncode == 2
        and "no complete rows" in proc.stderr
        and len(proc.stderr.strip().splitlines()) == 1
    )
    proc = hsmon(
        "train",
        str(tmp_path / "missing"),
        "--target-model",
        str(target),
        "--out",
        str(tmp_path / "o"),
        check=False,
    )
    assert proc.returncode == 2 and "not a directory" in proc.stderr
    proc = hsmon(
        "train", str(empty), "--target-model", str(tmp_path), "--out", str(tmp_path / "o"), check=False
    )
    assert proc.returncode == 2 and "no config.json" in proc.stderr


# ---------- training ----------


@pytest.mark.slow
def test_training_emits_events_and_learns(setup, tmp_path):
    out = tmp_path / "run"
    events = tmp_path / "events.jsonl"
    hsmon(
        *train_args(
            setup,
            out,
            "--max-steps",
            "40",
            "--events",
            str(events),
            "--eval-every",
            "20",
            "--checkpoint-every",
            "20",
        )
    )
    evs = list(iter_events(events))
    kinds = Counter(e["kind"] for e in evs)
    assert kinds["start"] == 1 and kinds["done"] == 1 and kinds["step"] == 40
    assert kinds["checkpoint"] >= 2 and kinds["eval"] >= 2 and kinds["heartbeat"] >= 1
    steps = [e for e in evs if e["kind"] == "step"]
    assert all(len(e["losses"]) == 7 and len(e["accs"]) == 7 and e["tokens_s"] > 0 for e in steps)
    assert 0 <= steps[-1]["data_wait_frac"] <= 1
    evals = [e for e in evs if e["kind"] == "eval"]
    # step-0 accuracy on held-out rows beats chance (1/48) by far, and the loss went down
    assert evals[-1]["accs"][0] > 0.3
    assert evals[-1]["loss"] < evals[0]["loss"] or steps[-1]["loss"] < steps[0]["loss"]
    assert steps[-1]["loss"] < steps[0]["loss"]
    # a run that learnt: its last line gives the loss and the estimate, and no advice
    done = [e for e in evs if e["kind"] == "done"][-1]
    assert done["advice"] is None and done["accept_len_est"] > 1.1


@pytest.mark.slow
def test_sigterm_checkpoints_and_resume_matches_an_uninterrupted_run(setup, tmp_path):
    steps = "24"
    whole = tmp_path / "whole"
    cut = tmp_path / "cut"
    events = tmp_path / "cut.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hsmon",
            *train_args(
                setup, cut, "--max-steps", steps, "--checkpoint-every", "10", "--events", str(events)
            ),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # steps held 0.3 s each: the SIGTERM sent at step 3 lands before step 24 whatever the machine
        env={**os.environ, "HSMON_TRAIN_STEP_DELAY_S": "0.3"},
    )
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            done = [e for e in iter_events(events) if e["kind"] == "step"] if events.exists() else []
            if done and done[-1]["step"] >= 3:
                break
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 143, proc.communicate()[1][-2000:]  # 128 + SIGTERM: stopped
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    evs = list(iter_events(events))
    stopped = [e for e in evs if e["kind"] == "stopped"]
    assert stopped and stopped[0]["step"] < int(steps) and stopped[0]["signal"] == "SIGTERM"
    assert stopped[0]["total_steps"] == int(steps) and "--resume" in stopped[0]["resume"]
    assert evs[-2]["kind"] == "checkpoint" and evs[-2]["step"] == stopped[0]["step"]
    assert not any(e["kind"] == "done" for e in evs)

    # the uninterrupted run and the resume are independent: side by side
    hsmon_together(
        train_args(setup, whole, "--max-steps", steps, "--checkpoint-every", "10",
                   "--events", str(tmp_path / "whole.jsonl")),
        train_args(setup, cut, "--max-steps", steps, "--checkpoint-every", "10", "--events", str(events),
                   "--resume"),
    )  # fmt: skip
    evs = list(iter_events(events))
    assert evs[-1]["kind"] == "done" and evs[-1]["step"] == int(steps)
    starts = [e for e in evs if e["kind"] == "start"]
    assert starts[-1]["start_step"] == stopped[0]["step"]
    a, b = model_state(whole), model_state(cut)
    assert a["step"] == b["step"] == int(steps)
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values(), strict=True):
        assert torch.equal(sa["exp_avg"], sb["exp_avg"])


def test_a_run_that_learnt_nothing_says_no_speed_up_yet_in_its_last_line(setup, tmp_path):
    """One step at a low learning rate leaves the drafter at chance: the last line says so, with
    what to change, and the done event carries the same advice (the TUI shows it)."""
    events = tmp_path / "events.jsonl"
    proc = hsmon(*train_args(setup, tmp_path / "run", "--max-steps", "1", "--lr", "1e-4",
                             "--events", str(events)))
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("no speed-up yet: estimated acceptance length 1.0"), proc.stderr
    assert "more --epochs" in last and "raise --lr (this run 0.0001, default 0.002)" in last
    done = [e for e in iter_events(events) if e["kind"] == "done"][-1]
    assert done["advice"] == last and done["accept_len_est"] < 1.1


def test_a_trainings_eta_holds_against_its_real_end(setup, tmp_path):
    """Several epochs at a steady step time (HSMON_TRAIN_STEP_DELAY_S makes each step 0.25 s on any
    machine): read from the events up to each step, as the daemon reads them, the ETA is the steps
    left at the phase's measured step rate, within a third of the time the run really took from
    there, also past the first epoch (where the rows' tokens are all done once)."""
    from hsmon.core.trackers.progress import ProgressTracker

    events = tmp_path / "events.jsonl"
    env = {**os.environ, STEP_DELAY_ENV: "0.25"}
    proc = subprocess.run([sys.executable, "-m", "hsmon", *train_args(
        setup, tmp_path / "run", "--epochs", "3", "--events", str(events))],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = events.read_text().splitlines()
    kinds = [json.loads(line)["kind"] for line in lines]
    steps = [i for i, kind in enumerate(kinds) if kind == "step"]
    last_step_ts = json.loads(lines[steps[-1]])["ts"]
    total = json.loads(lines[steps[0]])["total_steps"]
    assert total >= 9 and len(steps) == total
    for at in (steps[total // 3], steps[total // 2], steps[2 * total // 3]):
        partial = tmp_path / "partial.jsonl"
        partial.write_text("\n".join(lines[: at + 1]) + "\n")
        tracker = ProgressTracker(str(partial))
        tracker.poll()
        step = json.loads(lines[at])
        eta = tracker.snapshot(step["ts"]).progress.eta_s
        real = last_step_ts - step["ts"]
        assert eta is not None and abs(eta - real) <= real / 3 + 0.3, (step["step"], total, eta, real)


@pytest.mark.slow
def test_eagle31_trains_resumes_as_itself_and_refuses_another_arch(setup, tmp_path):
    out, events = tmp_path / "e31", tmp_path / "e31.jsonl"
    hsmon(*train_args(setup, out, "--arch", "eagle3.1", "--max-steps", "2", "--events", str(events)))
    state = model_state(out)
    assert {"fc_norm.0.weight", "fc_norm.2.weight"} <= set(state["model"])
    assert state["drafter_config"]["fc_norm"] is state["drafter_config"]["norm_output"] is True
    # a resume without --arch keeps the checkpoint's; another --arch is refused in one line
    hsmon(*train_args(setup, out, "--resume", "--max-steps", "3", "--events", str(events)))
    starts = [e for e in iter_events(events) if e["kind"] == "start"]
    assert [e["arch"] for e in starts] == ["eagle3.1", "eagle3.1"] and starts[-1]["start_step"] == 2
    proc = hsmon(*train_args(setup, out, "--resume", "--arch", "eagle3", "--max-steps", "4"), check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "eagle3.1 drafter, --arch asks for eagle3" in proc.stderr
    assert model_state(out)["step"] == 3


@pytest.mark.slow
def test_ddp_two_cpu_processes_on_gloo(setup, tmp_path):
    out = tmp_path / "ddp"
    events = tmp_path / "ddp.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "hsmon",
        *train_args(setup, out, "--max-steps", "6", "--events", str(events)),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    evs = list(iter_events(events))
    kinds = Counter(e["kind"] for e in evs)
    assert kinds["start"] == 1 and kinds["done"] == 1 and kinds["step"] == 6  # rank 0 alone writes
    start = next(e for e in evs if e["kind"] == "start")
    done = next(e for e in evs if e["kind"] == "done")
    assert start["world_size"] == 2 and done["ranks_in_sync"] is True
    # both ranks' tokens are counted: more than one rank's batches could hold
    steps = [e for e in evs if e["kind"] == "step"]
    assert max(b["tokens"] - a["tokens"] for a, b in itertools.pairwise(steps)) > 0
    assert model_state(out)["world_size"] == 2


# ---------- export for SGLang, acceptance ----------


@pytest.fixture(scope="module")
def trained(setup, tmp_path_factory):
    """An EAGLE 3 drafter (the architecture named: the default is eagle3.1, tested on its own) trained
    for 80 steps and one trained for a single step, both exported: the first under umask 022 (as
    most users run), the second under 077."""
    base = tmp_path_factory.mktemp("trained")
    runs = {"trained": "80", "untrained": "1"}
    # the two trainings are independent: run side by side, then both exports
    hsmon_together(*(
        train_args(setup, base / name, "--arch", "eagle3", "--max-steps", steps, "--events",
                   str(base / f"{name}.jsonl"))
        for name, steps in runs.items()
    ))
    hsmon_together(*(
        ["export-drafter", str(base / name), "--out", str(base / f"{name}-export")] for name in runs
    ), umasks=(0o022, 0o077))
    return {name: base / f"{name}-export" for name in runs}


@pytest.mark.slow
def test_export_layout(trained):
    export = trained["trained"]
    config = json.loads((export / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["num_hidden_layers"] == 1 and config["draft_vocab_size"] == 48
    from safetensors import safe_open

    with safe_open(str(export / "model.safetensors"), framework="pt") as fh:
        names = set(fh.keys())
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= names
    assert all(
        n.startswith("midlayer.")
        for n in names - {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}
    )
    # the training's own held-out estimate, recorded for the daemon to hold the served acceptance against
    done = [e for e in iter_events(export.parent / "trained.jsonl") if e["kind"] == "done"][-1]
    estimate = config["hsmon_estimate"]
    assert estimate["eval_accs"] == pytest.approx(done["eval_accs"]) and estimate["step"] == done["step"]
    assert estimate["accept_length"]["7"] == pytest.approx(done["accept_len_est"], abs=1e-3)
    lengths = estimate["accept_length"]
    assert 1.0 <= lengths["1"] <= lengths["3"] <= lengths["7"]


@pytest.mark.slow
def test_an_export_is_readable_by_others_as_the_umask_allows(trained):
    """An SGLang server running as another user must read the drafter: written under umask 022 its
    files are 0644 and its directory 0755 (safetensors alone writes 0600); under 077 it stays private."""
    for name, file_mode, dir_mode in (("trained", 0o644, 0o755), ("untrained", 0o600, 0o700)):
        export = trained[name]
        assert export.stat().st_mode & 0o777 == dir_mode, name
        for file in ("model.safetensors", "config.json"):
            mode = (export / file).stat().st_mode & 0o777
            assert mode == file_mode, (name, file, oct(mode))


@pytest.mark.slow
@pytest.mark.sglang
def test_sglang_own_eagle3_class_loads_every_exported_tensor(trained):
    assert_sglang_loads_export(trained["trained"])


def _assert_an_evaluation_shows_its_own_figures(events: Path, seen: list[dict], result: dict, tmp_path: Path):
    """Mid-measurement (its events up to the drafter's last decode at depth 3 of the first prompt
    set), the monitor and the dashboard show an evaluation's own figures: decodes, the tokens
    decoded against those planned, and the acceptance so far (not 'tokens 0 / ?')."""
    from hsmon.status_doc import decode
    from hsmon.tui.view import acceptance_so_far, status_line

    at = 4 * (1 + 3)  # the first set's 4 prompts: greedy, then the drafter at depths 1, 2, 3
    assert seen[at]["drafter"] == "eagle3" and seen[at]["depth"] == 3 and seen[at + 1]["drafter"] == "ngram"
    expected = result["sets"]["prompts"]["acceptance_length"]["eagle3"]["3"]
    assert seen[at]["accept_len"] == pytest.approx(expected, abs=1e-4)
    partial = tmp_path / "partial.jsonl"
    partial.write_text("".join(line + "\n" for line in events.read_text().splitlines()[:at + 1]))
    proc = subprocess.run([sys.executable, "-m", "hsmon", "status", "--events", str(partial), "--json"],
                          capture_output=True, timeout=60, cwd=ROOT)
    (job,) = decode(proc.stdout).jobs
    decoded = sum(e["tokens"] for e in seen[1:at + 1])
    assert job.progress.tokens_done == decoded > 0 and job.progress.tokens_total == seen[0]["tokens_total"]
    assert acceptance_so_far(job) == f"drafter {fmt_num(seen[at]['accept_len'])} at depth 3"
    line = status_line(job)
    assert f"decodes {at} / {seen[0]['rows_total']}" in line and "acceptance so far: drafter " in line, line


@pytest.mark.slow
def test_eval_drafter_trained_beats_untrained(setup, trained, tmp_path):
    target, _, prompts = setup
    longer = tmp_path / "longer.jsonl"  # a second prompt set, reported apart
    longer.write_text("".join(json.dumps({"input_ids": s}) + "\n" for s in markov_sequences(2, 40, seed=9)))
    results = {}
    names = list(trained)
    procs = hsmon_together(*(
        ["eval-drafter", "--drafter", str(trained[name]), "--target-model", str(target), "--prompts",
         str(prompts), "--prompts", str(longer), "--depth", "3", "--max-new-tokens", "24", "--json",
         "--threads", "1",
         "--events", str(tmp_path / f"{name}.events.jsonl")]
        for name in names
    ))
    for name, proc in zip(names, procs, strict=True):
        events = tmp_path / f"{name}.events.jsonl"
        results[name] = json.loads(proc.stdout)
        # the measurement as a job: start, one rows event per decode, then eval and done with the result
        seen = [json.loads(line) for line in events.read_text().splitlines()]
        kinds = [e["kind"] for e in seen]
        total = seen[0]["rows_total"]
        assert seen[0]["backend"] == "eval-drafter" and seen[0]["job"] == "eval-drafter"
        assert kinds == ["start"] + ["rows"] * total + ["eval", "done"], kinds
        assert total == seen[0]["prompts"] * (1 + 2 * 3) and seen[total]["rows_done"] == total
        assert seen[0]["prompts"] == 4 + 2 and set(results[name]["sets"]) == {"prompts", "longer"}
        assert results[name]["sets"]["longer"]["prompts"] == 2 and results[name]["arch"] == "eagle3"
        assert results[name]["sets"]["prompts"]["acceptance_length"] == results[name]["acceptance_length"]
        lengths = results[name]["acceptance_length"]
        assert seen[-2]["acceptance_length"] == seen[-1]["acceptance_length"] == lengths
        _assert_an_evaluation_shows_its_own_figures(events, seen, results[name], tmp_path)
    good, bad = results["trained"], results["untrained"]
    for res in (good, bad):
        assert (
            set(res["acceptance_length"]["eagle3"])
            == set(res["acceptance_length"]["ngram"])
            == {"1", "2", "3"}
        )
        assert res["outputs_match_greedy"] is True
        assert all(1.0 <= v <= 4.0 for v in res["acceptance_length"]["eagle3"].values())
        for name, depths in res["per_prompt"].items():  # per prompt [accepted, rounds], summing to the figure
            for d, pairs in depths.items():
                assert len(pairs) == res["prompts"]
                acc, rounds = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
                assert (acc + rounds) / rounds == pytest.approx(res["acceptance_length"][name][d])
    assert good["acceptance_length"]["eagle3"]["3"] > bad["acceptance_length"]["eagle3"]["3"] + 0.3
    assert good["acceptance_length"]["ngram"] == bad["acceptance_length"]["ngram"]


@pytest.mark.slow
def test_end_to_end_from_hsmon_extract(setup, tmp_path):
    """hsmon extract's own output trains, exports and loads, with the capture layers carried over."""
    target, _, _ = setup
    dataset = tmp_path / "rows.jsonl"
    seqs = markov_sequences(12, 40, seed=11)
    dataset.write_text(
        "".join(json.dumps({"input_ids": s, "loss_mask": [0] * 4 + [1] * (len(s) - 4)}) + "\n" for s in seqs)
    )
    data = tmp_path / "extracted"
    hsmon(
        "extract",
        str(dataset),
        "--out",
        str(data),
        "--model",
        str(target),
        "--events",
        str(tmp_path / "extract.jsonl"),
    )
    events = tmp_path / "train.jsonl"
    hsmon(
        *train_args(setup, tmp_path / "run", "--max-steps", "4", "--events", str(events))[:1],
        str(data),
        *train_args(setup, tmp_path / "run", "--max-steps", "4", "--events", str(events))[2:],
    )
    start = next(e for e in iter_events(events) if e["kind"] == "start")
    assert start["total_rows"] + start["eval_rows"] == 12
    hsmon("export-drafter", str(tmp_path / "run"), "--out", str(tmp_path / "export"), "--dtype", "float32")
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    # capture points 2, 4, 5 of the 8-layer target are SGLang layer ids 1, 3, 4
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert config["hsmon_capture"]["engine"] == "sglang"
    # for vLLM (docs/vllm.md): its layer id is the point; the engine is recorded for the serving side
    hsmon("export-drafter", str(tmp_path / "run"), "--out", str(tmp_path / "export-vllm"),
          "--engine", "vllm")
    config = json.loads((tmp_path / "export-vllm" / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert config["hsmon_capture"] == {"capture_points": [2, 4, 5], "engine": "vllm", "rule": "vllm",
                                       "serving_class": "LlamaForCausalLM", "layer_ids": [2, 4, 5]}
