"""The online tracker (hsmon/core/trackers/online.py) against real processes: the PID the trainer's
ledger names is the trainer only when its command line is a trainer's (a shared spool's trainer may
run on another host, where its PID here is some other program); a spool is found without config."""

from __future__ import annotations

import subprocess
import sys
import time

from hsmon.contracts import layout, spool
from hsmon.core.trackers.online import OnlineTracker


def ledger_start(out, pid: int) -> None:
    layout.append_jsonl(spool.ledger_path(out), [{"type": "start", "ts": time.time(), "pid": pid,
                                                  "passes": 1, "consume": True, "step": 0}])


def test_a_foreign_pid_is_not_the_trainer_and_a_trainer_gone_is_seen_gone(tmp_path):
    tracker = OnlineTracker(str(tmp_path))
    tracker.poll(0.0)
    assert tracker.facts(0.0, None, None) is None  # no spool file, no ledger: not an online job
    spool.write_spool_limit(tmp_path, 1_000_000)
    other = subprocess.Popen(["sleep", "30"])
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)  # hsmon train"])
    try:
        ledger_start(tmp_path, other.pid)
        tracker.poll(10.0)
        facts = tracker.facts(10.0, None, None)
        assert facts is not None and facts.limit_bytes == 1_000_000
        assert facts.trainer.pid == other.pid and facts.trainer.alive is None and not facts.trainer.seen_alive
        ledger_start(tmp_path, trainer.pid)  # a restart, this time the trainer of this host
        tracker.poll(11.0)
        facts = tracker.facts(11.0, None, None)
        assert facts.trainer.pid == trainer.pid and facts.trainer.alive is True and facts.trainer.seen_alive
        trainer.kill()
        trainer.wait()
        tracker.poll(12.0)
        facts = tracker.facts(12.0, None, None)
        assert facts.trainer.alive is False and facts.trainer.seen_alive
    finally:
        for p in (other, trainer):
            p.kill()
            p.wait()
