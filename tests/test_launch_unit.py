"""Trainings launched from the daemon's unit run as transient units (hsmon/launch/unit.py).

This machine has no systemd as PID 1, so a transient unit cannot start here: what is tested is
the choice of the launch mode, the generated systemd-run command line (every property the issue
asks for), the real systemd-run's refusal reaching the caller in one line, and the polkit rule
install-units writes. A GPU box with systemd runs the same command line for real."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hsmon.launch import training as launch
from hsmon.launch import unit as launch_unit


def test_the_launch_mode_follows_systemd_and_the_override(monkeypatch, tmp_path):
    monkeypatch.delenv(launch_unit.MODE_ENV, raising=False)
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    assert not launch_unit.wanted()  # a shell, a test, a container: a detached session
    monkeypatch.setenv(launch_unit.MODE_ENV, "unit")
    assert launch_unit.wanted()
    monkeypatch.setenv(launch_unit.MODE_ENV, "session")
    monkeypatch.setenv("INVOCATION_ID", "0123abcd")
    assert not launch_unit.wanted()


def test_the_systemd_run_command_line(tmp_path):
    req = launch.TrainingRequest(data_dir=str(tmp_path / "data"), out_dir=str(tmp_path / "out"))
    argv = launch.training_argv(req, python="/usr/bin/python3")
    unit = launch_unit.unit_name(req.job_name, now=1234.5)
    assert unit == "hsmon-train-train-out-1234500.service"
    cmd = launch_unit.unit_argv(unit, argv, req.out_dir, str(tmp_path / "out" / "train.log"), "hsmon",
                                env={"CUDA_VISIBLE_DEVICES": "0,1", "HSMON_TRAIN_COMMAND": "/opt/x"})
    assert Path(cmd[0]).name == "systemd-run" and cmd[cmd.index("--unit") + 1] == unit
    assert cmd[cmd.index("--") + 1:] == argv  # the training's own command, untouched
    props = [cmd[i + 1] for i, word in enumerate(cmd) if word == "--property"]
    assert f"WorkingDirectory={req.out_dir}" in props
    assert f"StandardOutput=append:{tmp_path}/out/train.log" in props
    assert "KillSignal=SIGTERM" in props and "TimeoutStopSec=15min" in props
    assert "SuccessExitStatus=130 143" in props  # a training stopped by SIGTERM exits 143
    # not the daemon's sandbox: no read-only filesystem, no private devices (the GPUs are seen)
    assert not [p for p in props if p.startswith(("ProtectSystem", "PrivateDevices", "DevicePolicy"))]
    assert "--collect" in cmd and cmd[cmd.index("--uid") + 1] == "hsmon"
    envs = [cmd[i + 1] for i, word in enumerate(cmd) if word == "--setenv"]
    assert {"PYTHONUNBUFFERED=1", "CUDA_VISIBLE_DEVICES=0,1", "HSMON_TRAIN_COMMAND=/opt/x"} <= set(envs)


@pytest.mark.skipif(shutil.which("systemd-run") is None, reason="make test installs systemd")
def test_without_systemd_as_pid_1_the_launch_fails_in_one_line(monkeypatch, tmp_path):
    """The real systemd-run, asked to start a unit where systemd is not PID 1, refuses: the
    launch raises OSError with its words (the daemon answers 500 with it), nothing is left running."""
    monkeypatch.setenv(launch_unit.MODE_ENV, "unit")
    req = launch.TrainingRequest(data_dir=str(tmp_path), out_dir=str(tmp_path / "out"))
    with pytest.raises(OSError) as exc:
        launch.launch_training(req, argv=[sys.executable, "-c", "pass"])
    assert str(exc.value).startswith("systemd-run could not start hsmon-train-")
    assert "\n" not in str(exc.value)
    assert not (tmp_path / "out" / "train.pid").exists()


def test_install_units_writes_the_polkit_rule(tmp_path):
    res = subprocess.run([sys.executable, "-m", "hsmon", "install-units", "--prefix", str(tmp_path),
                          "--user", "trainer"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    rule = (tmp_path / "etc/polkit-1/rules.d/50-hsmon.rules").read_text()
    assert 'subject.user == "trainer"' in rule and 'indexOf("hsmon-train-") == 0' in rule
    assert "@USER@" not in rule
    daemon = (tmp_path / "etc/systemd/system/hsmon-daemon.service").read_text()
    assert "SystemCallFilter=setpriority" in daemon  # nice, for --verify-every
