"""Nothing in an output directory is code, and no link in it is followed.

Output directories live on shared storage: whoever can write there can plant a pickle or a link.
Real `hsmon train --resume` and `hsmon extract` processes meet a planted pickle and planted links;
the writers of the contracts (events, lock, claims, ledger, manifest, chunks, checkpoints) meet a
link at every place they write, on a real filesystem; a launched training gets the directory the
launch checked, and refuses one swapped for another."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_helpers import child_env, wait_until

from hsmon.contracts import events as ev
from hsmon.contracts import layout, nofollow, spool, writer_lock
from hsmon.contracts.spool_fill import SpoolClaims
from hsmon.contracts.spool_ledger import LedgerWriter
from hsmon.launch import training as launch
from trainer.checkpoint import save_checkpoint

EVIL = """
import os, sys, torch
class Evil:
    def __reduce__(self):
        return (os.system, (f"touch {sys.argv[2]}",))
torch.save({"model": {}, "step": 1, "evil": Evil()}, sys.argv[1])
"""


def hsmon(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hsmon", *argv], capture_output=True, text=True, timeout=120,
                          env=child_env())


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A target directory (config only: the resume is refused before anything else is read), an empty
    data directory, and a training output with its checkpoints directory."""
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text("{}")
    (tmp_path / "data").mkdir()
    (tmp_path / "out" / "checkpoints").mkdir(parents=True)
    return tmp_path


@pytest.mark.parametrize("where", ["latest-names-a-file-outside", "a-step-file"])
def test_neither_pickle_runs_on_resume(site: Path, where: str) -> None:
    ran = site / "RAN"
    checkpoints = site / "out" / "checkpoints"
    if where == "a-step-file":
        pickle_path = checkpoints / "step-00000007.pt"
    else:
        pickle_path = site / "elsewhere.pt"  # LATEST joined to the directory used to escape it
        (checkpoints / "LATEST").write_text(f"{pickle_path}\n")
    subprocess.run([sys.executable, "-c", EVIL, str(pickle_path), str(ran)], check=True, timeout=120)
    res = hsmon("train", str(site / "data"), "--out", str(site / "out"), "--resume",
                "--target-model", str(site / "target"), "--events", str(site / "events.jsonl"))
    assert not ran.exists(), "the pickle ran"
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    named = checkpoints / ("LATEST" if where != "a-step-file" else "step-00000007.pt")
    assert res.stderr.startswith(f"hsmon train: {named} ") and "refused" in res.stderr, res.stderr


@pytest.mark.parametrize("command", ["train", "extract"])
def test_a_lock_planted_as_a_link_leaves_its_victim_unchanged(site: Path, command: str) -> None:
    victim = site / "victim"
    victim.write_text("precious\n")
    lock = writer_lock.TRAIN_LOCK if command == "train" else writer_lock.EXTRACT_LOCK
    (site / "out" / lock).symlink_to(victim)
    if command == "train":
        res = hsmon("train", str(site / "data"), "--out", str(site / "out"),
                    "--target-model", str(site / "target"), "--events", str(site / "events.jsonl"))
    else:
        (site / "rows.jsonl").write_text('{"text": "hello"}\n')
        res = hsmon("extract", str(site / "rows.jsonl"), "--out", str(site / "out"))
    assert victim.read_text() == "precious\n"
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert f"{site / 'out' / lock} is a symbolic link" in res.stderr, res.stderr


def plant(link: Path, target: Path) -> Path:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return target


def test_no_writer_of_an_output_directory_follows_a_link(tmp_path: Path) -> None:
    """Each place hsmon writes below a held output directory, made a link to a victim: refused in
    one line, the victim (a file, or a directory and what it holds) unchanged."""
    out, victims = tmp_path / "out", tmp_path / "victims"
    victims.mkdir()
    (victims / "dir").mkdir()
    (victims / "dir" / "step-00000001.pt").write_text("theirs\n")
    (victims / "file").write_text("precious\n")
    out.mkdir()
    held = writer_lock.acquire(out, writer_lock.TRAIN_LOCK, "test", "--out")
    writes = {
        "events.jsonl": lambda: ev.EventWriter("j", out / "events.jsonl").emit(ev.START),
        ".hsmon-spool.lock": lambda: SpoolClaims(out, "hsmon-manifest.jsonl"),
        f"{spool_fill_claim('hsmon-manifest.jsonl')}": lambda: SpoolClaims(out, "hsmon-manifest.jsonl"),
        spool.LEDGER_NAME: lambda: LedgerWriter(out).append("start"),
        layout.MANIFEST_NAME: lambda: layout.append_jsonl(out / layout.MANIFEST_NAME, [{"type": "run"}]),
        "rows_0-4": lambda: layout.atomic_write(out / "rows_0-4" / "data_0.ckpt", lambda fh: fh.write(b"x")),
        "checkpoints": lambda: save_checkpoint(out, 2, {"model": {}, "step": 2}, keep=1),
        "tmp": lambda: layout.atomic_write(out / "index.json", lambda fh: fh.write(b"{}")),
    }
    try:
        for name, write in writes.items():
            target = victims / ("dir" if name in ("rows_0-4", "checkpoints") else "file")
            link = out / name if name != "tmp" else out / f".index.json{layout.TMP_MARK}{os.getpid()}"
            plant(link, target)
            if name == "tmp":  # a planted temporary name: removed, never written through
                write()
                assert not link.is_symlink() and (out / "index.json").read_bytes() == b"{}"
            else:
                with pytest.raises(nofollow.LinkRefused) as exc:
                    write()
                assert str(link) in exc.value.strerror and "\n" not in exc.value.strerror, name
            link.unlink(missing_ok=True)
            assert (victims / "file").read_text() == "precious\n", name
            assert sorted(p.name for p in (victims / "dir").iterdir()) == ["step-00000001.pt"], name
    finally:
        held.release()


def spool_fill_claim(manifest: str) -> str:
    from hsmon.contracts.spool_fill import CLAIM_PREFIX

    return f"{CLAIM_PREFIX}{manifest}"


PROBE = ("import json, os; d = json.loads(os.environ['HSMON_CHECKED_DIRS']); "
         "print(json.dumps({p: os.readlink(f'/proc/self/fd/{fd}') for p, fd in d.items()}))")


def test_a_launched_training_gets_the_checked_directory_and_refuses_a_swapped_one(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    req = launch.TrainingRequest(data_dir=str(root / "data"), out_dir=str(root / "out"), roots=(str(root),))
    launch.launch_training(req, argv=[sys.executable, "-c", PROBE], env=child_env())
    log = root / "out" / "train.log"
    wait_until(lambda: log.read_text().strip(), timeout=30, what="the probe's line in train.log")
    assert json.loads(log.read_text()) == {str(root / "out"): str(root / "out")}
    # a trainer handed a directory that its path no longer names: refused, nothing written
    held = os.open(root / "out", os.O_RDONLY | os.O_DIRECTORY)
    os.rename(root / "out", root / "moved")
    (root / "out").mkdir()
    env = child_env(HSMON_CHECKED_DIRS=nofollow.checked_env({str(root / "out"): held}))
    res = subprocess.run([sys.executable, "-c", "from hsmon.contracts import writer_lock as w; "
                          f"w.acquire(__import__('pathlib').Path({str(root / 'out')!r}), 'l', 'x', '--out')"],
                         env=env, pass_fds=(held,), capture_output=True, text=True, timeout=60)
    os.close(held)
    assert res.returncode != 0 and "is no longer the directory the daemon checked" in res.stderr
    assert list((root / "out").iterdir()) == [] and not (root / "moved" / "l").exists()
