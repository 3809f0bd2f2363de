"""A dump directory that only its owner can touch, on a real filesystem and with
a real `hsmon extract`: made 0700, refused in one line when another user owns it or its group or
others may write it (by the client before any request, and by the capture plugin before any
write); the plugin writes under the directory's descriptor, 0600, through no link; a dump belongs
to the output that asked for it (its mark in the file name), so two outputs of the same last name
sharing a dump directory never take, nor delete, each other's files."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from daemon_helpers import child_env

from extractor.backends.sglang.dumpdir import DumpDir, owner_of
from extractor.errors import UsageError
from extractor.sglang import serve
from extractor.writer import Progress
from hsmon.contracts import events as ev

sys.path.insert(0, str(serve.PLUGIN_ROOT))
from hsmon_sglang_plugin import dump

NOBODY = 65534


def dump_dir(path: Path, owner: str) -> DumpDir:
    return DumpDir(path, 1 << 30, 0, ev.EventWriter("t", stream=io.StringIO()), Progress(), threading.Event(),
                   owner=owner)


def test_two_outputs_of_the_same_name_share_a_dump_directory_and_keep_their_own_files(tmp_path):
    shared = tmp_path / "shm" / "hsmon" / "extract-drafter"
    a, b = owner_of(tmp_path / "a" / "drafter"), owner_of(tmp_path / "b" / "drafter")
    assert a != b
    first = dump_dir(shared, a)
    first.prepare()
    assert oct(shared.stat().st_mode & 0o777) == oct(0o700)
    assert oct(shared.parent.stat().st_mode & 0o777) == oct(0o700)  # the root it made too
    theirs = [f"r5-{b}0badf00d-1.safetensors", f".r6-{b}0badf00d-2.safetensors.tmp",
              f"r7-{b}0badf00d-3.error", f"probe-{b}0badf00d-1.safetensors"]
    for name in theirs:
        (shared / name).write_bytes(b"theirs")
    (shared / f"r5-{a}12345678-1.safetensors").write_bytes(b"mine")  # a row of an earlier run of ours
    (shared / f".r6-{a}12345678-2.safetensors.tmp").write_bytes(b"mine")
    second = dump_dir(shared, a)  # our run, resumed
    second.prepare()
    assert second.take_orphan(5) == shared / f"r5-{a}12345678-1.safetensors"  # ours, not theirs
    assert second.take_orphan(6) is None and second.take_orphan(7) is None
    second.clean()
    assert sorted(p.name for p in shared.iterdir()) == sorted(theirs)  # the other run's files untouched


@pytest.mark.parametrize("how", ["another user's", "group-writable", "a link", "parent group-writable"])
def test_a_dump_directory_not_only_ours_is_refused_in_one_line(tmp_path, how):
    where = tmp_path / "root" / "job"
    where.mkdir(parents=True, mode=0o700)
    if how == "another user's":
        os.chown(where, NOBODY, NOBODY)
    elif how == "group-writable":
        where.chmod(0o770)
    elif how == "a link":
        where.rmdir()
        (tmp_path / "elsewhere").mkdir()
        where.symlink_to(tmp_path / "elsewhere")
    else:
        where.parent.chmod(0o777)
    with pytest.raises(UsageError) as exc:
        dump_dir(where, "ab12cd34").prepare()
    message = str(exc.value)
    assert message.startswith(f"--dump-dir {where}: ") and "\n" not in message
    expected = {"another user's": "belongs to uid 65534", "group-writable": "chmod 700",
                "a link": "not a directory", "parent group-writable": f"chmod 700 {where.parent}"}
    assert expected[how] in message


def test_hsmon_extract_refuses_a_dump_directory_others_may_write_before_any_request(tmp_path):
    where = tmp_path / "shm" / "job"
    where.mkdir(parents=True)
    where.chmod(0o777)
    (tmp_path / "rows.jsonl").write_text('{"text": "hello"}\n')
    argv = ["extract", str(tmp_path / "rows.jsonl"), "--out", str(tmp_path / "out"), "--backend", "sglang",
            "--url", "http://127.0.0.1:9", "--dump-dir", str(where)]
    res = subprocess.run([sys.executable, "-m", "hsmon", *argv], capture_output=True, text=True, timeout=120,
                         env=child_env())
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert f"{where} is writable by its group or others (mode 0777): chmod 700 {where}" in res.stderr


def tensors() -> dict[str, torch.Tensor]:
    return {"hidden_state": torch.randn(3, 4), "aux_hidden_state": torch.randn(3, 12)}


def test_the_plugin_writes_only_into_a_directory_of_its_own_and_through_no_link(tmp_path):
    root = tmp_path / "root"
    open_dir = root / "open"
    open_dir.mkdir(parents=True, mode=0o700)
    open_dir.chmod(0o777)
    marker = dump.write_dump(str(open_dir), "r1-aa-1", tensors(), {"tokens": "3"})
    assert not marker["ok"] and "chmod 700" in marker["error"] and not list(open_dir.iterdir())
    with pytest.raises(dump.DumpRefused, match="belongs to uid 65534"):
        theirs = root / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, NOBODY, NOBODY)
        dump.check_dump_dir(str(theirs), str(root))
    mine = root / "mine"
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    fd = dump.open_dump_dir(str(mine))  # made 0700 and held
    (mine / ".r2-aa-1.safetensors.tmp").symlink_to(victim)  # planted at the temporary name
    marker = dump.write_dump(str(mine), "r2-aa-1", tensors(), {"tokens": "3"}, dir_fd=fd)
    assert not marker["ok"] and victim.read_text() == "precious\n"
    assert not os.path.lexists(mine / ".r2-aa-1.safetensors.tmp")  # the planted link removed, not followed
    os.rename(mine, root / "moved")  # the path swapped after the check: the held directory is written
    (root / "mine").symlink_to(tmp_path)
    marker = dump.write_dump(str(mine), "r3-aa-1", tensors(), {"tokens": "3"}, dir_fd=fd)
    os.close(fd)
    assert marker["ok"] and (root / "moved" / "r3-aa-1.safetensors").is_file()
    assert oct((root / "moved" / "r3-aa-1.safetensors").stat().st_mode & 0o777) == oct(0o600)
    assert not (tmp_path / "r3-aa-1.safetensors").exists()


def test_the_plugin_checks_a_dump_directory_made_again(tmp_path):
    """The held directory serves the next requests while its path names it; made again by the
    client (removed at its end, made at the next start), it is checked again: refused when open."""
    job = tmp_path / "job"
    _, first = dump.held_dump_dir(str(job), str(tmp_path))
    _, again = dump.held_dump_dir(str(job), str(tmp_path))
    assert os.fstat(first).st_ino == os.fstat(again).st_ino == job.stat().st_ino
    for fd in (first, again):
        os.close(fd)
    job.rmdir()
    job.mkdir()
    job.chmod(0o777)
    with pytest.raises(dump.DumpRefused, match="chmod 700"):
        dump.held_dump_dir(str(job), str(tmp_path))


def test_the_plugin_holds_no_dump_directory_between_requests(tmp_path):
    """A checked directory is remembered by identity, not held open: once the request's own
    descriptor is closed, the server keeps nothing there (a tmpfs under the dump root can be
    unmounted, a removed directory is gone), and a second request opens it again."""
    job = tmp_path / "job"
    for _ in range(2):
        _, fd = dump.held_dump_dir(str(job), str(tmp_path))
        os.close(fd)
    held = [os.readlink(f"/proc/self/fd/{n}") for n in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{n}")]
    assert str(job) not in held
