"""Before the first launch through a daemon: is a control token set on both sides, and the same?

One probe, ``POST /api/v1/train`` with an empty body (refused before anything starts: 403 when
the daemon has no token, 401 when the one sent is missing or wrong, 400 once the token passes),
and one message that names every side that is missing, with the commands that fix it.
"""

from __future__ import annotations

MAKE_TOKEN = ("make one: umask 077; python3 -c 'import secrets; print(secrets.token_urlsafe(32))' "
              "> ~/.hsmon-token")
TUI_SIDE = "the TUI's (start it with --token-file ~/.hsmon-token, or set $HSMON_CONTROL_TOKEN)"
DAEMON_SIDE = "the daemon's (restart hsmon daemon with --control-token-file ~/.hsmon-token)"


def control_problem(status_code: int | None, have_token: bool, label: str) -> str | None:
    """What stops a launch through the daemon at ``label``, from the probe's answer (None: the
    token passes). ``status_code`` None: the daemon did not answer."""
    if status_code is None:
        return f"{label}: the daemon did not answer; is it running?"
    missing = []
    if not have_token:
        missing.append(TUI_SIDE)
    if status_code == 403:
        missing.append(DAEMON_SIDE)
    if missing:
        return (f"launching through {label} needs the same control token on both sides; missing: "
                f"{' and '.join(missing)}; {MAKE_TOKEN} (docs/tui.md, \"Connect\")")
    if status_code == 401:
        return (f"{label} refused this TUI's control token: give the TUI (--token-file) the file "
                "the daemon reads (--control-token-file)")
    return None
