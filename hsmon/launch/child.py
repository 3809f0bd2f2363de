"""What a launched training starts with, and `hsmon launched SPEC`: the first step of a training
that the daemon started as an instance of the template unit ``hsmon-launch@.service``.

    start = open_child(spec)     # OUT made and checked again, OUT/train.log opened by us, no link followed
    os.execvpe(...)              # the training, with OUT's descriptor (HSMON_CHECKED_DIRS)

The training's log is opened by the training's own process, as the daemon's user, under the
descriptor of the output directory that was checked against the allowed roots, never by the service
manager (root) through a path. The trainer receives that descriptor (hsmon/contracts/nofollow.py):
every file it writes below OUT is reached through it, so a link swapped into OUT's path after the
check leads nowhere. In a detached session (no systemd) the daemon does the same steps itself
(hsmon/launch/training.py); as a unit, this command repeats them in the unit, from the spec the daemon
wrote into its state directory.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import msgspec

from hsmon.contracts import nofollow
from hsmon.launch.paths import PathRefused, make_dir_inside, open_dir_inside

LOG_NAME = "train.log"
PIDFILE_NAME = "train.pid"


class LaunchSpec(msgspec.Struct, forbid_unknown_fields=True):
    """What the daemon hands to the unit that runs one training."""

    argv: list[str]
    out_dir: str
    roots: list[str] = []
    data_dir: str | None = None  # the spool a following trainer writes: handed over too
    env: dict[str, str] = {}


@dataclass
class ChildStart:
    """The descriptors and environment a training starts with."""

    out_fd: int
    log_fd: int
    env: dict[str, str]
    fds: tuple[int, ...]

    def close(self) -> None:
        for fd in {*self.fds, self.log_fd}:
            os.close(fd)


def open_in(dir_fd: int, name: str, flags: int) -> int:
    """A file of the output directory, through its descriptor, no link followed."""
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise nofollow.LinkRefused(errno.ELOOP, f"{name} in the output directory is a symbolic link: "
                                                    "nothing was written through it; remove it") from None
        raise


def open_child(spec: LaunchSpec, env: dict[str, str]) -> ChildStart:
    """OUT made (its check repeated on what is made), OUT/train.log opened, the descriptors the training
    inherits. PathRefused or OSError when something left the roots or is a link."""
    roots = tuple(spec.roots)
    out_fd = make_dir_inside(Path(spec.out_dir), roots)
    dirs, fds = {spec.out_dir: out_fd}, [out_fd]
    try:
        if spec.data_dir is not None:
            data_fd = open_dir_inside(Path(spec.data_dir), roots, "data_dir")
            dirs[spec.data_dir] = data_fd
            fds.append(data_fd)
        log_fd = open_in(out_fd, LOG_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    for fd in fds:
        os.set_inheritable(fd, True)
    child_env = {**env, **spec.env, nofollow.CHECKED_DIRS_ENV: nofollow.checked_env(dirs)}
    child_env.setdefault("PYTHONUNBUFFERED", "1")  # its log is a file: an empty buffered log, avoided
    return ChildStart(out_fd=out_fd, log_fd=log_fd, env=child_env, fds=tuple(fds))


def write_pidfile(out_fd: int, pid: int) -> None:
    fd = open_in(out_fd, PIDFILE_NAME, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"{pid}\n")


def read_spec(path: str) -> LaunchSpec:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        return msgspec.json.decode(fh.read(), type=LaunchSpec)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="the launch the daemon wrote (STATE_DIRECTORY/launch/UNIT.json); run by "
                                     "the hsmon-launch@ unit, not by hand")


def run(args: argparse.Namespace) -> int:
    """Entry point of `hsmon launched`: check, open the log, become the training."""
    try:
        spec = read_spec(args.spec)
        start = open_child(spec, dict(os.environ))
        write_pidfile(start.out_fd, os.getpid())
    except PathRefused as exc:
        print(f"hsmon launched: {exc.field}: {exc.message}", file=sys.stderr)
        return 2
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        print(f"hsmon launched: {args.spec}: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        return 2
    os.dup2(start.log_fd, 1)
    os.dup2(start.log_fd, 2)
    os.close(start.log_fd)
    os.fchdir(start.out_fd)
    os.execvpe(spec.argv[0], spec.argv, start.env)
