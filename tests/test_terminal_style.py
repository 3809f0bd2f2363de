"""One terminal style for every long command: each on a real pseudo-terminal (or the dashboard in
tmux), read as a person reads it. `hsmon train` printed a 500-character JSON event per step there;
eval-drafter showed nothing while it loaded and measured; `hsmon run` printed nothing, not even
where its log went; `hsmon tui` without an argument failed where `hsmon status` reads 127.0.0.1:9108;
a misspelled --out got 14 lines of usage."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from extract_helpers import tiny_model  # noqa: F401
from regen_helpers import env
from train_helpers import markov_sequences, write_rows

pytestmark = pytest.mark.slow
REFERENCE_DRAFTER = Path(__file__).resolve().parents[1] / "hsmon" / "demo" / "reference-drafter"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def hsmon(*argv: str) -> list[str]:
    return [sys.executable, "-m", "hsmon", *argv]


def on_terminal(argv: list[str], extra_env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``argv`` with a pseudo-terminal as its stdin, stdout and stderr; (exit status, what the
    terminal showed, its control codes removed)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the command on the terminal
        os.execvpe(argv[0], argv, {**env(), "COLUMNS": "160", **(extra_env or {})})
    chunks = []
    with contextlib.suppress(OSError):
        while data := os.read(fd, 65536):
            chunks.append(data)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), ANSI.sub("", b"".join(chunks).decode(errors="replace"))


def test_train_on_a_terminal_draws_a_line_and_writes_its_events_to_a_file(tmp_path: Path,
                                                                          tiny_model: Path) -> None:  # noqa: F811
    write_rows(tiny_model, tmp_path / "data", markov_sequences(24, 40, seed=4))  # the extractor's layout
    out = tmp_path / "drafter"
    code, text = on_terminal(hsmon("train", str(tmp_path / "data"), "--out", str(out), "--target-model",
                                   str(tiny_model), "--max-steps", "6", "--threads", "1"))
    assert code == 0, text
    assert '{"v":' not in text and '"kind"' not in text, text  # no raw JSON on the screen
    assert f"hsmon train: events -> {out / 'events.jsonl'}" in text, text
    assert re.search(r"train .*100% 6/6 steps loss \d+\.\d+ · acc \d+%", text), text
    assert "hsmon train: done: 6 steps" in text, text
    kinds = [json.loads(line)["kind"] for line in (out / "events.jsonl").read_text().splitlines()]
    assert kinds[0] == "start" and kinds[-1] == "done" and kinds.count("step") == 6, kinds


def test_eval_drafter_on_a_terminal_says_what_it_loads_and_counts_its_decodes(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"text": "def add(a, b):\n    return"}) + "\n")
    code, text = on_terminal(hsmon("eval-drafter", "--drafter", str(REFERENCE_DRAFTER), "--target-model",
                                   "embedded", "--prompts", str(prompts), "--depth", "2", "--max-new-tokens",
                                   "8", "--threads", "1"))
    assert code == 0, text
    assert "hsmon eval-drafter: loading the target" in text, text
    assert re.search(r"eval-drafter .*100% 5/5 decodes", text), text  # 1 prompt x (greedy + 2 x 2 depths)
    assert "mean acceptance length" in text, text


def test_run_on_a_terminal_says_where_its_output_goes_and_how_it_ended(tmp_path: Path) -> None:
    events, log = tmp_path / "job.events.jsonl", tmp_path / "job.log"
    code, text = on_terminal(hsmon("run", "--events", str(events), "--log", str(log), "--", sys.executable,
                                   "-c", "print('hello from the script')"))
    assert code == 0, text
    assert f"its output -> {log}, events -> {events}" in text, text
    ended = rf"hsmon run: python done after \S+, exit status 0; its output: {re.escape(str(log))}"
    assert re.search(ended, text), text
    assert "hello from the script" in log.read_text()


def test_a_misspelled_required_option_gets_did_you_mean() -> None:
    done = subprocess.run([sys.executable, "-m", "hsmon", "train", "data", "--otu", "x"], capture_output=True,
                          text=True, timeout=60, env=env())
    assert done.returncode == 2 and done.stderr == ("hsmon train: unrecognized argument --otu: did you mean "
                                                    "--out? (`hsmon train --help` lists the options)\n")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (make test installs it)")
def test_the_dashboard_without_an_argument_reads_the_daemon_of_this_machine(tmp_path: Path) -> None:
    from test_tui_e2e import Terminal

    command = f"env PYTHONPATH={env()['PYTHONPATH']} TERM=xterm-256color {sys.executable} -m hsmon tui"
    term = Terminal(f"{command}; echo TUI-EXITED-$?; sleep 60", 100, 30)
    try:
        term.wait_for(lambda s: "127.0.0.1:9108" in s, "the default daemon's address", timeout=60)
        term.keys("q")
        term.wait_for(lambda s: "TUI-EXITED-0" in s, "the dashboard ending on q")
    finally:
        term.close()
