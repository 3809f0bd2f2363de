"""A daemon told to watch a path that does not exist says so once in its log and, while it is
missing, in the job's status (hint `path-missing`), instead of waiting in silence: a real daemon."""

from __future__ import annotations

from daemon_helpers import Daemon, procs, wait_until  # noqa: F401 (procs is a fixture)


def test_a_missing_out_is_said_once_in_the_log_and_in_the_status_until_it_appears(
        procs, tmp_path):  # noqa: F811
    missing = tmp_path / "no" / "such" / "dir"
    daemon = Daemon(procs, tmp_path, ["--out", str(missing), "--scan-interval", "0.2"])
    job = wait_until(lambda: (j := daemon.job())["hints"] and j, what="a hint")
    hint = next(h for h in job["hints"] if h["id"] == "path-missing")
    assert hint["severity"] == "warning" and hint["message"].startswith(f"--out {missing} does not exist")
    assert job["state"] == "starting"
    seen = daemon.status()["generated_ts"]  # ticks go on (0.2 s apart) while it is missing: one line still
    wait_until(lambda: daemon.status()["generated_ts"] > seen + 1.0, what="five more ticks")
    missing.mkdir(parents=True)
    wait_until(lambda: "path-missing" not in [h["id"] for h in daemon.job()["hints"]], what="it appeared")
    daemon.stop()
    said = [line for line in daemon.stderr_path.read_text().splitlines() if "does not exist" in line]
    assert len(said) == 1 and f"--out {missing} does not exist" in said[0], said
