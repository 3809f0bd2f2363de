"""Ctrl-C anywhere, and a lost terminal, end what the command started.

Each command runs as a terminal's foreground job (a process group of its own: tests/stop_helpers.py)
and gets SIGINT (what Ctrl-C sends to the whole group) or SIGHUP (what the kernel and the shell send
when the terminal goes away) at a phase made to last by the test-only slow-downs (docs/development.md,
"Signals mid-run"). Then: the exit status 128 + the signal, one line on stderr saying how it
stopped (never a traceback), and nothing left: no process of its tree, no /dev/shm file one held.
Before: eval-drafter printed a 17-frame traceback; SIGHUP killed `hsmon train` without a
checkpoint; the headless demo's Ctrl-C left the training it had launched running (PID 1 adopted
it), and its lost terminal left the daemon running.
"""

from __future__ import annotations

import json
import re
import signal
import sys
from pathlib import Path

import pytest
import train_helpers
from extract_helpers import events_of, make_dataset, tiny_model  # noqa: F401
from regen_helpers import EMBEDDED, chat_rows, env, regen_cmd, write_rows
from stop_helpers import Foreground

from hsmon.contracts import writer_lock

pytestmark = pytest.mark.slow
REFERENCE_DRAFTER = Path(__file__).resolve().parents[1] / "hsmon" / "demo" / "reference-drafter"


@pytest.fixture(scope="module")
def extracted(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:  # noqa: F811
    """Rows of the tiny target in hsmon extract's layout (written in-process: the trainer is the
    process under test)."""
    data = tmp_path_factory.mktemp("rows") / "data"
    train_helpers.write_rows(tiny_model, data, train_helpers.markov_sequences(32, 40, seed=3))
    return data


def hsmon(*argv: str) -> list[str]:
    return [sys.executable, "-m", "hsmon", *argv]


def demo(base: Path) -> list[str]:
    return [sys.executable, "-m", "hsmon.demo", str(base), "--headless", "--interval", "1"]


def ended(job: Foreground, signum: int) -> str:
    """The command's status is 128 + ``signum``, its last stderr line says so, no traceback, nothing left."""
    code = job.wait()
    assert code == 128 + signum, job.output()
    lines = job.stderr_lines()
    assert "Traceback" not in job.stderr_path.read_text(), job.output()
    assert job.left() == ([], []), job.output()
    assert lines, job.output()
    return lines[-1]


def test_train_stopped_while_it_loads_ends_without_a_checkpoint(extracted: Path, tmp_path: Path,
                                                                tiny_model: Path) -> None:  # noqa: F811
    out = tmp_path / "drafter"
    job = Foreground(hsmon("train", str(extracted), "--out", str(out), "--target-model", str(tiny_model),
                           "--events", str(tmp_path / "events.jsonl"), "--threads", "1"), tmp_path,
                     env(HSMON_TRAIN_LOAD_DELAY_S="120"))
    job.wait_for(lambda: (out / writer_lock.TRAIN_LOCK).exists(), "the training holding its --out")
    job.signal(signal.SIGINT)
    last = ended(job, signal.SIGINT)
    assert re.fullmatch(r"hsmon train: stopped by SIGINT \(Ctrl-C\) at step 0 of \d+: nothing trained yet "
                        r"\(no checkpoint\): start it again as before", last), last
    assert not list(out.glob("checkpoints/step-*.pt"))
    assert events_of(tmp_path / "events.jsonl")[-1]["kind"] == "stopped"


def test_train_whose_terminal_went_away_checkpoints_and_says_how_to_resume(extracted: Path, tmp_path: Path,
                                                                           tiny_model: Path) -> None:  # noqa: F811
    out, events = tmp_path / "drafter", tmp_path / "events.jsonl"
    job = Foreground(hsmon("train", str(extracted), "--out", str(out), "--target-model", str(tiny_model),
                           "--events", str(events), "--threads", "1", "--epochs", "50"), tmp_path,
                     env(HSMON_TRAIN_STEP_DELAY_S="0.3"))
    job.wait_for(lambda: any(e["kind"] == "step" for e in events_of(events)), "a step")
    job.signal(signal.SIGHUP)
    last = ended(job, signal.SIGHUP)
    stopped = events_of(events)[-1]
    assert stopped["kind"] == "stopped" and stopped["signal"] == "SIGHUP", stopped
    step = stopped["step"]
    assert last == (f"hsmon train: stopped by SIGHUP (its terminal went away) at step {step} of "
                    f"{stopped['total_steps']}: rerun the same `hsmon train` command with --resume: it goes "
                    f"on from step {step}'s checkpoint"), last
    assert (out / "checkpoints" / f"step-{step:08d}.pt").is_file()
    assert not [line for line in job.stderr_lines() if line.startswith("{")], job.output()  # no raw JSON


def test_eval_drafter_stopped_while_loading_says_so_in_one_line(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"text": "def add(a, b):\n    return"}) + "\n")
    job = Foreground(hsmon("eval-drafter", "--drafter", str(REFERENCE_DRAFTER), "--target-model", "embedded",
                           "--prompts", str(prompts), "--threads", "1"), tmp_path,
                     env(HSMON_EVAL_DECODE_DELAY_S="60"))
    job.wait_for(lambda: "loading" in job.stderr_path.read_text(), "its loading line")
    job.signal(signal.SIGINT)
    last = ended(job, signal.SIGINT)
    assert re.fullmatch(r"hsmon eval-drafter: stopped by SIGINT \(Ctrl-C\) (while loading|after 0 of \d+ "
                        r"decodes); nothing is saved: rerun to measure", last), last


