"""Files in an output directory are created and appended to without following a link.

An output directory may live on shared storage where others can plant a symbolic link (a lock
file, a claim, the events file or a chunk directory made a link to a victim file): a writer that
follows it truncates or appends to the victim. So every file hsmon creates or appends to is
opened with ``O_NOFOLLOW``, and below an *anchored* directory every part of the path is opened
relative to the directory's descriptor with no link followed:

    fd = anchor(out)                         # the writer holds OUT open (writer_lock.acquire does it)
    fd = open_file(out / "events.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    parent, name = parent_dir(out / "rows_0-64" / "data_3.ckpt", create=True)   # rows_0-64 made below OUT

A path outside every anchor (a cache, the daemon's port file) still gets ``O_NOFOLLOW`` on its last
part. A training the daemon launched inherits the descriptors of the directories the daemon checked
(env ``HSMON_CHECKED_DIRS``: a JSON object, path -> descriptor): its anchor is that descriptor, never
the path again, and a path that no longer names the same directory is refused in one line.

No heavy imports: the extractor, the trainer and the monitor import this module.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import threading

CHECKED_DIRS_ENV = "HSMON_CHECKED_DIRS"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_anchors: dict[str, int] = {}
_lock = threading.Lock()


class LinkRefused(OSError):
    """A symbolic link (or a directory replaced) where hsmon writes; the message is one line."""


def _key(path: str | os.PathLike[str]) -> str:
    return os.path.abspath(os.fspath(path))


def inherited() -> dict[str, int]:
    """The checked directories this process received from the daemon that launched it."""
    raw = os.environ.get(CHECKED_DIRS_ENV)
    if not raw:
        return {}
    try:
        given = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(given, dict):
        return {}
    return {_key(p): fd for p, fd in given.items() if isinstance(p, str) and isinstance(fd, int)}


def checked_env(dirs: dict[str, int]) -> str:
    """The value of ``HSMON_CHECKED_DIRS`` that hands ``dirs`` (path -> open descriptor) to a child."""
    return json.dumps({_key(p): fd for p, fd in dirs.items()})


def _same_dir(fd: int, path: str) -> bool:
    try:
        held, named = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(held.st_mode) and (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def anchor(directory: str | os.PathLike[str]) -> int:
    """Hold ``directory`` open (made when missing) as the base for every write below it; its
    descriptor. A directory received from the launching daemon is that descriptor: LinkRefused
    when the path names another directory by now."""
    key = _key(directory)
    with _lock:
        if key in _anchors:
            return _anchors[key]
        given = inherited().get(key)
        if given is not None:
            if not _same_dir(given, key):
                raise LinkRefused(errno.ESTALE, f"{key} is no longer the directory the daemon checked "
                                                "(replaced or moved after the launch): nothing was written; "
                                                "launch the training again")
            fd = os.dup(given)
            os.set_inheritable(fd, False)
        else:
            os.makedirs(key, exist_ok=True)
            fd = os.open(key, _DIR_FLAGS)
        _anchors[key] = fd
        return fd


def release(directory: str | os.PathLike[str]) -> None:
    """Stop writing below ``directory`` through its descriptor (the writer let it go)."""
    with _lock:
        fd = _anchors.pop(_key(directory), None)
    if fd is not None:
        os.close(fd)


def _anchored(key: str) -> tuple[str, int] | None:
    with _lock:
        best = None
        for base, fd in _anchors.items():
            if key.startswith(base.rstrip(os.sep) + os.sep) and (best is None or len(base) > len(best[0])):
                best = (base, fd)
        return best


def refusal(path: str | os.PathLike[str]) -> LinkRefused:
    return LinkRefused(errno.ELOOP, f"{path} is a symbolic link: hsmon never writes through a link in an "
                                    "output directory; remove the link (or give another directory)")


def _open_dir_below(base_fd: int, parts: list[str], create: bool, shown: str) -> int:
    """The directory ``parts`` below ``base_fd``, each part opened with no link followed."""
    fd = os.dup(base_fd)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=fd)
            try:
                child = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(part, fd):
                    raise refusal(shown) from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def parent_dir(path: str | os.PathLike[str], create: bool = False) -> tuple[int, str]:
    """(an open descriptor of ``path``'s directory, ``path``'s last part). Below an anchor every
    part is opened with no link followed (LinkRefused names a link met); elsewhere the directory is
    opened by its path. ``create``: missing directories are made. The caller closes the descriptor."""
    key = _key(path)
    head, name = os.path.split(key)
    found = _anchored(key)
    if found is None:
        if create:
            os.makedirs(head, exist_ok=True)
        return os.open(head, _DIR_FLAGS), name
    base, base_fd = found
    parts = [p for p in os.path.relpath(head, base).split(os.sep) if p not in ("", ".")]
    return _open_dir_below(base_fd, parts, create, key), name


def open_file(path: str | os.PathLike[str], flags: int, mode: int = 0o644) -> int:
    """``os.open`` with no link followed as its last part, nor below an anchor (see the module's
    docstring); O_CREAT also makes the missing directories below an anchor. LinkRefused (one line)
    when a link stands in the way."""
    dir_fd, name = parent_dir(path, create=bool(flags & os.O_CREAT))
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.EEXIST and _is_link(name, dir_fd)):
            raise refusal(path) from None
        raise
    finally:
        os.close(dir_fd)


def make_dirs(path: str | os.PathLike[str]) -> None:
    """``mkdir -p``, with no link followed below an anchor."""
    key = _key(path)
    found = _anchored(key + os.sep + "x")
    if found is None:
        os.makedirs(key, exist_ok=True)
        return
    base, base_fd = found
    parts = [p for p in os.path.relpath(key, base).split(os.sep) if p not in ("", ".")]
    os.close(_open_dir_below(base_fd, parts, True, key))

