"""The daemon's interpreter settings for prompt answers (hsmon/daemon/scrape_latency.py), in a fresh
interpreter as the daemon runs them: a short switch interval, and the start-up objects frozen out
of every later collection while the objects made after it stay collectable."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import gc, sys, weakref
import hsmon.core.monitor, hsmon.metrics.exporter
assert sys.getswitchinterval() == 0.005
from hsmon.daemon.scrape_latency import settle_for_serving, SWITCH_INTERVAL_S
settle_for_serving()
assert sys.getswitchinterval() == SWITCH_INTERVAL_S < 0.005, sys.getswitchinterval()
frozen = gc.get_freeze_count()
assert frozen > 10_000, frozen  # the modules' objects: what a full pass no longer walks

class Job:  # made after the freeze: a cycle of them is still collected
    pass
job = Job(); job.me = job
gone = weakref.ref(job)
del job
gc.collect()
assert gone() is None
print("ok", frozen)
"""


def test_the_daemon_settings_shorten_the_switch_and_freeze_only_the_start_up_objects():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok ")
