"""`keyserver backup` and `keyserver restore` on real parts, on the session's kind of
store: a `keyserver serve` with keys of several versions, data keys and a file a host
encrypted with a key the agent port delivered; a backup taken while it serves (and
while clients generate data keys); more activity afterwards; then the refusals, and a
restore into a fresh data directory (and a fresh PostgreSQL database) under a fresh
server, which decrypts everything made before the backup, knows nothing made after it,
and whose audit chain verifies in full across it."""

from __future__ import annotations

import json
import subprocess
import tarfile
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.cryptfile import StaticKeyring, decrypt_file, encrypt_file
from agents.keyclient.client import ServerClient
from agents.keyclient.identity import HostIdentity
from tests.conftest import own_store
from tests.serve import KEYSERVER, Server, free_port, server_env

pytestmark = [pytest.mark.store, pytest.mark.slow, pytest.mark.timeout(900)]
PASSWORD = f"backup drill passphrase {uuid.uuid4().hex}"


def sign_in(server: Server, password: str | None = None) -> httpx.Client:
    """The administrator's API token client (choosing the password on a first start)."""
    web = server.client()
    if password is None:
        username, first = (server.data / "first-run-admin-password").read_text().split()
        r = web.post("/api/v1/auth/login", json={"username": username, "password": first})
        assert r.status_code == 200, r.text
        web.headers["X-CSRF-Token"] = r.json()["csrf_token"]
        r = web.post("/api/v1/auth/password", json={"current_password": first, "new_password": PASSWORD})
        assert r.status_code == 200, r.text
    else:
        r = web.post("/api/v1/auth/login", json={"username": "admin", "password": password})
        assert r.status_code == 200, r.text
    web.headers["X-CSRF-Token"] = r.json()["csrf_token"]
    r = web.post("/api/v1/tokens", json={"name": f"drill-{uuid.uuid4().hex[:6]}"})
    assert r.status_code == 201, r.text
    return server.client(headers={"Authorization": f"Bearer {r.json()['secret']}"})


def data_key(api: httpx.Client, key: str, context: dict[str, str]) -> dict[str, Any]:
    r = api.post(f"/api/v1/keys/{key}/generate-data-key", json={"context": context})
    assert r.status_code == 200, r.text
    return {"blob": r.json()["ciphertext_blob"], "plaintext": r.json()["plaintext"], "context": context,
            "version": r.json()["key_version"]}


def decrypts(api: httpx.Client, dk: dict[str, Any]) -> bool:
    r = api.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": dk["blob"], "context": dk["context"]})
    assert r.status_code == 200, r.text
    return bool(r.json()["plaintext"] == dk["plaintext"])


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KEYSERVER, *args], env=env, capture_output=True, text=True, timeout=600, check=False)


def said(r: subprocess.CompletedProcess[str]) -> str:
    """The command's output as one line (rich wraps long messages on a narrow pipe)."""
    return " ".join((r.stdout + r.stderr).split())


def agent_url(server: Server) -> str:
    return f"https://127.0.0.1:{server.env['STRONGROOM_AGENT_PORT']}"


def store_env(url: str | None) -> dict[str, str]:
    return {"STRONGROOM_DATABASE_URL": url} if url else {}


