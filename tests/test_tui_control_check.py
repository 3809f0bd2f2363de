"""Before its first launch through a daemon, the TUI checks both sides of the control token and says
everything missing in one message, with the commands (hsmon/tui/control_check.py), against real
daemons: one without a token, one with; the TUI's real source, with and without its own."""

from __future__ import annotations

from daemon_helpers import Daemon, procs  # noqa: F401

from hsmon.tui.control_check import MAKE_TOKEN
from hsmon.tui.sources import HttpStatusSource

TOKEN = "a-control-token-0123456789"


def test_every_missing_side_of_the_control_token_in_one_message(procs, tmp_path):  # noqa: F811
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    plain = Daemon(procs, tmp_path, ["--events", str(tmp_path / "none.jsonl")])
    guarded = Daemon(procs, tmp_path, ["--control-token-file", str(token_file)])
    fields = {"data_dir": str(tmp_path), "out_dir": str(tmp_path / "drafter")}

    both = HttpStatusSource(plain.url).launch_training(fields).message
    assert "--token-file" in both and "--control-token-file" in both and MAKE_TOKEN in both, both
    assert len(both.splitlines()) == 1
    daemon_side = HttpStatusSource(plain.url, token=TOKEN).launch_training(fields).message
    assert "--control-token-file" in daemon_side and "the TUI's" not in daemon_side, daemon_side
    tui_side = HttpStatusSource(guarded.url).launch_training(fields).message
    assert "--token-file" in tui_side and "--control-token-file" not in tui_side, tui_side
    wrong = HttpStatusSource(guarded.url, token="another-token-0123456789").launch_training(fields)
    assert not wrong.ok and "refused this TUI's control token" in wrong.message
    # the token passes: what remains is the form's own errors (nothing launched, no token message)
    good = HttpStatusSource(guarded.url, token=TOKEN).launch_training(fields)
    assert not good.ok and "token" not in good.message and good.errors, good
