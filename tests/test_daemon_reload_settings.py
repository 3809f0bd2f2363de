"""SIGHUP applies the daemon's own settings, not only its jobs: the allowed roots, the webhook, the
scan interval and the TLS certificate (read again from its files), or names what takes a restart.
A real daemon, real signals, real webhooks and certificates."""

from __future__ import annotations

import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

from daemon_helpers import Daemon, WebhookReceiver, child_env, get_json, post_json, procs, wait_until  # noqa: F401

TOKEN = "0123456789abcdef-reload-token"


def settings(roots: list[Path], webhook: str, scan: float, token: Path, events: Path) -> str:
    return (f"[daemon]\nallow_roots = {[str(r) for r in roots]!r}\nscan_interval = {scan}\n"
            f'notify_webhook = "{webhook}"\ncontrol_token_file = "{token}"\n'
            f'\n[[job]]\nname = "j"\nevents = "{events}"\nstall_after = 600\n').replace("'", '"')


def token_file(path: Path) -> Path:
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


def event(kind: str) -> str:
    return f'{{"v": 1, "ts": {time.time()}, "job": "j", "kind": "{kind}", "rows_done": 1, "rows_total": 1}}\n'


def reload(daemon: Daemon, expect: str) -> str:
    daemon.proc.send_signal(signal.SIGHUP)
    return wait_until(lambda: expect in (t := daemon.stderr_path.read_text()) and t, what=expect)


def test_sighup_applies_roots_webhook_and_scan_interval_and_names_what_needs_a_restart(procs, tmp_path):  # noqa: F811
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        (root / "data").mkdir(parents=True)
        (root / "data" / "hsmon-manifest.jsonl").write_text("")
    events = tmp_path / "j.jsonl"
    events.write_text(event("start"))
    first, second = WebhookReceiver(), WebhookReceiver()
    cfg = tmp_path / "hsmon.toml"
    cfg.write_text(settings([a, b], first.url, 60, token_file(tmp_path / "t1"), events))
    try:
        daemon = Daemon(procs, tmp_path, ["--config", str(cfg)],
                        env=child_env(HSMON_TRAIN_COMMAND=f"{sys.executable} -c pass"))
        scans = get_json(daemon.url + "/api/v1/status")["daemon"]["scans_total"]
        cfg.write_text(settings([a], second.url, 0.2, token_file(tmp_path / "t2"), events))
        log = reload(daemon, "reloaded in ")
        assert "takes a restart" not in log, log  # the token file is read again (the same token here)
        host = second.url.split("://")[1].split("/")[0]
        assert f"allow_roots {a}" in log and f"notifications to http://{host}/(redacted)" in log, log
        assert "scan_interval 0.2 s" in log, log
        code, reply = post_json(daemon.url + "/api/v1/train", {"data_dir": str(b / "data"),
                                                                "out_dir": str(b / "out")}, token=TOKEN)
        assert code == 400 and "outside the daemon's allowed roots" in reply["errors"]["data_dir"], reply
        assert not (b / "out").exists()
        wait_until(lambda: get_json(daemon.url + "/api/v1/status")["daemon"]["scans_total"] >= scans + 5, 30,
                   what="scans every 0.2 s, not 60")
        with events.open("a") as fh:
            fh.write(event("done"))
        wait_until(lambda: any(x.get("state") == "done" for x in second.bodies), 30, what="the new webhook")
        assert not first.bodies
    finally:
        first.close()
        second.close()


def test_sighup_reads_a_token_changed_in_place(procs, tmp_path):  # noqa: F811
    """The token file rewritten where it is, then SIGHUP: the old token is refused, the new one
    accepted (before: silently ignored until a restart); a file made readable by others is refused
    and the token in force kept."""
    token = token_file(tmp_path / "token")
    daemon = Daemon(procs, tmp_path, ["--control-token-file", str(token), "--events", str(tmp_path / "e")])
    stop = daemon.url + "/api/v1/jobs/nope/stop"
    assert post_json(stop, {}, token=TOKEN)[0] == 404
    new = "fedcba9876543210-rotated-token"
    token.write_text(new + "\n")
    log = reload(daemon, "control token read again from")
    assert new not in log and TOKEN not in log
    assert post_json(stop, {}, token=TOKEN)[0] == 401 and post_json(stop, {}, token=new)[0] == 404
    token.chmod(0o644)
    reload(daemon, "control token refused")
    assert post_json(stop, {}, token=new)[0] == 404


def make_pair(where: Path, name: str) -> tuple[Path, Path]:
    cert, key = where / f"{name}.pem", where / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    f"/CN={name}", "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True,
                   timeout=60)
    return cert, key


def served_subject(daemon: Daemon) -> str:
    host, port = daemon.url.removeprefix("http://").split(":")
    pem = ssl.get_server_certificate((host, int(port)), timeout=10)
    out = subprocess.run(["openssl", "x509", "-noout", "-subject"], input=pem, capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return out.strip().split("CN", 1)[1].strip(" =")


def test_sighup_reads_a_renewed_certificate_and_keeps_the_old_one_when_the_new_is_bad(procs, tmp_path):  # noqa: F811
    cert, key = make_pair(tmp_path, "first")
    renewed_cert, renewed_key = make_pair(tmp_path, "renewed")
    daemon = Daemon(procs, tmp_path, ["--out", str(tmp_path), "--tls-cert", str(cert), "--tls-key", str(key)])
    assert served_subject(daemon) == "first"
    cert.write_bytes(renewed_cert.read_bytes())  # renewed at the same paths, as certbot does
    key.write_bytes(renewed_key.read_bytes())
    reload(daemon, f"TLS certificate read again from {cert}")
    assert served_subject(daemon) == "renewed"
    cert.write_text("not a certificate\n")
    log = reload(daemon, "TLS refused")
    assert "the old certificate is kept" in log, log
    assert served_subject(daemon) == "renewed"