def test_backup_while_serving_then_restore_onto_a_fresh_server(tmp_path: Path) -> None:
    with own_store() as url:
        data = tmp_path / "data"
        made: list[dict[str, Any]] = []
        with Server(data, **store_env(url)) as server:
            api = sign_in(server)
            # --- a key with three versions and data keys under each of them.
            assert api.post("/api/v1/keys", json={"name": "ledger"}).status_code == 201
            made.append(data_key(api, "ledger", {"table": "v1"}))
            for n in (2, 3):
                assert api.post("/api/v1/keys/ledger/rotate").json()["current_version"] == n
                made.append(data_key(api, "ledger", {"table": f"v{n}"}))
            assert [dk["version"] for dk in made] == [1, 2, 3]
            # --- a host enrolled at the agent port, and a file it encrypted with the key
            # the agent port delivered to it (the format engine, as kms-agent encrypt does).
            group = f"storage-{uuid.uuid4().hex[:6]}"
            secret = api.post("/api/v1/enrollment-tokens", json={"host_group": group}).json()["secret"]
            state, ca = tmp_path / "host-state", data / "ca.pem"
            with ServerClient(agent_url(server), ca, HostIdentity.load_or_create(state)) as host:
                host.enroll(secret, hostname="db1.example.com", os_name="Linux test")
            assert api.post("/api/v1/keys", json={"name": "files", "tags": {"host-group": group}}).status_code == 201
            with ServerClient.for_host(agent_url(server), HostIdentity.load_or_create(state)) as host:
                delivered = host.fetch("files").key
            plain, sealed = tmp_path / "orders.csv", tmp_path / "orders.csv.enc"
            plain.write_bytes(b"id,amount\n" + b"".join(b"%d,%d\n" % (i, i * 7) for i in range(20000)))
            encrypt_file(plain, sealed, delivered)
            assert b"amount" not in sealed.read_bytes()

            # --- the backup, while clients keep generating data keys.
            stop, during = threading.Event(), []

            def load() -> None:
                with server.client(headers=api.headers) as c:
                    while not stop.is_set():
                        during.append(data_key(c, "ledger", {"during": "backup"}))

            loader = threading.Thread(target=load)
            loader.start()
            try:
                backups = tmp_path / "backups"
                backups.mkdir()
                r = cli(server.env, "backup", "--out", str(backups))
            finally:
                stop.set()
                loader.join()
            assert r.returncode == 0, r.stdout + r.stderr
            assert "backup written" in said(r) and "PINs are not in the archive" in said(r), said(r)
            (archive,) = backups.glob("strongroom-backup-*.tar")
            assert archive.stat().st_mode & 0o077 == 0, "the archive holds the token: owner only"

            # --- after the backup: a rotation, a new key, a data key.
            assert api.post("/api/v1/keys/ledger/rotate").json()["current_version"] == 4
            assert api.post("/api/v1/keys", json={"name": "after-backup"}).status_code == 201
            later = data_key(api, "ledger", {"table": "v4"})
            head_before_stop = api.get("/api/v1/audit/status").json()["head_seq"]
        assert during, "data keys were generated while the backup ran"

        # --- the manifest says what an operator needs.
        with tarfile.open(archive) as tar:
            manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
            names = tar.getnames()
        assert manifest["format_version"] == 1 and manifest["store"]["kind"] == ("postgresql" if url else "sqlite")
        assert manifest["alembic_revision"] and manifest["hsm"]["kind"] == "softhsm2"
        assert manifest["hsm"]["keks"] and manifest["pins_included"] is False
        assert 0 < manifest["audit"]["head_seq"] < head_before_stop
        assert set(manifest["members"]) == set(names) - {"manifest.json"}
        assert not any(n.startswith("pins/") for n in names) and any(n.startswith("token/") for n in names)
        pins = data / "hsm-pins.json"

        # --- refusals say what to do, and write nothing.
        with own_store() as url2:
            fresh = tmp_path / "restored"
            env = server_env(fresh, free_port(), **store_env(url2))
            occupied = tmp_path / "occupied"
            occupied.mkdir()
            (occupied / "something").write_text("x")
            r = cli(server_env(occupied, free_port(), **store_env(url2)), "restore", str(archive), "--pins", str(pins))
            assert r.returncode == 1 and "is not empty" in said(r), said(r)
            assert sorted(p.name for p in occupied.iterdir()) == ["something"]
            if url is not None:
                r = cli(server_env(tmp_path / "x", free_port(), STRONGROOM_DATABASE_URL=url), "restore", str(archive),
                        "--pins", str(pins))
                assert r.returncode == 1 and "is not empty" in said(r) and "createdb" in said(r), said(r)
            damaged = tmp_path / "damaged.tar"
            raw = bytearray(archive.read_bytes())
            with tarfile.open(archive) as tar:
                member = tar.getmember(manifest["store"]["member"])
                raw[member.offset_data + member.size // 2] ^= 0x01
            damaged.write_bytes(bytes(raw))
            r = cli(env, "restore", str(damaged), "--pins", str(pins))
            assert r.returncode == 1 and f"checksum mismatch in {manifest['store']['member']}" in said(r), said(r)
            r = cli(env, "restore", str(archive))
            assert r.returncode == 1 and "no HSM PINs" in said(r) and "--pins" in said(r), said(r)
            assert not fresh.exists() or not any(fresh.iterdir())
            r = cli(env, "restore", "--check", str(archive))
            assert r.returncode == 0 and "archive intact" in said(r), said(r)

            # --- the restore, into a fresh data directory and database.
            r = cli(env, "restore", str(archive), "--pins", str(pins))
            assert r.returncode == 0, said(r)
            assert "restored" in said(r) and "verified (full)" in said(r), said(r)

            with Server(fresh, **store_env(url2)) as restored:
                assert (fresh / "ca.pem").read_bytes() == ca.read_bytes(), "the same internal CA"
                api = sign_in(restored, PASSWORD)  # the users came back with the data
                for dk in made:
                    assert decrypts(api, dk), dk["context"]
                assert api.get("/api/v1/keys/ledger").json()["current_version"] == 3
                assert api.get("/api/v1/keys/after-backup").status_code == 404
                r2 = api.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": later["blob"],
                                                               "context": later["context"]})
                assert r2.status_code != 200, "a data key made after the backup under version 4 is unknown"
                # The host still gets its key (same CA, same host record) and reads its file.
                with ServerClient.for_host(agent_url(restored), HostIdentity.load_or_create(state)) as host:
                    again = host.fetch("files").key
                assert again == delivered
                out = tmp_path / "orders.out"
                decrypt_file(sealed, out, StaticKeyring([again]))
                assert out.read_bytes() == plain.read_bytes()
                # The chain holds the backup's record and the restore's, and verifies in full.
                events = api.get("/api/v1/audit/events", params={"limit": 1000}).json()["items"]
                actions = [e["action"] for e in events]
                assert "system.backup" in actions and "system.restore" in actions
                backup_record = next(e for e in events if e["action"] == "system.backup")
                assert backup_record["object_id"] == manifest["backup_id"]
                assert backup_record["seq"] <= manifest["audit"]["head_seq"]
                verified = api.post("/api/v1/audit/verify", json={"full": True})
                assert verified.status_code == 200 and verified.json()["ok"], verified.text
                r = cli(restored.env, "verify-audit", "--full")
                assert r.returncode == 0 and "intact" in said(r), said(r)


