"""Bad input on the operator's path: each gets one line on stderr naming the input and the fix, and
exit 2 (never a traceback, never a silent success). Run in-process through `hsmon`'s own entry
point, as the console script runs it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from extractor import cli as extract_cli
from extractor import verify
from extractor.backend_options import EXTRACT_OPTIONS, REGENERATE_OPTIONS, SGLANG, VERIFY_OPTIONS
from extractor.regenerate import cli as regenerate_cli
from hsmon import cli
from hsmon.core.trackers.progress import ProgressTracker


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one line `hsmon ARGV` refuses with (exit 2, no traceback)."""
    try:
        rc = cli.main(list(argv))
    except SystemExit as exc:  # argparse's own refusal
        rc = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, (argv, err)
    assert "Traceback" not in "\n".join(err)
    return err[-1]


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"text": "hello there"}) + "\n")
    return data


@pytest.mark.parametrize("option", ["--url http://127.0.0.1:1", "--transport json", "--dump-dir /dev/shm/x",
                                    "--concurrency 4", "--row-attempts 5"])
def test_sglang_option_without_sglang_backend_is_refused(capsys, dataset, tmp_path, option):
    flag, value = option.split(" ", 1)
    line = refused(capsys, "extract", str(dataset), "--out", str(tmp_path / "o"), flag, value, "--dry-run")
    assert f"{flag} belongs to --backend sglang" in line and "add --backend sglang" in line
    assert not (tmp_path / "o").exists()  # nothing planned, nothing written


def test_regenerate_refuses_another_backends_options_and_rows_it_cannot_answer(capsys, dataset, tmp_path):
    out = str(tmp_path / "o")
    line = refused(capsys, "regenerate", str(dataset), "--out", out, "--url", "http://127.0.0.1:1")
    assert "--url belongs to --backend sglang" in line and "add --backend sglang" in line
    line = refused(capsys, "regenerate", str(dataset), "--out", out, "--backend", "sglang", "--threads", "2")
    assert "--threads belongs to --backend hf" in line
    line = refused(capsys, "regenerate", str(dataset), "--out", out, "--max-new-tokens", "0")
    assert "--max-new-tokens 0: give at least 1" in line
    line = refused(capsys, "regenerate", str(dataset), "--out", out, "--dry-run")  # a text row: no turns
    assert f"no row of {dataset} can be regenerated" in line and "no user turn: a text row" in line
    assert not (tmp_path / "o").exists()


def test_device_is_checked_and_belongs_to_hf(capsys, dataset, tmp_path):
    out = str(tmp_path / "o")
    assert "--device 'gpu' is not a device" in refused(capsys, "extract", str(dataset), "--out", out,
                                                        "--device", "gpu", "--dry-run")
    line = refused(capsys, "extract", str(dataset), "--out", out, "--backend", "sglang",
                   "--url", "http://127.0.0.1:1", "--device", "cuda", "--dry-run")
    assert "--device belongs to --backend hf" in line


def test_verify_data_refuses_sglang_options_on_hf(capsys, tmp_path):
    (tmp_path / "o").mkdir()
    line = refused(capsys, "verify-data", str(tmp_path / "o"), "--backend", "hf", "--against", "http://x:1")
    assert "--against belongs to --backend sglang" in line


@pytest.mark.parametrize(("add_arguments", "table", "group"), [
    (extract_cli.add_arguments, EXTRACT_OPTIONS, "backend sglang"),
    (verify.add_arguments, VERIFY_OPTIONS, None),
    (regenerate_cli.add_arguments, REGENERATE_OPTIONS, "backend sglang"),
])
def test_backend_tables_match_the_parsers(add_arguments, table, group):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    dests = {a.dest for a in parser._actions}
    assert set(table) <= dests, set(table) - dests  # no stale entry
    if group is not None:  # every option of the backend's own group is entered as that backend's
        grouped = {a.dest for g in parser._action_groups if g.title and g.title.startswith(group)
                   for a in g._group_actions}
        owners = {d: (lambda o: (o,) if isinstance(o, str) else o)(table.get(d) or ()) for d in grouped}
        assert grouped and all(SGLANG in owners[d] for d in grouped), grouped - set(table)


@pytest.mark.parametrize(("argv", "expected"), [
    (["daemon", "--out", "/tmp", "--port", "99999"], "'99999' is not a port: give a number from 0 to 65535"),
    (["sglang-serve", "--port", "abc"], "'abc' is not a port"),
    (["status", "--url", "localhost:9108"], "--url localhost:9108: give a full URL such as http://localhost:9108"),
    (["status", "--out", "/nonexistent-typo-dir"], "--out /nonexistent-typo-dir: no such directory"),
    (["verify-data", "/nonexistent-typo-dir"], "/nonexistent-typo-dir: no such directory"),
])
def test_bad_flags_get_one_line(capsys, argv, expected):
    assert expected in refused(capsys, *argv)


@pytest.mark.parametrize(("daemon_table", "expected"), [
    ('port = "abc"', "[daemon] port 'abc' is not valid: give a number from 0 to 65535"),
    ("port = 99999", "[daemon] port 99999 is not valid"),
    ("host = 5", "[daemon] host 5 is not valid"),
    ("scan_interval = 0", "[daemon] scan_interval 0 is not valid"),
])
def test_bad_toml_values_name_the_key(capsys, tmp_path, daemon_table, expected):
    config = tmp_path / "hsmon.toml"
    config.write_text(f"[daemon]\n{daemon_table}\n[[job]]\nout_dir = '{tmp_path}'\n")
    line = refused(capsys, "daemon", "--config", str(config))
    assert str(config) in line and expected in line


def test_a_job_watched_through_its_events_is_what_its_start_event_says(tmp_path):
    """`hsmon daemon --events EV` without --kind: the job's kind comes from its own start event."""
    from hsmon.contracts import events as ev

    cases = {
        "extract": {"backend": "hf", "layers": [2, 4, 5], "out_dir": str(tmp_path)},
        "train": {"backend": "train", "output_dir": str(tmp_path)},
        None: {"backend": "something-else"},
    }
    for kind, fields in cases.items():
        path = tmp_path / f"{kind}.jsonl"
        with ev.EventWriter("j", path=str(path)) as writer:
            writer.emit(ev.START, pid=1, **fields)
        tracker = ProgressTracker(str(path))
        tracker.poll()
        assert tracker.started_as == kind
