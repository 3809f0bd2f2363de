"""Wording shared by `hsmon status` (hsmon/status_cli.py) and the dashboard (hsmon/tui): pure
functions of the typed status document (hsmon/status_doc), so that both say the same thing about
the same figure. No Textual or Rich here: `hsmon status` must not import them."""

from __future__ import annotations

from hsmon.status_doc import DiskEntry

WONT_FIT = "WILL NOT FIT"
FILLS_FIRST = "fills before done"


def disk_verdict(disk: DiskEntry) -> str:
    """Whether what the job still writes fits on a filesystem: 'WILL NOT FIT', 'fills before done'
    (at the current write rate it is full before the job is done), 'fits' or 'unknown'."""
    ttf, ttd = disk.time_to_full_s, disk.time_to_done_s
    if disk.fits is False:
        return WONT_FIT
    if ttf is not None and ttd is not None and ttf < ttd:
        return FILLS_FIRST
    return "fits" if disk.fits else "unknown"


def verdict_alarming(verdict: str) -> bool:
    """Whether a disk verdict is an alarm (it is said in red or yellow)."""
    return verdict in (WONT_FIT, FILLS_FIRST)
