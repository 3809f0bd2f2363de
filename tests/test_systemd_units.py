"""systemd units installed by `hsmon install-units` into a temporary root: `systemd-analyze verify`
on every unit (no warning either), `systemd-analyze security --offline=yes` exposure (daemon
<= 5.0, extract and train <= 6.5, printed), the commands they run accepted by hsmon's own
parsers, and the installed /etc/hsmon/hsmon.toml read by a real daemon."""

from __future__ import annotations

import argparse
import configparser
import importlib
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_helpers import Procs, child_env

from hsmon import daemon as daemon_process
from hsmon.install_units import UNITS, default_hsmon

REPO = Path(__file__).resolve().parents[1]
needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze missing: run `make sysdeps`"
)
INSTALL = ("--user", "hsmon", "--data-dir", "/data/hs", "--hsmon", default_hsmon(),
           "--sglang-python", sys.executable)
EXPOSURE_LIMITS = {"hsmon-daemon.service": 5.0, "hsmon-extract@.service": 6.5, "hsmon-train@.service": 6.5}


def install(root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hsmon", "install-units", "--prefix", str(root), *extra],
        capture_output=True, text=True, timeout=60, env=child_env(),
    )


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("root")
    res = install(root, *INSTALL)
    assert res.returncode == 0, res.stderr
    return root


def unit(root: Path, name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    text = (root / "etc/systemd/system" / name).read_text()
    parser.read_string(re.sub(r"^(\w+)=", r"\1 = ", text, flags=re.M))
    return parser


@needs_analyze
@pytest.mark.parametrize("name", UNITS)
def test_systemd_analyze_verify(root: Path, name: str, tmp_path: Path) -> None:
    path = root / "etc/systemd/system" / name
    arg = str(path) if "@." not in name else f"{path}:{name.replace('@.', '@job1.')}"
    res = subprocess.run(["systemd-analyze", "verify", arg], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert name.split("@")[0] not in res.stderr, res.stderr  # warnings (unknown keys, bad values) too


def exposure_of(root: Path, name: str) -> float:
    res = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager",
         str(root / "etc/systemd/system" / name)],
        capture_output=True, text=True, timeout=60,
    )
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", res.stdout + res.stderr)
    assert m, res.stdout + res.stderr
    return float(m.group(1))


@needs_analyze
@pytest.mark.parametrize("name", sorted(EXPOSURE_LIMITS))
def test_security_exposure(root: Path, name: str) -> None:
    exposure = exposure_of(root, name)
    print(f"{name}: exposure {exposure} (limit {EXPOSURE_LIMITS[name]})")
    assert exposure <= EXPOSURE_LIMITS[name]


@needs_analyze
def test_a_launched_training_is_sandboxed_no_worse_than_the_daemon(root: Path) -> None:
    """The template the daemon's trainings run as scores no worse than the daemon's own unit, runs
    as the dedicated user, and leaves its output to the training (no StandardOutput= path opened by
    the service manager as root)."""
    launched, daemon = exposure_of(root, "hsmon-launch@.service"), exposure_of(root, "hsmon-daemon.service")
    print(f"hsmon-launch@.service: exposure {launched} (hsmon-daemon.service: {daemon})")
    assert launched <= daemon
    svc = unit(root, "hsmon-launch@.service")["Service"]
    assert svc["User"] == "hsmon"
    assert svc["ExecStart"].split()[1:] == ["launched", "/var/lib/hsmon/launch/%i.json"]
    assert "StandardOutput" not in svc and "StandardError" not in svc
    assert unit(root, "hsmon-daemon.service")["Service"]["StateDirectory"] == "hsmon"  # where the spec is


def test_the_daemon_unit_runs_a_command_hsmon_accepts(root: Path) -> None:
    argv = shlex.split(unit(root, "hsmon-daemon.service")["Service"]["ExecStart"])
    assert argv[:2] == [default_hsmon(), "daemon"]
    module = importlib.import_module("hsmon.daemon")
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    args = parser.parse_args(argv[2:])
    assert args.config == "/etc/hsmon/hsmon.toml" and args.state_log.startswith("/var/lib/hsmon/")


