"""`keyserver kmip-client …` and `keyserver serve` with its in-process KMIP listener,
as a user runs them: separate processes, embedded SQLite + SoftHSM2 data directory."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
from kmip.core import enums

from tests.kmip.conftest import ClientFiles, make_client
from tests.serve import eventually

KEYSERVER = str(Path(sys.executable).with_name("keyserver"))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_cli_issues_and_serve_listens(tmp_path: Path) -> None:
    kmip_port, http_port = _port(), _port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STRONGROOM_", "SOFTHSM2_CONF"))}
    env.update(STRONGROOM_DATA_DIR=str(tmp_path / "data"), STRONGROOM_PORT=str(http_port),
               STRONGROOM_KMIP_PORT=str(kmip_port), STRONGROOM_LOG_LEVEL="WARNING")
    # kmip-client refuses a data directory that holds no key server (it never makes one):
    # a user's first step is init (or serve).
    r = subprocess.run([KEYSERVER, "init"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "client"
    r = subprocess.run([KEYSERVER, "kmip-client", "create", "cli.example.com", "--role", "key-officer",
                        "--out", str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (out / "key.pem").stat().st_mode & 0o777 == 0o600
    listed = subprocess.run([KEYSERVER, "kmip-client", "list"], env=env, capture_output=True, text=True, timeout=60)
    assert "cli.example.com" in listed.stdout and "active" in listed.stdout
    client_id = listed.stdout.split()[0]

    proc = subprocess.Popen([KEYSERVER, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:  # both doors open: KMIP, and HTTPS (whose start installs the SIGTERM handler)
            try:
                socket.create_connection(("127.0.0.1", kmip_port), timeout=1).close()
                trust = ssl.create_default_context(cafile=str(tmp_path / "data" / "ca.pem"))
                if httpx.get(f"https://127.0.0.1:{http_port}/healthz", timeout=2, verify=trust).status_code == 200:
                    break
            except (OSError, httpx.TransportError):
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        files = ClientFiles("cli.example.com", client_id, out / "cert.pem", out / "key.pem", out / "ca.pem")
        with make_client(files, kmip_port) as client:
            uid = client.create(enums.CryptographicAlgorithm.AES, 128, name="from-cli-client")
            client.activate(uid)
            assert len(client.get(uid).value) == 16
        r = subprocess.run([KEYSERVER, "kmip-client", "revoke", client_id], env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        def refused() -> bool:
            # The server hears the CLI's revocation through the store's change counter
            # (polled a few times a second): refused within that, not at once.
            with make_client(files, kmip_port) as client:
                try:
                    client.locate()
                    return False
                except Exception as exc:  # PyKMIP surfaces the refusal or the closed connection
                    assert "PERMISSION_DENIED" in str(exc) or isinstance(exc, OSError | EOFError), exc
                    return True

        eventually(refused, "the revoked client to be refused", seconds=10)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(40)
    # uvicorn re-raises SIGTERM after its graceful shutdown: killed-by-SIGTERM is a clean exit here.
    assert proc.returncode in (0, -signal.SIGTERM)
