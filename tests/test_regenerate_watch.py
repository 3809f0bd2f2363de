"""A regeneration watched like an extraction: a real `hsmon regenerate` (in-process, the embedded
target, each decoding step slowed so that the run lasts a few seconds whatever the machine) under a
real `hsmon daemon` given only its events file and output directory; the dashboard (`hsmon tui`'s
app in a pilot) on that daemon shows its panel while it runs; the status document, /metrics and the
webhook carry its figures once it is done."""

from __future__ import annotations

import subprocess
import urllib.request

import pytest
from daemon_helpers import Daemon, Procs, WebhookReceiver, wait_until
from regen_helpers import chat_rows, env, regen_cmd, write_rows
from textual.widgets import TabbedContent

from hsmon.tui.app import HsmonApp
from hsmon.tui.sources import HttpStatusSource
from hsmon.tui.widgets.regenerate_panel import RegeneratePanel

ROWS = 8


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("regen-watch")
    procs = Procs()
    hook = WebhookReceiver()
    try:
        data = write_rows(tmp / "chat.jsonl", chat_rows(ROWS, start=60))
        out, events = tmp / "regen", tmp / "events.jsonl"
        regen = procs.start(regen_cmd(data, out, "--job", "regen", events=events), stdout=subprocess.DEVNULL,
                            stderr=open(tmp / "regen.err", "wb"),  # noqa: SIM115
                            env=env(HSMON_HF_FORWARD_DELAY_S="0.03"))
        daemon = Daemon(procs, tmp, ["--job", "regen", "--events", str(events), "--out", str(out),
                                     "--scan-interval", "0.5", "--notify-webhook", hook.url])
        yield {"daemon": daemon, "regen": regen, "hook": hook, "out": out}
    finally:
        procs.close()
        hook.close()


def screen(app: HsmonApp) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


@pytest.mark.asyncio
async def test_the_dashboard_shows_the_regeneration_panel_while_it_runs(watched):
    app = HsmonApp([HttpStatusSource(watched["daemon"].url, interval=0.3)])
    async with app.run_test(size=(150, 48)) as pilot:
        async def until(condition, what: str, timeout: float = 120.0) -> None:
            for _ in range(int(timeout / 0.1)):
                if condition():
                    return
                await pilot.pause(0.1)
            raise AssertionError(f"timed out waiting for {what}: {screen(app)}")

        await until(lambda: app.documents and app.query(TabbedContent).first().display, "the first document")
        await until(lambda: app.query(RegeneratePanel) and app.query_one(RegeneratePanel).display
                    and "mean answer" in screen(app), "the regeneration panel with answers")
        text = screen(app)
        assert "regenerate: the target's own answers" in text and "from its manifest" in text
        assert "answers" in text and "stopped by themselves" in text and "mean answer" in text
        assert "regen (regenerate)" in text  # the job's kind in its header
        assert "regenerator" in text  # its process, by its role
        await until(lambda: "DONE" in screen(app), "the job done")
        assert f"{ROWS} / {ROWS}" in screen(app)


def test_the_status_document_metrics_and_webhook_carry_its_figures(watched):
    daemon = watched["daemon"]
    assert watched["regen"].wait(timeout=300) == 0
    job = wait_until(lambda: (j := daemon.job()) and j["state"] == "done" and j, 60, what="the job done")
    assert job["kind"] == "regenerate" and job["output"]["layout"] == "regenerate"
    regen = job["regenerate"]
    assert regen["rows_done"] == ROWS and regen["rows_total"] == ROWS and regen["source"] == "manifest"
    assert sum(regen["finish"].values()) == regen["answers"] > ROWS  # two-turn rows answer twice
    assert regen["generated_tokens"] > 0 and regen["eta_s"] == 0
    assert regen["mean_source_tokens"] > 0 and 0 < regen["mean_answer_tokens"] <= 24
    assert job["processes"][0]["role"] == "regenerator"
    with urllib.request.urlopen(daemon.url + "/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    assert f'hsmon_regenerate_rows_done{{job="regen"}} {float(ROWS)}' in metrics
    assert 'hsmon_job_info{job="regen",kind="regenerate"} 1.0' in metrics
    cut = regen["finish"].get("length", 0)
    assert f'hsmon_regenerate_answers_total{{finish="length",job="regen"}} {float(cut)}' in metrics
    done = wait_until(lambda: [b for b in watched["hook"].bodies if b.get("state") == "done"], 30,
                      what="the done webhook")
    body = done[-1]
    assert body["kind"] == "regenerate" and body["regenerate"]
    assert body["regenerate"][0].startswith(f"answers {regen['answers']}")
