"""`make demo` for real: `hsmon extract` on the embedded default, `hsmon daemon` watching it, the
drafter training launched through the daemon and `hsmon eval-drafter`: headless (what CI runs), and
the real TUI in tmux (a 5 s training and one eval prompt, to stay fast), read with capture-pane."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_tui_e2e import Terminal, repo_env
from tui_screen_text import empty_rows_above_footer, long_floats

pytestmark = pytest.mark.slow


def test_demo_headless_extracts_trains_through_the_daemon_and_evaluates(tmp_path: Path) -> None:
    """The whole demo, headless: extraction to DONE, the training launched through the daemon to
    DONE, eval-drafter's acceptance lengths in the summary. A 5 s training (as in the tmux test: it
    ends with a held-out eval all the same) keeps it near a minute."""
    result = subprocess.run(
        [
            sys.executable, "-m", "hsmon.demo", str(tmp_path / "demo"),
            "--headless", "--interval", "1", "--train-seconds", "5",
        ],
        cwd=tmp_path,
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    lines = out.splitlines()
    assert any("extract: RUNNING" in line and "tok/s" in line for line in lines), out
    done = [line for line in lines if "extract: DONE" in line]
    assert done, out
    rows = re.search(r"rows (\d+) / (\d+)", done[-1])
    assert rows and rows.group(1) == rows.group(2)  # every row of the sample, as the daemon counted it
    assert any(line.endswith("the daemon says done: OK") and "extraction exited 0" in line for line in lines)
    # the training is a job of the daemon: launched through its API, followed to done by it
    assert any("training train-drafter launched through 127.0.0.1:" in line for line in lines), out
    assert any("train-drafter: RUNNING" in line and "step " in line for line in lines), out
    assert any("train-drafter: DONE" in line for line in lines), out
    assert any("training train-drafter: the daemon says done: OK" in line for line in lines), out
    assert (tmp_path / "demo" / "drafter" / "train.pid").is_file()
    steps = re.search(r"training +(\d+) steps, ([\d.]+) s", out)
    assert steps and int(steps.group(1)) > 0 and float(steps.group(2)) > 0, out
    held = re.search(r"held out +(\d+) of (\d+) extracted rows, not trained on .*; 4 held-out prompts", out)
    assert held and 0 < int(held.group(1)) < int(held.group(2)), out
    accs = re.search(r"held-out accuracy per draft position +(.+)", out)
    assert accs and all(0 <= float(a) <= 1 for a in accs.group(1).split()), out
    figures = {}
    for name, note in (("EAGLE-3", "this demo's"), ("EAGLE-3", "reference drafter: the same command trained"),
                       ("n-gram", "prompt lookup")):  # fmt: skip
        match = re.search(rf"{name} drafter +depth 1 (\d+\.\d+) +depth 7 (\d+\.\d+) +{note}", out)
        assert match, out
        figures[note] = (float(match.group(1)), float(match.group(2)))
        # one target forward yields at least its own token and at most the 7 drafted plus it
        assert 1.0 <= figures[note][0] <= 2.0 and 1.0 <= figures[note][1] <= 8.0, figures
    assert "outputs equal greedy: yes" in out
    assert any(line.startswith("  meaning: tokens each verifying target forward yields") for line in lines)
    # the held-out prompts are requests the target answers, both evaluations saw the same outputs
    prompts = (tmp_path / "demo" / "heldout-prompts.jsonl").read_text().splitlines()
    assert len(prompts) == 4 and all("Write a Python function" in p for p in prompts)
    mine = json.loads((tmp_path / "demo" / "acceptance.json").read_text())
    ref = json.loads((tmp_path / "demo" / "acceptance-reference.json").read_text())
    assert mine["greedy_outputs"] == ref["greedy_outputs"] and mine["outputs_match_greedy"]
    assert lines[-1].startswith("demo: OK")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (make test installs it)")
def test_demo_tui_in_tmux_shows_the_finished_training_and_its_acceptance(tmp_path: Path) -> None:
    """The real TUI in tmux at 120x40 through the whole demo (a 5 s training, eval-drafter on one
    prompt): eval-drafter is a job of the dashboard while it runs, the demo ends with a banner over
    its summary (on screen until q or escape, not a notice that fades), and the finished-training
    screen shows DONE without an ETA, the held-out eval and the acceptance table, in readable numbers."""
    env = repo_env()
    command = (
        f"cd {tmp_path} && env PYTHONPATH={env['PYTHONPATH']} TERM=xterm-256color "
        f"{sys.executable} -m hsmon.demo {tmp_path / 'demo'} --train-seconds 5 --eval-prompts 1; "
        "echo DEMO-EXITED-$?; sleep 600"
    )
    term = Terminal(command, 120, 40)
    try:
        term.wait_for(lambda s: "RUNNING" in s and "extractor" in s, "the extraction running", timeout=300)
        # the training screen comes up by itself at the launch
        term.wait_for(lambda s: "train-drafter" in s and "launch a drafter" in s, "the training", timeout=300)
        term.wait_for(lambda s: "eval-drafter" in s and "measuring acceptance" in s, "the eval", timeout=300)
        banner = term.wait_for(lambda s: "demo: OK: every step went through" in s, "the banner", timeout=300)
        assert "summary" in banner and re.search(r"EAGLE-3 drafter +depth 1 \d\.\d+ +depth 7 \d\.\d+", banner)
        assert "q quits" in banner, banner
        term.keys("Escape")  # back to the dashboard, the training screen as the demo left it
        screen = term.wait_for(lambda s: "acceptance: tokens per" in s and "demo: OK" not in s,
                               "the acceptance")
        lines = screen.splitlines()
        badge = next(line for line in lines if "train-drafter" in line and "elapsed" in line)
        assert "DONE" in badge and "ETA" not in badge, screen  # a finished training has no ETA
        assert "held-out eval at step" in screen and re.search(r"acc +(\d+(\.\d+)?%\s+){7}", screen), screen
        for name in ("drafter", "n-gram"):
            row = re.search(rf"│ +{name} +((?:\d+\.\d+ +){{6}}\d+\.\d+)", screen)
            assert row, screen
            assert all(1.0 <= float(v) <= 8.0 for v in row.group(1).split()), row.group(0)
        assert not long_floats(lines), long_floats(lines)
        assert empty_rows_above_footer(lines) <= 2, screen
        term.keys("o")
        term.wait_for(lambda s: "eval-drafter @ local" in s, "the eval-drafter tab")
        term.keys("q")
        screen = term.wait_for(lambda s: "DEMO-EXITED-0" in s, "the demo ending cleanly after q")
        assert re.search(r"EAGLE-3 drafter +depth 1 \d\.\d+ +depth 7 \d\.\d+", screen), screen
        assert "demo: OK" in screen, screen
    finally:
        term.close()
