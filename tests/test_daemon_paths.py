"""Every spelling of a path that could leave the daemon's allowed roots, sent to a real daemon
with a control token: each is refused in one line naming the field, and nothing is created
outside the roots (hsmon/launch/paths.py). The daemon runs from inside its only root with HOME
outside it, as an operator might start it."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path

import pytest
from daemon_helpers import Daemon, Procs, child_env, post_json

from hsmon.launch import training as launch
from hsmon.launch.paths import PathRefused, PathRule

TOKEN = "0123456789abcdef-paths-token"


def extraction_output(where: Path) -> Path:
    """What validation takes for an extraction's output: a manifest (the launch reads no rows)."""
    where.mkdir(parents=True)
    (where / "hsmon-manifest.jsonl").write_text("")
    return where


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """One daemon for the module: root (allowed, the daemon's working directory), outside (its
    HOME), a trainer that exits at once."""
    base = tmp_path_factory.mktemp("paths")
    root, outside = base / "root", base / "outside"
    extraction_output(root / "data")
    outside.mkdir()
    extraction_output(outside / "data")
    (outside / "model").mkdir()
    token = base / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    procs = Procs()
    env = child_env(HOME=str(outside), HSMON_TRAIN_COMMAND=f"{sys.executable} -c pass")
    daemon = Daemon(procs, base, ["--control-token-file", str(token), "--allow-root", str(root)],
                    env=env, cwd=str(root))
    yield root, outside, daemon
    procs.close()


def train(daemon: Daemon, body: dict) -> tuple[int, dict]:
    return post_json(daemon.url + "/api/v1/train", body, token=TOKEN)


def everything_under(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


@pytest.mark.parametrize(("field", "value", "why"), [
    ("out_dir", " {outside}/o1", "leading or trailing whitespace"),
    ("out_dir", "{root}/o2 ", "leading or trailing whitespace"),
    ("data_dir", " {outside}/data", "leading or trailing whitespace"),
    ("out_dir", "~/o3", "does not expand ~"),
    ("out_dir", "~root/o4", "does not expand ~"),
    ("out_dir", "o5", "is relative"),
    ("out_dir", "../outside/o6", "is relative"),
    ("out_dir", "{root}/../outside/o7", "outside the daemon's allowed roots"),
    ("out_dir", 7, "must be a path (a JSON string)"),
    ("out_dir", ["{outside}/o8"], "must be a path (a JSON string)"),
    ("data_dir", "{outside}/data", "outside the daemon's allowed roots"),
    ("target_model", "..", "is relative"),
    ("target_model", "~", "does not expand ~"),
    ("target_model", "model", "is relative"),
    ("target_model", 3, "must be a path (a JSON string)"),
    ("target_model", "{outside}/model", "outside the daemon's allowed roots"),
    ("target_model", " embedded", "leading or trailing whitespace"),
])
def test_every_spelling_of_a_path_outside_is_refused(site, field, value, why):
    root, outside, daemon = site
    before = everything_under(outside)
    if isinstance(value, str):
        value = value.format(root=root, outside=outside)
    elif isinstance(value, list):
        value = [v.format(root=root, outside=outside) for v in value]
    body = {"data_dir": str(root / "data"), "out_dir": str(root / "out-ok"), field: value}
    code, reply = train(daemon, body)
    assert code == 400 and why in reply["errors"][field], reply
    assert "\n" not in reply["errors"][field]
    assert everything_under(outside) == before  # nothing made outside the root
    assert not (root / "o5").exists() and not (root / "out-ok").exists()


def test_a_preset_target_is_not_a_path_and_still_launches(site):
    root, _outside, daemon = site
    code, reply = train(daemon, {"data_dir": str(root / "data"), "out_dir": str(root / "drafter"),
                                 "target_model": "embedded"})
    assert code == 201, reply
    assert reply["out_dir"] == str(root / "drafter") and (root / "drafter" / "train.pid").is_file()
    assert reply["argv"][reply["argv"].index("--target-model") + 1] == "embedded"


def test_a_data_dir_whose_chunk_links_outside_is_refused(site):
    root, outside, daemon = site
    data = extraction_output(root / "linked")
    (data / "rows_0-10").mkdir()
    (data / "rows_0-10" / "data_0.ckpt").symlink_to(outside / "data" / "hsmon-manifest.jsonl")
    code, reply = train(daemon, {"data_dir": str(data), "out_dir": str(root / "linked-out")})
    assert code == 400 and "data_0.ckpt links to" in reply["errors"]["data_dir"], reply
    assert not (root / "linked-out").exists()


def test_a_target_model_whose_files_link_out_of_the_roots_is_refused(site):
    """A model directory inside the root whose weights are a link to a file outside: refused as
    data_dir's links are (it was accepted with 201 before)."""
    root, outside, daemon = site
    (outside / "weights.safetensors").write_bytes(b"not yours")
    model = root / "linked-model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").symlink_to(outside / "weights.safetensors")
    code, reply = train(daemon, {"data_dir": str(root / "data"), "out_dir": str(root / "model-out"),
                                 "target_model": str(model)})
    assert code == 400 and "model.safetensors links to" in reply["errors"]["target_model"], reply
    assert "\n" not in reply["errors"]["target_model"] and not (root / "model-out").exists()


