"""A training's figures read the same in `hsmon status`, a webhook and the dashboard's training
tab: a real `hsmon train` (two steps on a tiny target) watched by a real `hsmon daemon` that posts
to a real webhook receiver; the TUI reads the same daemon. No float longer than 4 decimals, the
learning rate once in one notation, and no extraction counters (rows, chunks) for a training."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_helpers import Daemon, Procs, WebhookReceiver, wait_until
from test_tui_pilot import screen_text, wait_for
from train_helpers import make_tiny_target, markov_sequences, write_rows

from hsmon.status_doc.figures import fmt_acc, fmt_loss, fmt_lr
from hsmon.tui.app import HsmonApp
from hsmon.tui.sources import HttpStatusSource

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
LONG_FLOAT = re.compile(r"\d\.\d{5,}")  # more than 4 decimals: a raw float
LR = re.compile(r"\blr ([^\s;,]+)")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """(daemon, the webhook's done body): a two-step training, watched from before its start to its end."""
    base = tmp_path_factory.mktemp("figures")
    target = make_tiny_target(base / "target", train_steps=0)
    write_rows(target, base / "data", markov_sequences(16, 40, seed=1))
    events = base / "train-events.jsonl"
    procs, hook = Procs(), WebhookReceiver()
    try:
        daemon = Daemon(procs, base, ["--job", "tr", "--kind", "train", "--events", str(events),
                                      "--scan-interval", "0.2", "--notify-webhook", hook.url])
        subprocess.run([sys.executable, "-m", "hsmon", "train", str(base / "data"), "--target-model",
                        str(target), "--out", str(base / "drafter"), "--batch-tokens", "256", "--lr", "3e-3",
                        "--threads", "1", "--heartbeat", "0.3", "--max-steps", "2", "--events", str(events)],
                       check=True, capture_output=True, cwd=ROOT, timeout=300)
        body = wait_until(lambda: next((b for b in hook.bodies if b["state"] == "done"), None), 20,
                          what="the done webhook")
        yield daemon, body
    finally:
        procs.close()
        hook.close()


def status_text(daemon: Daemon) -> str:
    proc = subprocess.run([sys.executable, "-m", "hsmon", "status", "--url", daemon.url],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_status_and_the_webhook_write_the_same_figures(finished):
    daemon, body = finished
    training = daemon.job()["training"]
    texts = body["training"]
    assert texts[0].startswith("step 2 / 2, epoch 0, ") and texts[0].endswith(" tok/s"), texts
    assert f"loss {fmt_loss(training['loss'])}" in texts and f"acc {fmt_acc(training['acc'])}" in texts
    assert re.fullmatch(r"\d\.\d{3} \(pos 0\), mean \d\.\d{3}", fmt_loss(training["loss"]))
    assert f"lr {fmt_lr(training['lr'])}" in texts
    text = status_text(daemon)
    for figure in texts:
        assert figure in text, (figure, text)
    assert not LONG_FLOAT.search(text) and not LONG_FLOAT.search(" ".join(texts)), text
    lr = fmt_lr(training["lr"])
    assert LR.findall(text) == [lr] and re.fullmatch(r"\d(\.\d+)?e-\d+", lr), (lr, text)


def test_a_finished_training_shows_steps_not_extraction_counters(finished):
    text = status_text(finished[0])
    labels = [line.split()[0] for line in text.splitlines() if line.startswith("  ")]
    assert "training" in labels and "took" in labels, text
    assert not {"rows", "chunks", "tokens", "rate"} & set(labels), text
    assert "ETA" not in text  # an ended job has none


@pytest.mark.asyncio
async def test_the_dashboard_shows_steps_and_the_same_strings(finished):
    daemon, body = finished
    app = HsmonApp([HttpStatusSource(daemon.url, interval=0.3)])
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: "2 / 2 (100.0%)" in screen_text(app), 20)
        overview = screen_text(app)  # the training's progress panel counts steps, not rows or chunks
        assert re.search(r"steps\s+━+ 2 / 2 \(100\.0%\)", overview), overview
        assert not re.search(r"\b(rows|chunks|tokens)\s+[━─]", overview), overview
        # one loss: the event log's step line says the loss the training tab shows (the first draft
        # position's), never the weighted sum under the same name
        loss = fmt_loss(daemon.job()["training"]["loss"]).split(" (pos 0)")[0]
        assert f"step 2/2: loss {loss}, acc " in overview, overview
        await pilot.press("t")
        await wait_for(pilot, lambda: body["training"][1] in screen_text(app), 10)
        text = screen_text(app)
        assert f"loss {loss} (pos 0), mean " in text, text
        # "step" is the optimizer's alone: the plot's rows are the draft positions
        assert "│ pos 0 " in text and "│ pos 1 " in text, text
        assert not re.search(r"│ step \d +[▁▂▃▄▅▆▇█]", text), text
        for figure in body["training"]:
            assert figure in text, (figure, text)
        assert not LONG_FLOAT.search(text), text
        lrs = LR.findall(text)  # the running figure and the form's default: one notation
        assert lrs and all(re.fullmatch(r"\d(\.\d+)?e-\d+", lr) for lr in lrs), lrs
