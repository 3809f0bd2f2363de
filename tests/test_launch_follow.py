"""The training launch's follow option (issue 29): the TUI form and the daemon's POST /api/v1/train
start `hsmon train DATA --follow --passes E [--consume]` on a running extraction, its events in
the spool where the monitor reads the online job's trainer (contract 4)."""

from __future__ import annotations

from hsmon.contracts import layout, spool
from hsmon.launch import training_argv, validate_training_request


def spool_dir(tmp_path):
    out = tmp_path / "spool"
    out.mkdir()
    layout.append_jsonl(out / layout.MANIFEST_NAME, [{"type": "run"}])
    spool.write_spool_limit(out, 20_000_000)
    return out


def test_follow_passes_and_consume_reach_the_trainer_and_its_events_go_to_the_spool(tmp_path):
    data = spool_dir(tmp_path)
    req, errors = validate_training_request({"data_dir": str(data), "out_dir": str(tmp_path / "d"),
                                             "follow": "yes", "passes": "2", "consume": "yes"})
    assert errors == {} and req is not None and req.follow and req.consume and req.passes == 2
    argv = training_argv(req, python="/usr/bin/python3")
    assert argv[argv.index("--events") + 1] == str(spool.train_events_path(data))
    assert argv[-4:] == ["--follow", "--passes", "2", "--consume"]
    plain, _ = validate_training_request({"data_dir": str(data), "out_dir": str(tmp_path / "d"),
                                          "follow": "no", "passes": "", "consume": ""})
    assert plain is not None and "--follow" not in training_argv(plain, python="/usr/bin/python3")
    assert plain.events_path == str(tmp_path / "d" / "events.jsonl")


def test_follow_fields_are_checked_and_named(tmp_path):
    data = spool_dir(tmp_path)
    base = {"data_dir": str(data), "out_dir": str(tmp_path / "d")}
    _, errors = validate_training_request({**base, "follow": "maybe"})
    assert errors == {"follow": "follow must be yes or no (got 'maybe')"}
    _, errors = validate_training_request({**base, "passes": "3", "consume": "yes"})
    assert set(errors) == {"passes", "consume"} and "set follow to yes" in errors["passes"]
    _, errors = validate_training_request({**base, "follow": True, "passes": "0"})
    assert errors == {"passes": "passes must be at least 1 and at most 1000 (got 0)"}
