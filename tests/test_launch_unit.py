"""Trainings launched from the daemon's unit run as instances of the template hsmon-launch@.service
(hsmon/launch/unit.py), which nothing the daemon chooses can turn into root.

This machine has no systemd as PID 1, so an instance cannot start here. What is tested: the shipped
polkit rule, evaluated by a real JavaScript engine (node) for every verb and unit name that matters;
`hsmon launched`, the template's command, as a real process (the output directory checked again,
its log opened by the training itself and never through a link, the directory's descriptor handed
to the training); the real systemctl's refusal reaching the caller in one line. The template's
`systemd-analyze security` against the daemon's is in tests/test_systemd_units.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from daemon_helpers import child_env

from hsmon.launch import training as launch
from hsmon.launch import unit as launch_unit
from hsmon.launch.child import LaunchSpec

REPO = Path(__file__).resolve().parents[1]
needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="node missing: run `make sysdeps`")

# Evaluates the rule file with a stand-in of polkitd's `polkit` object; prints one verdict per case.
POLKIT_HARNESS = r"""
const fs = require("fs");
const rules = [];
const polkit = {Result: {YES: "yes", NO: "no", AUTH_ADMIN: "auth_admin", NOT_HANDLED: null},
                addRule: function (f) { rules.push(f); }};
