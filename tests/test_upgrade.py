"""Upgrade from the previous release (issue 16), on the session's kind of store: the
release's own code (`git archive` of its tag, run from that tree) initialises a data
directory and a database at its Alembic head and is used as a user would use it — keys
with several versions, data keys under each, a revoked key, an API token, a KMIP client
that registers secret data and creates a key. Then this tree's `keyserver serve` starts on
the same data directory and database: it migrates the schema on start and must read
everything back — the same sign-in, the same token, every data key, the KMIP objects
through the same client certificate — verify the whole audit chain across the upgrade,
and re-wrap every old row in a KEK rotation."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import tarfile
import uuid
from io import BytesIO
from pathlib import Path
from typing import Any

import httpx
import pytest
from kmip.core import enums
from kmip.pie import objects

from tests.conftest import own_store
from tests.kmip.conftest import ClientFiles, make_client
from tests.serve import KEYSERVER, Server, eventually, free_port

pytestmark = [pytest.mark.store, pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[1]
# The previous release: its tag, and the commit the tag names (the tag is not in every
# clone, the commit is in every full one). Its Alembic head is 0007.
RELEASE, RELEASE_COMMIT, RELEASE_HEAD = "v0.1.0", "5e987870a1cbaf7ec8f75fed8fa43c58bb0f32ef", "0007"
PASSWORD = f"upgrade drill passphrase {uuid.uuid4().hex[:8]}"


def release_tree(dest: Path) -> Path:
    """The release's Python packages, as the release shipped them."""
    if subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=REPO, capture_output=True,
                      text=True).stdout.strip() == "true":
        pytest.skip("a shallow clone holds no earlier release to upgrade from (clone with history)")
    archive = subprocess.run(["git", "archive", RELEASE_COMMIT, "keyserver", "hsm", "migrations", "agents"],
                             cwd=REPO, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    head = sorted(p.name for p in (dest / "migrations" / "versions").glob("0*.py"))[-1]
    assert head.startswith(RELEASE_HEAD), f"{RELEASE}'s Alembic head is {head}"
    return dest


class ReleaseServer(Server):
    """`keyserver serve` of the release: its tree first on the path (cwd and PYTHONPATH
    win over this checkout's editable install), plain HTTP as that release served."""

    plain_http = True
    ready_path = "/healthz"

    def __init__(self, tree: Path, data: Path, env: dict[str, str]) -> None:
        self.command = (sys.executable, "-c", "from keyserver.cli import app; app()", "serve")
        self.cwd = tree
        super().__init__(data, **env, PYTHONPATH=str(tree))


def first_password(server: Server) -> str:
    found = re.search(r"password:\s+(\S+)", server.output)
    assert found, f"the release printed no first-run password:\n{server.output}"
    return found.group(1)


def data_key(api: httpx.Client, key: str, context: dict[str, str]) -> dict[str, Any]:
    r = api.post(f"/api/v1/keys/{key}/generate-data-key", json={"context": context})
    assert r.status_code == 200, r.text
    body = r.json()
    return {"blob": body["ciphertext_blob"], "plaintext": body["plaintext"], "context": context,
            "version": body["key_version"]}


def mixed_window(old: Server, api: httpx.Client, secret: str, made: list[dict[str, Any]]) -> None:
    """A replica of the release that was serving before this one migrated the schema
    (a release refuses to start on a newer revision, so the window is the replicas not
    yet restarted): data keys made by either decrypt on the other, and a rotation on the
    old one is seen by the new one."""
    old_api = httpx.Client(base_url=old.url, timeout=30, headers={"Authorization": f"Bearer {secret}"})
    from_old, from_new = data_key(old_api, "ledger", {"by": "0.1.0"}), data_key(api, "ledger", {"by": "new"})
    for client, dk in ((api, from_old), (old_api, from_new)):
        r = client.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": dk["blob"], "context": dk["context"]})
        assert r.status_code == 200 and r.json()["plaintext"] == dk["plaintext"], r.text
    r = old_api.post("/api/v1/keys/ledger/rotate")
    assert r.status_code == 200, f"the release cannot rotate on the migrated schema: {r.text}"
    assert api.get("/api/v1/keys/ledger").json()["current_version"] == r.json()["current_version"] == 5
    made += [from_old, from_new]


def test_data_made_by_the_previous_release_reads_back_after_the_upgrade(tmp_path: Path) -> None:
    tree = release_tree(tmp_path / "release")
    data, kmip_port = tmp_path / "data", free_port()
    straggler: Server | None = None
    with own_store() as url, contextlib.ExitStack() as cleanup:
        cleanup.callback(lambda: straggler.stop() if straggler is not None else None)
        env = {"STRONGROOM_KMIP_PORT": str(kmip_port), **({"STRONGROOM_DATABASE_URL": url} if url else {})}

        # --- the previous release: first start, the administrator's password chosen, a token.
        old = ReleaseServer(tree, data, env)
        try:
            eventually(old.ready, "the release's key server to be ready", seconds=90)
            web = httpx.Client(base_url=old.url, timeout=30)
            first = first_password(old)
            r = web.post("/api/v1/auth/login", json={"username": "admin", "password": first})
            assert r.status_code == 200, r.text
            web.headers["X-CSRF-Token"] = r.json()["csrf_token"]
            r = web.post("/api/v1/auth/password", json={"current_password": first, "new_password": PASSWORD})
            assert r.status_code == 204, r.text
            r = web.post("/api/v1/tokens", json={"name": "upgrade"})
            assert r.status_code == 201, r.text
            secret = r.json()["secret"]
            api = httpx.Client(base_url=old.url, timeout=30, headers={"Authorization": f"Bearer {secret}"})

            # Keys: three versions with a data key under each, and a revoked key.
            assert api.post("/api/v1/keys", json={"name": "ledger", "tags": {"team": "payments"}}).status_code == 201
            made = [data_key(api, "ledger", {"table": "v1"})]
            for n in (2, 3):
                assert api.post("/api/v1/keys/ledger/rotate").json()["current_version"] == n
                made.append(data_key(api, "ledger", {"table": f"v{n}"}))
            assert api.post("/api/v1/keys", json={"name": "old-backups"}).status_code == 201
            made.append(data_key(api, "old-backups", {}))
            r = api.post("/api/v1/keys/old-backups/revoke", json={"reason": "superseded"})
            assert r.status_code == 200, r.text
            revoked_state = r.json()["state"]

            # KMIP: a client certificate from the release's internal CA; a secret (sealed
            # under its own DEK, wrapped by the KEK) and a key created over KMIP.
            r = api.post("/api/v1/kmip/clients", json={"name": "backup.example.com", "role": "key-officer"})
            assert r.status_code == 201, r.text
            issued = r.json()
            files = ClientFiles("backup.example.com", issued["client"]["id"], tmp_path / "cert.pem",
                                tmp_path / "key.pem", tmp_path / "ca.pem")
            files.cert.write_text(issued["certificate_pem"])
            files.key.write_text(issued["private_key_pem"])
            files.ca.write_text(issued["ca_certificate_pem"])
            secret_bytes = uuid.uuid4().bytes * 2
            with make_client(files, kmip_port) as kmip:
                secret_uid = kmip.register(objects.SecretData(secret_bytes, enums.SecretDataType.PASSWORD))
                kmip.activate(secret_uid)
                key_uid = kmip.create(enums.CryptographicAlgorithm.AES, 256, name="archive-key")
                kmip.activate(key_uid)
                kmip_key = kmip.get(key_uid).value
            r = api.get("/api/v1/audit/events")
            assert r.status_code == 200, r.text
            records_before = r.json()["total"]
            # On PostgreSQL, a second replica of the release, left serving through the upgrade.
            if url is not None:
                straggler = ReleaseServer(tree, data, {**env, "STRONGROOM_KMIP_ENABLED": "false"})
                eventually(straggler.ready, "the release's second replica to be ready", seconds=90)
        finally:
            old.stop()

        # --- this tree, on the same data directory and database: it migrates on start.
        with Server(data, **env) as server:
            web = server.client()
            r = web.post("/api/v1/auth/login", json={"username": "admin", "password": PASSWORD})
            assert r.status_code == 200, f"the administrator's password does not survive the upgrade: {r.text}"
            api = server.client(headers={"Authorization": f"Bearer {secret}"})
            ledger = api.get("/api/v1/keys/ledger")
            assert ledger.status_code == 200, f"the release's API token does not survive the upgrade: {ledger.text}"
            assert ledger.json()["current_version"] == 3 and ledger.json()["tags"] == {"team": "payments"}
            assert api.get("/api/v1/keys/old-backups").json()["state"] == revoked_state

            def all_decrypt() -> None:
                for dk in made:
                    r = api.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": dk["blob"],
                                                                  "context": dk["context"]})
                    assert r.status_code == 200, f"a data key of version {dk['version']} is lost: {r.text}"
                    assert r.json()["plaintext"] == dk["plaintext"]

            all_decrypt()
            assert data_key(api, "ledger", {"table": "v3-after"})["version"] == 3
            assert api.post("/api/v1/keys/ledger/rotate").json()["current_version"] == 4

            with make_client(files, kmip_port) as kmip:
                assert kmip.get(secret_uid).value == secret_bytes
                assert kmip.get(key_uid).value == kmip_key

            if url is not None:
                # A rolling upgrade's window (docs/operations.md "Upgrades"): a replica of
                # the release still serving on the migrated PostgreSQL schema beside this one.
                assert straggler is not None
                mixed_window(straggler, api, secret, made)
                straggler.stop()
                all_decrypt()

            # Every row the release wrapped is re-wrapped by a KEK rotation of this tree.
            r = api.post("/api/v1/system/kek/rotate")
            assert r.status_code == 202, r.text
            rotation = r.json()["id"]

            def rotated() -> bool:
                body = api.get(f"/api/v1/system/kek/rotations/{rotation}").json()
                assert body["state"] in ("running", "completed"), body
                return bool(body["state"] == "completed")

            eventually(rotated, "the KEK rotation over the release's rows to complete", seconds=120)
            status = api.get("/api/v1/system/kek").json()
            old_kek = next(k for k in status["keks"] if k["state"] == "superseded")
            assert sum(old_kek["wrapped"].values()) == 0, old_kek
            # ... so the release's KEK can leave the token, and everything still reads.
            r = api.post(f"/api/v1/system/keks/{old_kek['kek_id']}/retire")
            assert r.status_code == 200 and r.json()["state"] == "retired", r.text
            all_decrypt()
            with make_client(files, kmip_port) as kmip:
                assert kmip.get(secret_uid).value == secret_bytes
                assert kmip.get(key_uid).value == kmip_key

        # The chain verifies in full across both releases' records.
        r = subprocess.run([KEYSERVER, "verify-audit", "--full"], env=server.env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        found = re.search(r"(\d+)\s+records\s+verified", (r.stdout + r.stderr).replace(",", ""))
        assert found and int(found.group(1)) > records_before, r.stdout + r.stderr