def test_restore_of_a_chain_that_does_not_verify_exits_3(tmp_path: Path) -> None:
    """A backup whose audit chain was tampered with before it was taken restores, but the
    restore says the chain is broken, names the record and exits 3."""
    with own_store() as url:
        data = tmp_path / "data"
        with Server(data, **store_env(url)) as server:
            api = sign_in(server)
            assert api.post("/api/v1/keys", json={"name": "k"}).status_code == 201
        # Alter one chained record in the stopped server's store, as an intruder would.
        _tamper(url, data)
        out = tmp_path / "b.tar"
        r = cli(server.env, "backup", "--out", str(out), "--include-pins")
        assert r.returncode == 0 and "holds the token AND its PINs" in said(r), said(r)
        with own_store() as url2:
            r = cli(server_env(tmp_path / "fresh", free_port(), **store_env(url2)), "restore", str(out))
            assert r.returncode == 3 and "audit chain BROKEN at record 2" in said(r), said(r)


def _tamper(url: str | None, data: Path) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url or f"sqlite:///{data / 'strongroom.db'}")
    with engine.begin() as conn:
        conn.execute(text("UPDATE audit_events SET actor = 'intruder' WHERE seq = 2"))
    engine.dispose()


def test_pg_tools_match_the_server() -> None:
    """The pg_dump chosen for a server is that major version's or a newer one."""
    from keyserver.ops import OpsError
    from keyserver.ops.archive import pg_tool

    tool = pg_tool("pg_dump", 15)
    assert int(tool.parts[-3]) >= 15
    with pytest.raises(OpsError, match="postgresql-client-99"):
        pg_tool("pg_dump", 99)
