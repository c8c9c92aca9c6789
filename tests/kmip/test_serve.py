"""`keyserver kmip-client …` and `keyserver serve` with its in-process KMIP listener,
as a user runs them: separate processes, embedded SQLite + SoftHSM2 data directory."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

from kmip.core import enums

from tests.kmip.conftest import ClientFiles, make_client
from tests.serve import KEYSERVER, Server, eventually, free_port, server_env


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_cli_issues_and_serve_listens(tmp_path: Path) -> None:
    kmip_port = free_port()
    env = server_env(tmp_path / "data", free_port(), STRONGROOM_KMIP_PORT=str(kmip_port))
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

    with Server(tmp_path / "data", STRONGROOM_KMIP_PORT=str(kmip_port)) as server:
        # HTTPS answers (its start installs the SIGTERM handler); the KMIP door opens too.
        eventually(lambda: _listening(kmip_port), "the KMIP listener")
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
        # uvicorn re-raises SIGTERM after its graceful shutdown: killed-by-SIGTERM is a clean exit here.
        assert server.stop() in (0, -signal.SIGTERM)
