"""Keep the daemon's answers prompt while its tick thread works: one process, one GIL.

A scrape or a status request is served on its own thread, which blocks on the socket a few
times per request and must take the GIL back after each wait. While the tick thread runs Python
(a tick over 20 jobs, /metrics rendered for the next scrapes), every retake waits up to the
interpreter's switch interval (5 ms by default), so a scrape that costs 1.5 ms took 9-18 ms
whenever it met a tick. A shorter interval bounds that wait; it costs the tick thread a few more
handovers, and only while another thread wants the GIL.

A full garbage collection holds the GIL for its whole pass, and most objects it walks are the
modules, classes and functions loaded at start, which never become garbage: frozen
(``gc.freeze``), they are left out of every later pass (a reload's collection, the automatic
ones the ticks' allocations trigger).
"""

from __future__ import annotations

import gc
import sys

SWITCH_INTERVAL_S = 0.001


def settle_for_serving() -> None:
    """Call once the daemon's modules are loaded and before its jobs are built (their objects stay
    collectable: a job a reload removes is freed whole)."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    gc.collect()
    gc.freeze()
