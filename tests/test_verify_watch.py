"""The engine check's pure parts: its verdict → hints rule (through ``decide``), the reading of a
finished `hsmon verify-data --json`, and its configuration (TOML and flags). No threads, no
processes: the real checks run in tests/test_data_facts.py (hf) and tests/test_extract_sglang.py
(a real SGLang server, a real Prometheus)."""

from __future__ import annotations

import argparse
import json

import pytest

from hsmon import daemon
from hsmon.core.config import ConfigError, load_toml
from hsmon.core.state import decide
from hsmon.core.state_facts import Snapshot
from hsmon.core.verify_watch import VerifyResult, judge


def verify_hints(result: VerifyResult) -> list[dict]:
    snap = Snapshot(now=1000.0, stall_after=300.0, watch_start_ts=990.0, verify=result)
    return [h.as_dict() for h in decide(snap).hints]


def result(verdict: str | None, **kw) -> VerifyResult:
    base = {"chunk": "rows_4000-6000", "rows_checked": 3, "against": "http://10.0.0.5:30000",
            "checked_ts": 999.0, "seconds": 12.0, "checks_total": 2}
    return VerifyResult(verdict=verdict, **{**base, **kw})


def test_agree_running_and_unset_give_no_hint():
    assert verify_hints(result("agree", worst_cosine=0.99999, max_abs_diff=2e-5)) == []
    assert verify_hints(result("running", checks_total=0)) == []
    assert verify_hints(result(None, checks_total=0)) == []


def test_disagree_is_critical_and_names_the_chunk_and_the_worst_figure():
    (hint,) = verify_hints(result("disagree", worst_cosine=0.973, max_abs_diff=0.41, disagreements_total=1,
                                  reason="layers 5, final differ beyond the float32 tolerance, ..."))
    assert hint["id"] == "engine-mismatch" and hint["severity"] == "critical"
    assert hint["message"].startswith(
        "the data at rows 4000-6000 is not what the engine computes: 3 rows re-extracted by "
        "http://10.0.0.5:30000 disagree: layers 5, final differ beyond the float32 tolerance, ... (worst "
        "cosine 0.973000, max abs diff 0.41). Do not train on it for this engine")
    assert "worst cosine 0.973000, max abs diff 0.41" in hint["message"]


@pytest.mark.parametrize("verdict,reason,said", [
    ("error", "cannot start the sglang backend: connection refused", "failed"),
    ("timeout", "no verdict within the budget of 600 s", "ran out of time"),
])
def test_a_check_that_proves_nothing_is_a_warning_never_critical(verdict, reason, said):
    (hint,) = verify_hints(result(verdict, reason=reason))
    assert hint == {"id": f"verify-{verdict}", "severity": "warning", "message":
                    f"the engine check of rows 4000-6000 against http://10.0.0.5:30000 {said}: {reason}. The "
                    "data is not checked (nothing is known to be wrong with it); the next check runs after "
                    "the next chunks."}


def test_agree_after_an_earlier_disagreement_still_warns():
    (hint,) = verify_hints(result("agree", disagreements_total=1, checks_total=3))
    assert hint["id"] == "engine-mismatch-earlier" and hint["severity"] == "warning"
    assert hint["message"].startswith(
        "1 of 3 engine checks disagreed earlier; the latest (rows 4000-6000) agrees")


def test_judge_reads_the_report_and_the_failure_line():
    report = {"verdict": "disagree", "rows": [1, 2], "worst_cosine": 0.9, "max_abs_diff": float("inf")}
    verdict, got = judge(1, ("noise\n" + json.dumps(report) + "\n").encode(), b"")
    assert verdict == "disagree" and got["rows"] == [1, 2]
    assert judge(0, json.dumps({**report, "verdict": "agree"}).encode(), b"")[0] == "agree"
    assert judge(2, b"", b"torch noise\nhsmon verify-data: --chunk rows_0-3: no rows\n") == \
        ("error", {"reason": "--chunk rows_0-3: no rows"})
    assert judge(-9, b"", b"") == ("error", {"reason": "killed by signal 9"})
    assert judge(1, b"not json", b"Traceback ...\nValueError: x") == ("error", {"reason": "ValueError: x"})


