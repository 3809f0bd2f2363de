"""`hsmon install-units`: the systemd units of hsmon/systemd/, with this machine's paths and user.

Writes PREFIX/etc/systemd/system/{hsmon-daemon,hsmon-extract@,hsmon-train@,hsmon-sglang@,
hsmon-launch@}.service, PREFIX/etc/sysusers.d/hsmon.conf (the dedicated user),
PREFIX/etc/polkit-1/rules.d/50-hsmon.rules (the daemon's user may start and stop the instances of
hsmon-launch@, its trainings, and nothing else) and, when missing, PREFIX/etc/hsmon/hsmon.toml (the
daemon's configuration, read by the daemon unit) and one example environment file per
templated unit in PREFIX/etc/hsmon/{extract,train,sglang}/. Existing configuration is never
overwritten; units are. `--dry-run` prints what it would write. It never runs systemctl: the
commands to run next are printed (docs/operations.md).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

UNITS = ("hsmon-daemon.service", "hsmon-extract@.service", "hsmon-train@.service", "hsmon-sglang@.service",
         "hsmon-launch@.service")
CONFIG_DIR = "/etc/hsmon"


@dataclass(frozen=True)
class Plan:
    """One file to write: where, what, and whether an existing one is kept."""

    path: Path
    text: str
    keep_existing: bool = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `hsmon install-units`."""
    parser.add_argument("--prefix", default="/", metavar="DIR",
                        help="root to install under (default /; a temporary root for packaging or tests)")
    parser.add_argument("--user", default="hsmon", metavar="NAME",
                        help="the dedicated user (and group) the units run as (default hsmon)")
    parser.add_argument("--data-dir", default="/data/hsmon", metavar="DIR",
                        help="where extraction and training write (the units' only writable path besides "
                             "the dump directory; default /data/hsmon)")
    parser.add_argument("--shm-dir", default="/dev/shm/hsmon", metavar="DIR",
                        help="the dump directory an SGLang capture writes (default /dev/shm/hsmon)")
    parser.add_argument("--hsmon", metavar="PATH",
                        help="the hsmon command the units run (default: the one of this installation)")
    parser.add_argument("--sglang-python", default="/opt/sglang/bin/python", metavar="PATH",
                        help="the Python of the environment with sglang, for hsmon-sglang@ "
                             "(default /opt/sglang/bin/python)")
    parser.add_argument("--dry-run", action="store_true", help="print the files, write nothing")


def default_hsmon() -> str:
    """The `hsmon` script beside this Python (a venv's bin/), else whatever PATH finds."""
    beside = Path(sys.executable).parent / "hsmon"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("hsmon") or str(beside)


def _check(args: argparse.Namespace) -> str | None:
    if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", args.user):
        return f"--user {args.user!r}: not a valid user name (lowercase letters, digits, _ and -)"
    paths = (("--data-dir", args.data_dir), ("--shm-dir", args.shm_dir), ("--hsmon", args.hsmon),
             ("--sglang-python", args.sglang_python))
    for flag, value in paths:
        if value is not None and (not os.path.isabs(value) or re.search(r"\s|%|\$", value)):
            return f"{flag} {value!r}: give an absolute path without spaces, % or $"
    return None


def plan(args: argparse.Namespace) -> list[Plan]:
    """Every file install-units writes, filled in."""
    values = {
        "@USER@": args.user,
        "@GROUP@": args.user,
        "@HSMON@": args.hsmon or default_hsmon(),
        "@DATA_DIR@": os.path.normpath(args.data_dir),
        "@SHM_DIR@": os.path.normpath(args.shm_dir),
        "@CONFIG_DIR@": CONFIG_DIR,
        "@SGLANG_PYTHON@": args.sglang_python,
    }
    root = Path(args.prefix)
    source = resources.files("hsmon") / "systemd"

    def fill(name: str) -> str:
        text = (source / name).read_text(encoding="utf-8")
        for key, value in values.items():
            text = text.replace(key, value)
        return text

    units = root / "etc" / "systemd" / "system"
    conf = root / CONFIG_DIR.lstrip("/")
    files = [Plan(units / name, fill(name)) for name in UNITS]
    files.append(Plan(root / "etc" / "sysusers.d" / "hsmon.conf", fill("hsmon.sysusers.conf")))
    polkit = root / "etc" / "polkit-1" / "rules.d" / "50-hsmon.rules"
    files.append(Plan(polkit, fill("hsmon-launch.rules")))
    files.append(Plan(conf / "hsmon.toml", fill("hsmon.toml"), keep_existing=True))
    for kind in ("extract", "train", "sglang"):
        files.append(Plan(conf / kind / "example.env", fill(f"{kind}.env"), keep_existing=True))
    return files


def run(args: argparse.Namespace) -> int:
    """Entry point of `hsmon install-units`."""
    problem = _check(args)
    if problem:
        print(f"hsmon install-units: {problem}", file=sys.stderr)
        return 2
    files = plan(args)
    for item in files:
        exists = item.path.exists()
        if item.keep_existing and exists:
            print(f"keep     {item.path} (exists)")
            continue
        print(f"{'would write' if args.dry_run else 'write'}    {item.path}")
        if args.dry_run:
            print("".join(f"    {line}\n" for line in item.text.splitlines()), end="")
            continue
        try:
            item.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = item.path.with_name(f".{item.path.name}.tmp")
            tmp.write_text(item.text, encoding="utf-8")
            tmp.chmod(0o644)
            tmp.replace(item.path)
        except OSError as exc:
            print(f"hsmon install-units: cannot write {item.path} ({exc.strerror}); run as root or give "
                  "--prefix", file=sys.stderr)
            return 1
    if not args.dry_run and Path(args.prefix).resolve() == Path("/"):
        print("next: systemd-sysusers && systemctl daemon-reload && systemctl enable --now hsmon-daemon")
        print(f"      then per job: {CONFIG_DIR}/extract/NAME.env and systemctl start hsmon-extract@NAME")
    return 0