def test_eval_drafter_whose_terminal_went_away_records_stopped(tmp_path: Path) -> None:
    prompts, events = tmp_path / "prompts.jsonl", tmp_path / "eval.jsonl"
    prompts.write_text(json.dumps({"text": "def add(a, b):\n    return"}) + "\n")
    job = Foreground(hsmon("eval-drafter", "--drafter", str(REFERENCE_DRAFTER), "--target-model", "embedded",
                           "--prompts", str(prompts), "--threads", "1", "--depth", "3", "--max-new-tokens",
                           "8", "--events", str(events)), tmp_path, env(HSMON_EVAL_DECODE_DELAY_S="1"))
    job.wait_for(lambda: any(e["kind"] == "rows" for e in events_of(events)), "a decode")
    job.signal(signal.SIGHUP)
    last = ended(job, signal.SIGHUP)
    stopped = events_of(events)[-1]
    assert stopped["kind"] == "stopped" and stopped["signal"] == "SIGHUP", stopped
    assert last == (f"hsmon eval-drafter: stopped by SIGHUP (its terminal went away) after "
                    f"{stopped['rows_done']} of 7 decodes; nothing is saved: rerun to measure"), last


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
def test_regenerate_stopped_mid_run_records_it_and_leaves_nothing(tmp_path: Path, signum: int) -> None:
    data = write_rows(tmp_path / "chat.jsonl", chat_rows(12))
    out, events = tmp_path / "out", tmp_path / "events.jsonl"
    job = Foreground(regen_cmd(data, out, "--model", str(EMBEDDED), events=events), tmp_path,
                     env(HSMON_HF_FORWARD_DELAY_S="0.2"))
    job.wait_for(lambda: any(e["kind"] == "rows" for e in events_of(events)), "its first rows")
    job.signal(signum)
    last = ended(job, signum)
    stopped = events_of(events)[-1]
    assert stopped["kind"] == "stopped" and stopped["signal"] == signal.Signals(signum).name, stopped
    assert "stopped" in last and "resume" in last, last


def test_regenerate_stopped_while_its_model_loads_ends_in_one_line(tmp_path: Path) -> None:
    data = write_rows(tmp_path / "chat.jsonl", chat_rows(4))
    out, events = tmp_path / "out", tmp_path / "events.jsonl"
    job = Foreground(regen_cmd(data, out, "--model", str(EMBEDDED), events=events), tmp_path, env())
    job.wait_for(lambda: "answers) ->" in job.stderr_path.read_text(), "its plan, before the model loads")
    job.signal(signal.SIGINT)
    last = ended(job, signal.SIGINT)
    assert "stopped" in last and "SIGINT" in last, last