def test_toml_and_flags_configure_the_check_with_one_line_errors(tmp_path):
    good = tmp_path / "ok.toml"
    good.write_text(f'[[job]]\nname = "x"\nout_dir = "{tmp_path}"\nverify_every = 4\n'
                    'verify_against = "http://127.0.0.1:30000/"\nverify_sample = 2\n')
    spec = load_toml(str(good)).jobs[0].verify
    assert (spec.every, spec.against, spec.sample, spec.model) == (4, "http://127.0.0.1:30000", 2, None)
    bad = {"verify_every = 4\n": "needs both verify_every = N and verify_against",
           'verify_every = 0\nverify_against = "hf"\n': "verify_every must be a whole number of chunks >= 1",
           'verify_every = 1\nverify_against = "gpu1:30000"\n': "verify_against 'gpu1:30000' is not valid"}
    for text, said in bad.items():
        path = tmp_path / "bad.toml"
        path.write_text(f'[[job]]\nname = "x"\nout_dir = "{tmp_path}"\n{text}')
        with pytest.raises(ConfigError, match=said):
            load_toml(str(path))
    parser = argparse.ArgumentParser()
    daemon.add_arguments(parser)
    with pytest.raises(ConfigError, match=r"--verify-every N and --verify-against URL\|hf go together"):
        daemon.build_config(parser.parse_args(["--out", str(tmp_path), "--verify-every", "2"]))
    with pytest.raises(ConfigError, match="verify_every needs the job's out_dir"):
        daemon.build_config(parser.parse_args(["--pid", "1", "--verify-every", "2",
                                               "--verify-against", "hf"]))
    cfg = daemon.build_config(parser.parse_args(["--out", str(tmp_path), "--verify-every", "2",
                                                 "--verify-against", "hf", "--verify-budget", "30"]))
    assert cfg.jobs[0].verify.budget == 30 and cfg.jobs[0].verify.where == "hf:the data's model"
    run = {"type": "run", "settings": {"model": "/m/x"}}
    (tmp_path / "hsmon-manifest.jsonl").write_text(json.dumps(run) + "\n")
    from hsmon.core.verify_watch import VerifyWatch

    assert VerifyWatch(cfg.jobs[0].verify, str(tmp_path)).result.against == "hf:/m/x"


def test_verify_data_refuses_a_chunk_without_rows_in_one_line(tmp_path):
    """`hsmon verify-data --chunk` (what the daemon runs) names the chunk and the fix, before torch."""
    import subprocess
    import sys

    from extractor.embedded_target import ensure_embedded_target

    records = [{"type": "run", "settings": {"model": str(ensure_embedded_target()), "layers": [2, 4, 5]}},
               {"type": "row", "row": 0, "chunk": "rows_0-2000", "tokens": 5}]
    (tmp_path / "hsmon-manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    proc = subprocess.run([sys.executable, "-m", "hsmon", "verify-data", str(tmp_path), "--chunk",
                           "rows_4000-6000", "--backend", "hf", "--json"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"hsmon verify-data: --chunk rows_4000-6000: no rows of {tmp_path} in that chunk; give a chunk "
        "directory's name"]


@pytest.mark.parametrize("against", ["hf", "http://127.0.0.1:30000"])
def test_the_check_command_is_one_verify_data_accepts(tmp_path, against):
    """The daemon's engine check runs `hsmon verify-data` with options of its backend only (an SGLang
    option on an hf check is refused in one line since verify-data checks them)."""
    from extractor import verify
    from extractor.backend_options import VERIFY_OPTIONS, misplaced_option
    from hsmon.core.verify_watch import VerifySpec, VerifyWatch

    argv = VerifyWatch(VerifySpec(5, against, sample=2, budget=60), str(tmp_path)).argv("rows_0-16")
    argv = argv[argv.index("verify-data") + 1:]
    parser = argparse.ArgumentParser()
    verify.add_arguments(parser)
    args = parser.parse_args(argv)
    backend = args.backend or ("sglang" if args.against else "hf")
    assert misplaced_option(args, backend, VERIFY_OPTIONS, verify.add_arguments) is None, argv