eval(fs.readFileSync(process.argv[2], "utf8"));
const cases = JSON.parse(fs.readFileSync(0, "utf8"));
for (const c of cases) {
    const action = {id: c.id, lookup: function (k) { return c.details[k]; }};
    let verdict = null;
    for (const rule of rules) { const r = rule(action, {user: c.user}); if (r) { verdict = r; break; } }
    console.log(verdict === null ? "none" : verdict);
}
"""
MANAGE = "org.freedesktop.systemd1.manage-units"


def installed_rule(tmp_path: Path, user: str = "hsmon") -> Path:
    res = subprocess.run([sys.executable, "-m", "hsmon", "install-units", "--prefix", str(tmp_path),
                          "--user", user], capture_output=True, text=True, timeout=60, env=child_env())
    assert res.returncode == 0, res.stderr
    return tmp_path / "etc/polkit-1/rules.d/50-hsmon.rules"


def verdicts(rule: Path, cases: list[dict], tmp_path: Path) -> list[str]:
    harness = tmp_path / "harness.js"
    harness.write_text(POLKIT_HARNESS)
    res = subprocess.run(["node", str(harness), str(rule)], input=json.dumps(cases), capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


def case(unit: str, verb: str | None, user: str = "hsmon", action: str = MANAGE, message: str = "") -> dict:
    details = {"unit": unit, "polkit.message": message or f"Authentication is required to {verb} '$(unit)'."}
    if verb is not None:
        details["verb"] = verb
    return {"id": action, "user": user, "details": details}


@needs_node
def test_the_polkit_rule_allows_start_and_stop_of_the_template_instances_and_nothing_else(tmp_path):
    rule = installed_rule(tmp_path)
    inst = "hsmon-launch@train-drafter-1234.service"
    allowed = [case(inst, "start"), case(inst, "stop")]
    refused = [
        case(inst, "restart"), case(inst, "reload"), case(inst, "kill"), case(inst, None),
        case(inst, "start", user="alice"),
        case(inst, "start", action="org.freedesktop.systemd1.manage-unit-files"),
        # a transient unit of the template's name (systemd refuses it anyway: the template exists)
        case(inst, "start", message="Authentication is required to start transient unit '$(unit)'."),
        # a name prefix alone is not enough: the old rule's transient units, look-alikes
        case("hsmon-train-x-1.service", "start"), case("hsmon-launch-x.service", "start"),
        case("hsmon-launch@.service", "start"), case("hsmon-launch@x.service.d", "start"),
        case("hsmon-launch@x.socket", "start"), case("xhsmon-launch@x.service", "start"),
        case("hsmon-launch@x/../sshd.service", "start"), case("sshd.service", "start"),
        case("", "start"),
    ]
    got = verdicts(rule, allowed + refused, tmp_path)
    assert got == ["yes"] * len(allowed) + ["none"] * len(refused), got
    text = rule.read_text()
    assert 'subject.user != "hsmon"' in text and "@USER@" not in text


def test_the_instance_name_is_the_jobs_and_unique(tmp_path):
    req = launch.TrainingRequest(data_dir=str(tmp_path / "data"), out_dir=str(tmp_path / "my out"))
    instance = launch_unit.instance_name(req.job_name, now=1234.5)
    assert instance == "train-my-out-1234500"
    assert launch_unit.unit_of(instance) == "hsmon-launch@train-my-out-1234500.service"
    with pytest.raises(ValueError):
        launch_unit.unit_of("a/../b")


def launched(spec: LaunchSpec, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "spec.json"
    path.write_bytes(msgspec.json.encode(spec))
    return subprocess.run([sys.executable, "-m", "hsmon", "launched", str(path)], capture_output=True,
                          text=True, timeout=60, env=child_env())


# the training's stand-in: what it sees of its start (cwd, the directory handed over), on its stdout
PROBE = ("import json, os, sys; d = json.loads(os.environ['HSMON_CHECKED_DIRS']); "
         "print(json.dumps({'pid': os.getpid(), 'cwd': os.getcwd(), "
         "'dirs': {p: os.readlink(f'/proc/self/fd/{fd}') for p, fd in d.items()}}))")


def test_launched_checks_the_directory_opens_its_own_log_and_hands_over_the_descriptor(tmp_path):
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    out = root / "runs" / "d1"
    spec = LaunchSpec(argv=[sys.executable, "-c", PROBE], out_dir=str(out), roots=[str(root)],
                      data_dir=str(root / "data"))
    res = launched(spec, tmp_path)
    assert res.returncode == 0, res.stderr
    seen = json.loads((out / "train.log").read_text())
    assert seen["cwd"] == str(out) and (out / "train.pid").read_text() == f"{seen['pid']}\n"
    assert seen["dirs"] == {str(out): str(out), str(root / "data"): str(root / "data")}


def test_launched_writes_through_no_link_and_nothing_outside_the_roots(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "out").mkdir(parents=True)
    outside.mkdir()
    victim = outside / "victim"
    victim.write_text("precious\n")
    (root / "out" / "train.log").symlink_to(victim)
    res = launched(LaunchSpec(argv=[sys.executable, "-c", "print('ran')"], out_dir=str(root / "out"),
                              roots=[str(root)]), tmp_path)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "symbolic link" in res.stderr, res.stderr
    assert victim.read_text() == "precious\n" and not (root / "out" / "train.pid").exists()
    (root / "away").symlink_to(outside)  # the out_dir's parent became a link after the daemon's check
    res = launched(LaunchSpec(argv=[sys.executable, "-c", "print('ran')"], out_dir=str(root / "away" / "o"),
                              roots=[str(root)]), tmp_path)
    assert res.returncode == 2 and res.stderr.startswith("hsmon launched: out_dir: "), res.stderr
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]


@pytest.mark.skipif(shutil.which("systemctl") is None, reason="make test installs systemd")
def test_without_systemd_as_pid_1_the_launch_fails_in_one_line(monkeypatch, tmp_path):
    """The real systemctl, asked to start an instance where systemd is not PID 1, refuses: the
    launch raises OSError with its words (the daemon answers 500 with it), nothing is left running."""
    monkeypatch.setenv(launch_unit.MODE_ENV, "unit")
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    req = launch.TrainingRequest(data_dir=str(tmp_path), out_dir=str(tmp_path / "out"))
    with pytest.raises(OSError) as exc:
        launch.launch_training(req, argv=[sys.executable, "-c", "pass"])
    assert str(exc.value).startswith("systemctl could not start hsmon-launch@train-out-")
    assert "\n" not in str(exc.value)
    spec = msgspec.json.decode(next((tmp_path / "state" / "launch").glob("*.json")).read_bytes(),
                               type=LaunchSpec)
    assert spec.argv == [sys.executable, "-c", "pass"] and spec.out_dir == str(tmp_path / "out")
    assert not (tmp_path / "out").exists()  # the unit makes it, as the training's user, in its own view


def test_a_unit_launch_without_a_state_directory_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv(launch_unit.MODE_ENV, "unit")
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    req = launch.TrainingRequest(data_dir=str(tmp_path), out_dir=str(tmp_path / "out"))
    with pytest.raises(OSError, match="needs the daemon's StateDirectory"):
        launch.launch_training(req, argv=[sys.executable, "-c", "pass"], env=dict(os.environ))


def test_the_launch_mode_follows_systemd_and_the_override(monkeypatch):
    monkeypatch.delenv(launch_unit.MODE_ENV, raising=False)
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    assert not launch_unit.wanted()  # a shell, a test, a container: a detached session
    monkeypatch.setenv(launch_unit.MODE_ENV, "unit")
    assert launch_unit.wanted()
    monkeypatch.setenv(launch_unit.MODE_ENV, "session")
    monkeypatch.setenv("INVOCATION_ID", "0123abcd")
    assert not launch_unit.wanted()
