"""The systemd form of `hsmon run` that docs/daemon.md shows (a drop-in on the hsmon-extract@ unit):
installed into a temporary root beside the real units, `systemd-analyze verify` accepts it with no
warning, and its command is one that `hsmon run`'s own parser takes."""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_helpers import child_env

from hsmon import runner
from hsmon.install_units import default_hsmon

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze missing: run `make sysdeps`"
)


def documented_drop_in() -> tuple[str, str]:
    """(its path, its text) as docs/daemon.md shows them."""
    text = (REPO / "docs" / "daemon.md").read_text()
    block = re.search(r"```ini\n# (/etc/systemd/system/\S+\.conf)\n(.*?)```", text, re.S)
    assert block, "docs/daemon.md lost its hsmon run drop-in"
    return block.group(1), block.group(2)


def test_documented_drop_in_verifies_and_parses(tmp_path):
    root = tmp_path / "root"
    res = subprocess.run(
        [sys.executable, "-m", "hsmon", "install-units", "--prefix", str(root), "--user", "hsmon",
         "--data-dir", "/data/hs", "--hsmon", default_hsmon()],
        capture_output=True, text=True, timeout=60, env=child_env(),
    )
    assert res.returncode == 0, res.stderr
    path, text = documented_drop_in()
    # the documented install paths, made real on this machine (systemd checks the executable)
    text = text.replace("/opt/hsmon/bin/hsmon", default_hsmon())
    drop_in = root / path.lstrip("/")
    drop_in.parent.mkdir(parents=True)
    drop_in.write_text(text)
    unit = drop_in.parent.name.removesuffix(".d")
    env = {"SYSTEMD_UNIT_PATH": f"{root}/etc/systemd/system:", "PATH": "/usr/bin:/bin"}

    def verify(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["systemd-analyze", "verify", unit], capture_output=True, text=True,
                              timeout=60, cwd=tmp_path, env={**env, **extra})

    res = verify()
    assert res.returncode == 0 and unit not in res.stderr, res.stderr  # no error, no warning
    debug = verify(SYSTEMD_LOG_LEVEL="debug")
    assert f"DropIn Path: {drop_in}" in debug.stdout + debug.stderr  # it was read, not ignored

    commands = [ln.removeprefix("ExecStart=") for ln in text.splitlines() if ln.startswith("ExecStart=")]
    assert commands[0] == ""  # the unit's own command is reset first
    argv = shlex.split(commands[1])
    assert argv[0] == default_hsmon() and argv[1] == "run"
    parser = argparse.ArgumentParser()
    runner.add_arguments(parser)
    args = parser.parse_args(argv[2:])
    assert args.job == "%i" and args.rows_total == 10000 and args.command[0] == "--"
    unit_text = (root / "etc/systemd/system/hsmon-extract@.service").read_text()
    assert "KillMode=mixed" in unit_text and "Restart=on-failure" in unit_text  # what the doc relies on
