"""The one rule for every path a launch request names (data_dir, out_dir, a target_model path),
shared by the daemon's ``POST /api/v1/train`` and the TUI's in-process launch form.

    rule = PathRule(remote=True, roots=("/data",))      # an API caller; trainings only under /data
    path, error = request_path("out_dir", raw, rule)    # the path the launch will use, or why not
    fd = make_dir_inside(path, rule.roots)              # created with no link followed out of the roots
    error = links_outside(data_dir, rule.roots)         # a link in data_dir that leaves the roots

A path is turned into the one the launch uses once, here: anything but a string, a path with
leading or trailing whitespace or a NUL, and (from an API caller, whose home and working directory
are not the daemon's) ``~``, ``~user`` and relative paths are refused; the rest is resolved (links
and ``..``) and checked against the allowed roots. The launch then uses that resolved path and
repeats the check on what it creates. No heavy imports: the monitor side imports this module.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsmon.contracts import layout
from hsmon.contracts.presets import PRESETS, is_preset

# how many entries of data_dir are looked at for links, at most (a million-row output stays cheap)
LINK_SCAN_LIMIT = 2_000_000


@dataclass(frozen=True)
class PathRule:
    """Who names the paths: ``remote`` for an API caller (no ``~``, no relative path); ``roots``
    the resolved directories trainings may use (empty: anywhere)."""

    remote: bool = False
    roots: tuple[str, ...] = ()


class PathRefused(OSError):
    """A path that left the allowed roots between the check and its use (``field``: which one)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def under_roots(real: str, roots: tuple[str, ...] | list[str]) -> bool:
    """True when the resolved path ``real`` is a root or lies below one (no roots: always)."""
    if not roots:
        return True
    return any(real == root or real.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def outside_message(raw: str, roots: tuple[str, ...] | list[str]) -> str:
    return f"{raw} is outside the daemon's allowed roots ({', '.join(roots)})"


def request_path(name: str, raw: Any, rule: PathRule) -> tuple[Path | None, str | None]:
    """The resolved path a request's field names: (path, None); (None, None) when the field is
    absent or empty; (None, one-line error) when it breaks the rule."""
    if raw is None or raw == "":
        return None, None
    if not isinstance(raw, str):
        return None, f"{name} must be a path (a JSON string), got {raw!r}"
    if raw != raw.strip():
        return None, f"{name} {raw!r} has leading or trailing whitespace: give the path alone"
    if "\0" in raw:
        return None, f"{name} must not contain a NUL character"
    if rule.remote and raw.startswith("~"):
        return None, (f"{name} {raw!r}: the daemon does not expand ~ (its home is not yours): "
                      "give an absolute path")
    if rule.remote and not os.path.isabs(raw):
        return None, (f"{name} {raw!r} is relative (the daemon's working directory is not yours): "
                      "give an absolute path")
    try:
        real = os.path.realpath(os.path.expanduser(raw))
    except OSError as exc:  # a link that vanished while it was read
        return None, f"{name} {raw!r} changed while it was resolved ({exc.strerror}); try again"
    if not under_roots(real, rule.roots):
        return None, outside_message(raw, rule.roots)
    return Path(real), None


def links_outside(data_dir: Path, roots: tuple[str, ...]) -> str | None:
    """Why ``data_dir`` is refused: a symbolic link below it (a chunk, a row file, a manifest)
    that resolves outside the roots; None when there is none (or no roots)."""
    if not roots:
        return None
    pending, seen = [str(data_dir)], 0
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if seen > LINK_SCAN_LIMIT:
                return None
            if entry.is_symlink():
                if not under_roots(os.path.realpath(entry.path), roots):
                    return (f"{entry.path} links to {os.path.realpath(entry.path)}, outside the daemon's "
                            f"allowed roots ({', '.join(roots)}): copy it in, or allow its root")
            elif entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
    return None


def _root_of(path: Path, roots: tuple[str, ...]) -> str:
    text = str(path)
    return max((r for r in roots if under_roots(text, (r,))), key=len)


def _changed(path: Path, part: str, dir_fd: int, field: str) -> PathRefused:
    """Why ``part`` of ``path`` could not be opened, when it changed after the check."""
    try:
        is_link = stat.S_ISLNK(os.lstat(part, dir_fd=dir_fd).st_mode)
    except FileNotFoundError:
        return PathRefused(field, f"{path}: {part} disappeared while it was being created; try again")
    if is_link:
        return PathRefused(field, f"{path}: {part} became a symbolic link after the check; nothing was "
                                  "created through it")
    return PathRefused(field, f"{path}: {part} changed while it was being created; try again")


def make_dir_inside(path: Path, roots: tuple[str, ...], field: str = "out_dir") -> int:
    """Create the resolved directory ``path`` (and its missing parents) and return an open
    descriptor of it. Under roots, each part below the root is made and opened with no link
    followed, so a link swapped in after the check leads nowhere; the descriptor's path is then
    checked again. Raises PathRefused when the path left the roots, OSError when it cannot be made."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    if not roots:
        os.makedirs(path, exist_ok=True)
        return os.open(path, flags)
    if not under_roots(str(path), roots):
        raise PathRefused(field, outside_message(str(path), roots))
    root = _root_of(path, roots)
    fd = os.open(root, flags)
    try:
        for part in path.relative_to(root).parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o777, dir_fd=fd)
            try:
                child = os.open(part, flags | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                raise _changed(path, part, fd, field) from exc
            os.close(fd)
            fd = child
        real = os.readlink(f"/proc/self/fd/{fd}")
        if real != str(path) or not under_roots(real, roots):
            raise PathRefused(field, f"{path} moved to {real} after the check; nothing was written there")
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_dir_inside(path: Path, roots: tuple[str, ...], field: str) -> int:
    """An open descriptor of the existing directory ``path``, checked again: PathRefused when what
    it names by now is elsewhere (a link swapped in after the check) or outside the roots."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    real = os.readlink(f"/proc/self/fd/{fd}")
    if roots and (real != str(path) or not under_roots(real, roots)):
        os.close(fd)
        raise PathRefused(field, f"{path} moved to {real} after the check; nothing was written there")
    return fd


def has_extraction_output(data_dir: str | os.PathLike[str]) -> bool:
    """True when the directory holds a hsmon manifest or SpecForge ``rows_*/data_*.ckpt`` files."""
    path = Path(data_dir)
    if layout.manifest_paths(path):
        return True
    for chunk in path.iterdir():
        if (
            chunk.is_dir()
            and layout.parse_chunk_dir_name(chunk.name)
            and any(layout.parse_row_file_name(f.name) is not None for f in chunk.iterdir())
        ):
            return True
    return False


def _is_inside(child: Path, parent: Path) -> bool:
    try:
        child.relative_to(parent)
        return True
    except ValueError:
        return False


def _creatable_dir(path: Path) -> str | None:
    """None if ``path`` is a writable directory or could be made as one; else why not."""
    if path.exists():
        if not path.is_dir():
            return f"{path} exists and is not a directory"
        try:
            return None if _writable(path) else f"{path} is not writable"
        except FileNotFoundError:
            return f"{path} disappeared while it was being checked; try again"
    probe = path.parent
    while not probe.exists():
        if probe.parent == probe:
            return f"no existing parent directory for {path}"
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory, so {path} cannot be created"
    try:
        writable = _writable(probe)
    except FileNotFoundError:  # made, moved or removed by someone else between the two looks
        return f"{path}: {probe} disappeared while it was being checked; try again"
    if not writable:
        return f"cannot create {path}: {probe} is not writable"
    return None


def _writable(path: Path) -> bool:
    """Writable by us, or on a filesystem this process sees read-only (the daemon's sandbox: the
    training's unit writes it with its own view, and says so in its log if it cannot)."""
    return os.access(path, os.W_OK | os.X_OK) or bool(os.statvfs(path).f_flag & os.ST_RDONLY)


def checked_paths(
    fields: dict[str, Any], rule: PathRule, errors: dict[str, str]
) -> tuple[Path | None, Path | None, Path | str | None]:
    """data_dir, out_dir and target_model as the launch will use them (hsmon/launch/paths.py's
    rule), each checked; a field's error goes to ``errors``."""
    data, error = request_path("data_dir", fields.get("data_dir"), rule)
    if error:
        errors["data_dir"] = error
    elif data is None:
        errors["data_dir"] = "data_dir is required: the --out directory of an hsmon extract run"
    elif not data.is_dir():
        errors["data_dir"] = f"{data} is not an existing directory"
    else:
        try:
            if not has_extraction_output(data):
                errors["data_dir"] = (
                    f"{data} holds no extraction output (no hsmon-manifest.jsonl, no "
                    "rows_*/data_*.ckpt): point it at an hsmon extract --out directory"
                )
            elif link := links_outside(data, rule.roots):
                errors["data_dir"] = link
        except PermissionError:
            errors["data_dir"] = f"{data} is not readable"
    if "data_dir" in errors:
        data = None

    out, error = request_path("out_dir", fields.get("out_dir"), rule)
    if error:
        errors["out_dir"] = error
    elif out is None:
        errors["out_dir"] = "out_dir is required: where the drafter checkpoints go"
    else:
        problem = _creatable_dir(out)
        if problem:
            errors["out_dir"] = problem
        elif data is not None and _is_inside(out, data):
            errors["out_dir"] = f"out_dir must not be inside data_dir ({data}): pick a directory beside it"

    raw_target = fields.get("target_model")
    if isinstance(raw_target, str) and is_preset(raw_target):
        return data, out, raw_target  # a preset's name, not a path: `hsmon train` makes its directory
    target, error = request_path("target_model", raw_target, rule)
    if error:
        errors["target_model"] = error
    elif target is not None and not target.is_dir():
        errors["target_model"] = (
            f"{target} is not a model directory nor a preset ({', '.join(PRESETS)}); "
            "leave it empty for the embedded default target"
        )
    elif target is not None and (link := links_outside(target, rule.roots)):
        errors["target_model"] = link  # its weights are read as data_dir's rows are: within the roots
    return data, out, target
