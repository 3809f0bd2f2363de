"""The control API exposed beyond loopback, attacked as an outsider would: a real daemon, real
HTTP(S) clients, a self-signed certificate made with openssl."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import subprocess
import sys

import pytest
from daemon_helpers import Daemon, child_env, free_port, post_json, procs  # noqa: F401 (fixture)

from hsmon.daemon import security
from hsmon.status.client import StatusClient
from hsmon.status_doc import decode

TOKEN = "0123456789abcdef-test-token"


def lan_address() -> str:
    """This machine's address on its first non-loopback interface (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))
        address = s.getsockname()[0]
    assert not address.startswith("127."), "this test needs an interface besides loopback"
    return address


def token_file(tmp_path, mode: int = 0o600):
    path = tmp_path / f"token-{mode:o}"
    path.write_text(TOKEN + "\n")
    path.chmod(mode)
    return path


def daemon_refusal(*argv: str) -> str:
    res = subprocess.run([sys.executable, "-m", "hsmon", "daemon", *argv], env=child_env(),
                         capture_output=True, text=True, timeout=60)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


def test_unsafe_settings_are_refused_in_one_line(tmp_path):
    loose = token_file(tmp_path, 0o644)
    assert "lets group or others read the token; run chmod 600" in daemon_refusal(
        "--out", str(tmp_path), "--control-token-file", str(loose))
    line = daemon_refusal("--out", str(tmp_path), "--control-token-file", str(token_file(tmp_path)),
                          "--host", "0.0.0.0", "--port", "0")
    assert "--host 0.0.0.0" in line and "--allow-root DIR" in line
    assert "--tls-key" in daemon_refusal("--out", str(tmp_path), "--tls-cert", str(tmp_path / "c.pem"))


def test_the_tui_never_sends_the_token_in_clear_text_to_another_machine(tmp_path):
    """`hsmon tui --url http://OTHER --token-file F` is refused in one line before any connection (the
    token would cross the network in clear text); https://, loopback, or --insecure-plain-http pass
    that check (before: the TUI sent the bearer token to any http:// address)."""
    import argparse

    from hsmon.tui.cli import add_arguments, build_sources

    argv = ["tui", "--url", "http://192.0.2.7:9108", "--token-file", str(token_file(tmp_path))]
    res = subprocess.run([sys.executable, "-m", "hsmon", *argv], env=child_env(), capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "clear text over http://" in res.stderr and "--insecure-plain-http" in res.stderr, res.stderr

    for url, extra in (("https://192.0.2.7:9108", []), ("http://127.0.0.1:9108", []),
                       ("http://192.0.2.7:9108", ["--insecure-plain-http"])):
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        args = parser.parse_args(["--url", url, "--token-file", str(token_file(tmp_path)), *extra])
        assert len(build_sources(args)) == 1  # made, not connected


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return cert, key


def test_tls_serves_https_to_a_client_that_checks_the_certificate(procs, tmp_path, certificate):  # noqa: F811
    cert, key = certificate
    daemon = Daemon(procs, tmp_path, ["--out", str(tmp_path), "--tls-cert", str(cert), "--tls-key", str(key)])
    https = daemon.url.replace("http://", "https://")
    document = decode(StatusClient(https, timeout=10, ca=str(cert)).get())  # verified against the cert
    assert document.jobs and document.jobs[0].output is not None
    with pytest.raises(ssl.SSLCertVerificationError):  # a client that trusts only the system CAs
        StatusClient(https, timeout=10).get()
    res = subprocess.run([sys.executable, "-m", "hsmon", "status", "--url", https, "--ca", str(cert),
                          "--json"], env=child_env(), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and json.loads(res.stdout)["jobs"], res.stderr
    host, port = daemon.url.removeprefix("http://").split(":")
    plain = http.client.HTTPConnection(host, int(port), timeout=10)  # plain HTTP to the TLS port
    with pytest.raises((http.client.HTTPException, OSError)):
        plain.request("GET", "/api/v1/status")
        plain.getresponse().read()
    assert "TLS handshake failed" in daemon.stderr_path.read_text()


def test_the_control_api_refuses_the_attacks_and_logs_them(procs, tmp_path):  # noqa: F811
    root = tmp_path / "allowed"
    (root / "data").mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (root / "link").symlink_to(outside)
    daemon = Daemon(procs, tmp_path, ["--out", str(root / "data"), "--control-token-file",
                                      str(token_file(tmp_path)), "--allow-root", str(root)], host="0.0.0.0")
    train = daemon.url + "/api/v1/train"
    body = {"data_dir": str(root / "data"), "out_dir": str(root / "out")}
    assert post_json(train, body)[0] == 401  # no token
    assert post_json(train, body, token="wrong-token-wrong-token")[0] == 401
    for field, path in (("data_dir", str(outside)), ("out_dir", f"{root}/../elsewhere/out"),
                        ("out_dir", str(root / "link" / "out")), ("target_model", str(outside / "model"))):
        code, reply = post_json(train, {**body, field: path}, token=TOKEN)
        assert code == 400 and "outside the daemon's allowed roots" in reply["errors"][field], (field, reply)
    assert not (outside / "out").exists()
    host, port = daemon.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.putrequest("POST", "/api/v1/train")
    conn.putheader("Authorization", f"Bearer {TOKEN}")
    conn.putheader("Content-Length", str(50 * 1024 * 1024))  # the body is never sent nor read
    conn.endheaders()
    assert conn.getresponse().status == 413
    log = daemon.stderr_path.read_text()
    assert log.count("refused POST /api/v1/train") >= 7, log


def test_command_lines_only_for_this_machine_or_the_token(procs, tmp_path):  # noqa: F811
    """The daemon watches a process with a known command line: a caller from another address
    sees it only with the token."""
    address = lan_address()
    watched = procs.start([sys.executable, "-c", "import time; time.sleep(120)", "secret-marker"])
    daemon = Daemon(procs, tmp_path, ["--pid", str(watched.pid), "--control-token-file",
                                      str(token_file(tmp_path)), "--allow-root", str(tmp_path)],
                    host="0.0.0.0")
    port = daemon.url.rsplit(":", 1)[1]

    def cmdline(url: str, token: str | None = None) -> str:
        doc = decode(StatusClient(url, timeout=10, token=token).get())
        return doc.jobs[0].processes[0].cmdline

    assert "secret-marker" in cmdline(daemon.url)  # loopback: anyone here can run ps
    assert cmdline(f"http://{address}:{port}") == security.REDACTED
    assert "secret-marker" in cmdline(f"http://{address}:{port}", token=TOKEN)