def test_a_link_swapped_in_while_the_daemon_launches_leads_nowhere(site):
    """A thread swaps root/swap between a directory and a link to outside while trainings into
    root/swap/N are asked for: whatever the timing, nothing is ever created outside."""
    root, outside, daemon = site
    swap, done = root / "swap", threading.Event()
    before = everything_under(outside)

    def flip() -> None:
        n = 0
        while not done.is_set():  # the daemon may make root/swap itself at any point: no step is sure
            n += 1
            for step in (swap.mkdir, lambda n=n: swap.rename(root / f"was-{n}"),
                         lambda: swap.symlink_to(outside), swap.unlink):
                with contextlib.suppress(OSError):
                    step()

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    try:
        codes = [train(daemon, {"data_dir": str(root / "data"), "out_dir": str(swap / f"d{i}")})[0]
                 for i in range(40)]
    finally:
        done.set()
        flipper.join(10)
    assert everything_under(outside) == before
    assert set(codes) <= {201, 400}, (codes, daemon.stderr_path.read_text()[-3000:])
    made = [*root.glob("was-*/d*/train.pid"), *([] if swap.is_symlink() else swap.glob("d*/train.pid"))]
    assert len(made) == codes.count(201)  # each accepted launch wrote inside a real directory


def test_a_parent_that_disappears_while_it_is_checked_is_an_error_of_the_field(tmp_path, monkeypatch):
    """Deterministic form of the race above: the nearest existing parent of out_dir is moved away
    between the look that finds it and the look at its filesystem. A one-line error of out_dir (a
    400), never an OSError out of the check (it was a 500 from the daemon, about 1 launch in 15)."""
    root = tmp_path / "root"
    extraction_output(root / "data")
    (root / "swap").mkdir()
    real_access = os.access

    def access_then_gone(path, mode, **kwargs):
        if Path(path) == root / "swap" and (root / "swap").exists():
            (root / "swap").rename(root / "moved")
            return False
        return real_access(path, mode, **kwargs)

    monkeypatch.setattr(os, "access", access_then_gone)
    req, errors = launch.validate_training_request(
        {"data_dir": str(root / "data"), "out_dir": str(root / "swap" / "d1")},
        PathRule(remote=True, roots=(str(root),)))
    assert req is None, errors
    assert errors["out_dir"].endswith("disappeared while it was being checked; try again"), errors


def test_the_launch_repeats_the_check_on_what_it_creates(tmp_path):
    """Deterministic: the request is checked, then a part of out_dir becomes a link to outside
    before the launch creates it: refused, nothing written outside."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    extraction_output(root / "data")
    outside.mkdir()
    (root / "part").mkdir()
    rule = PathRule(remote=True, roots=(str(root),))
    req, errors = launch.validate_training_request(
        {"data_dir": str(root / "data"), "out_dir": str(root / "part" / "out")}, rule)
    assert req is not None, errors
    (root / "part").rename(root / "moved")
    (root / "part").symlink_to(outside)
    with pytest.raises(PathRefused, match="became a symbolic link"):
        launch.launch_training(req, argv=[sys.executable, "-c", "pass"])
    assert list(outside.iterdir()) == []
    os.unlink(root / "part")
    (root / "part").mkdir()
    job = launch.launch_training(req, argv=[sys.executable, "-c", "pass"])
    assert Path(job.out_dir, "train.pid").read_text().strip() == str(job.pid)