def test_units_carry_what_the_issue_asks(root: Path) -> None:
    daemon = unit(root, "hsmon-daemon.service")["Service"]
    assert daemon["User"] == "hsmon" and "--config /etc/hsmon/hsmon.toml" in daemon["ExecStart"]
    assert daemon["ExecStart"].startswith(default_hsmon() + " daemon")
    assert "ReadWritePaths" not in daemon and daemon["PrivateDevices"] == "yes"  # no GPU, no writes
    assert daemon["Environment"].split() == ["PYTHONUNBUFFERED=1", "MALLOC_ARENA_MAX=2"]  # docs/operations.md
    assert daemon["IPAddressDeny"] == "any" and daemon["IPAddressAllow"] == "localhost"
    for name, resume in (("hsmon-extract@.service", False), ("hsmon-train@.service", True)):
        svc = unit(root, name)["Service"]
        assert svc["Restart"] == "on-failure" and svc["KillSignal"] == "SIGTERM"
        # the stop a unit asks for exits 143 (130 for SIGINT): success, not a failure to restart
        assert svc["SuccessExitStatus"].split() == ["130", "143"]
        assert svc["TimeoutStopSec"] == "15min" and "PYTHONUNBUFFERED=1" in svc["Environment"]
        assert svc["NoNewPrivileges"] == "yes" and svc["ProtectSystem"] == "strict"
        assert "/data/hs" in svc["ReadWritePaths"].split() and svc["User"] == "hsmon"
        assert ("--resume" in svc["ExecStart"]) is resume
    assert "/dev/shm/hsmon" in unit(root, "hsmon-extract@.service")["Service"]["ReadWritePaths"].split()
    assert "u hsmon " in (root / "etc/sysusers.d/hsmon.conf").read_text()
    assert not re.search(r"@[A-Z_]+@", "".join(p.read_text() for p in root.rglob("*") if p.is_file()))


@pytest.mark.parametrize("kind", ["extract", "train", "sglang"])
def test_the_command_a_unit_runs_is_one_hsmon_accepts(root: Path, kind: str) -> None:
    """ExecStart with the example environment file expanded, parsed by the subcommand's parser."""
    env = dict(
        line.split("=", 1) for line in (root / f"etc/hsmon/{kind}/example.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    exec_start = unit(root, f"hsmon-{kind}@.service")["Service"]["ExecStart"].replace("%i", "example")
    exec_start = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env[m.group(1) or m.group(2)], exec_start)
    argv = shlex.split(exec_start)
    command = {"extract": "extract", "train": "train", "sglang": "sglang-serve"}[kind]
    assert argv[0] == default_hsmon() and argv[1] == command
    module = importlib.import_module(
        {"extract": "extractor.cli", "train": "trainer.cli", "sglang": "extractor.sglang.serve"}[kind]
    )
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    args = parser.parse_args(argv[2:])
    if kind == "sglang":
        assert args.dump_dir == "/dev/shm/hsmon" and "--enable-metrics" in args.sglang_args
        assert args.python == sys.executable
    else:
        assert args.events.endswith("/events.jsonl") and args.job == "example"


def test_a_daemon_reads_the_installed_config(root: Path, tmp_path: Path) -> None:
    config = root / "etc/hsmon/hsmon.toml"
    text = config.read_text()
    assert "port = 9108" in text and 'host = "127.0.0.1"' in text
    # a job added the way the file's comment says
    config.write_text(text + f'\n[[job]]\nname = "job1"\nkind = "extract"\nout_dir = "{tmp_path}"\n')
    procs = Procs()
    try:
        proc, url = daemon_process.spawn(["--config", str(config)], tmp_path / "port", timeout=30,
                                         env=child_env(), stderr=subprocess.DEVNULL)
        procs.procs.append(proc)
        import json
        import urllib.request

        with urllib.request.urlopen(url + "/api/v1/status", timeout=10) as resp:
            assert [j["job"] for j in json.loads(resp.read())["jobs"]] == ["job1"]
    finally:
        procs.close()
        config.write_text(text)


def test_dry_run_writes_nothing_and_config_is_kept(tmp_path: Path, root: Path) -> None:
    res = install(tmp_path / "r", "--dry-run")
    assert res.returncode == 0 and "would write" in res.stdout and "ExecStart=" in res.stdout
    assert not (tmp_path / "r").exists()
    edited = root / "etc/hsmon/hsmon.toml"
    edited.write_text(edited.read_text() + "# mine\n")
    res = install(root, *INSTALL)
    assert res.returncode == 0 and f"keep     {edited}" in res.stdout
    assert edited.read_text().endswith("# mine\n")


@pytest.mark.parametrize(
    "flags, named", [(["--user", "Bad User"], "--user"), (["--data-dir", "rel/dir"], "--data-dir")]
)
def test_bad_input_is_one_line_naming_it(tmp_path: Path, flags: list[str], named: str) -> None:
    res = install(tmp_path / "r", *flags)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and named in res.stderr
    assert not (tmp_path / "r").exists()


def test_systemd_folder_is_the_package_templates() -> None:
    assert (REPO / "systemd").resolve() == (REPO / "hsmon" / "systemd").resolve()
    assert all((REPO / "systemd" / name).is_file() for name in UNITS)