def test_online_whose_terminal_went_away_stops_both_sides(tmp_path: Path, tiny_model: Path) -> None:  # noqa: F811
    data = make_dataset(tmp_path / "data.jsonl", 300, min_lines=1, max_lines=2)
    out = tmp_path / "online"
    job = Foreground(hsmon("online", str(data), "--out", str(out), "--model", str(tiny_model), "--chunk-size",
                           "8", "--threads", "2", "--passes", "2", "--train-arg=--batch-tokens=512"),
                     tmp_path, env(HSMON_TRAIN_STEP_DELAY_S="0.3"))
    train_events = out / "spool" / "hsmon-train-events.jsonl"
    job.wait_for(lambda: any(e["kind"] == "step" for e in events_of(train_events)), "the trainer's step")
    job.signal(signal.SIGHUP)
    last = ended(job, signal.SIGHUP)
    assert last == ("hsmon online: stopping both sides (SIGHUP; resume with the same command and "
                    "--resume)"), last
    assert events_of(train_events)[-1]["kind"] == "stopped"


def test_the_headless_demo_stopped_by_ctrl_c_while_it_trains_leaves_no_process(tmp_path: Path) -> None:
    """Ctrl-C of the headless demo during the training. The training (in a
    session of its own: the daemon launched it) is stopped by the demo and writes its checkpoint
    first; the daemon stops; the demo exits 130 with one line saying what it stopped."""
    base = tmp_path / "demo"
    job = Foreground(demo(base), tmp_path, env(HSMON_DEMO_ROWS="60", HSMON_TRAIN_STEP_DELAY_S="0.5"))
    events = base / "drafter" / "events.jsonl"
    job.wait_for(lambda: any(e["kind"] == "step" for e in events_of(events)), "the training's first step")
    job.signal(signal.SIGINT)
    last = ended(job, signal.SIGINT)
    stopped = events_of(events)[-1]
    assert stopped["kind"] == "stopped" and stopped["signal"] == "SIGTERM", stopped  # from the demo
    step = stopped["step"]
    checkpoints = base / "drafter" / "checkpoints"
    assert last == (f"demo: stopped by SIGINT (Ctrl-C): stopped the training (at step {step} of "
                    f"{stopped['total_steps']}, its checkpoint in {checkpoints}) and the daemon; nothing "
                    "left running"), last
    assert (base / "drafter" / "checkpoints" / f"step-{step:08d}.pt").is_file()
    assert "Traceback" not in job.stdout_path.read_text()


def test_the_headless_demo_stopped_by_ctrl_c_while_it_evaluates_leaves_no_process(tmp_path: Path) -> None:
    """Ctrl-C of the headless demo during the held-out evaluation (eval-drafter in a session of its
    own, its decodes slowed): the demo stops it, and the evaluation records that it was stopped."""
    base = tmp_path / "demo"
    argv = [*demo(base), "--train-seconds", "2", "--eval-prompts", "1"]
    job = Foreground(argv, tmp_path, env(HSMON_DEMO_ROWS="24", HSMON_EVAL_DECODE_DELAY_S="1"))
    events = base / "eval-events.jsonl"
    job.wait_for(lambda: any(e["kind"] == "rows" for e in events_of(events)), "the first decode")
    job.signal(signal.SIGINT)
    last = ended(job, signal.SIGINT)
    assert last == ("demo: stopped by SIGINT (Ctrl-C): stopped the evaluation and the daemon; nothing "
                    "left running"), last
    assert events_of(events)[-1]["kind"] == "stopped", events_of(events)[-1]
    assert not (base / "acceptance.json").exists()


def test_the_demo_whose_terminal_went_away_while_it_extracts_leaves_no_process(tmp_path: Path) -> None:
    base = tmp_path / "demo"
    # batches of a second each, several of them: the first rows leave the extraction mid-run
    job = Foreground(demo(base), tmp_path, env(HSMON_DEMO_ROWS="150", HSMON_HF_FORWARD_DELAY_S="1"))
    job.wait_for(lambda: any(e["kind"] == "rows" for e in events_of(base / "events.jsonl")), "the first rows")
    job.signal(signal.SIGHUP)
    last = ended(job, signal.SIGHUP)
    assert last == ("demo: stopped by SIGHUP (its terminal went away): stopped the extraction and the "
                    "daemon; nothing left running"), last
    assert events_of(base / "events.jsonl")[-1]["kind"] == "stopped"
