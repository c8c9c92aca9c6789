"""A rotation and a revocation done by a person in the web console, observed by every
kind of consumer of the key at once: MariaDB (its hashicorp_key_management plugin on the
KV-v2 front), a MongoDB client (libmongocrypt, delegated mode, over KMIP) and a PKCS#11
consumer (python-pkcs11 on libstrongroom-pkcs11.so, over KMIP).

One managed AES key. The console is the session's HTTPS server (it serves webui/dist),
the KMIP listener runs on the same services, so all of them share one store: the test
runs on PostgreSQL and on the embedded store. Chromium clicks Rotate on the key's page,
and each consumer uses version 2 for new work while what version 1 protected still
reads; then MariaDB is shut down cleanly, Chromium revokes the key (its dialog names the
database that reads it), and each consumer is refused new work, each refusal audited.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from keyserver.core.principal import system_context
from keyserver.kmip.server import build_listener
from keyserver.services import Services
from tests.conftest import REPO
from tests.https import server_spki_pin
from tests.integrations import test_mariadb
from tests.integrations.test_mariadb import MariaDB, SqlError, mariadb, reads_since, wait_for  # noqa: F401
from tests.integrations.test_mongocrypt import (
    DOCUMENTS,
    Mongo,
    audit_since,
    decrypt_documents,
    encrypt_documents,
    failure,
    last_seq,
    rewrap,
)
from tests.kmip.conftest import issue_client
from tests.pkcs11.conftest import BUILD, CONF_ENV, Token, make, write_conf
from tests.pkcs11.sequence import CKR_KEY_FUNCTION_NOT_PERMITTED
from tests.webui.test_e2e import CHROMIUM, WEBUI, _require_prerequisites

pytestmark = test_mariadb.pytestmark
HERE = Path(__file__).resolve().parent
ROWS = 100

# A PKCS#11 consumer in a process of its own (python-pkcs11 initialises a module once per
# process, with the configuration it finds then): one JSON command a line on stdin, one
# JSON answer a line on stdout. "hold" keeps a session open with the key a label finds.
CONSUMER = r"""
import json, os, sys
import pkcs11
from pkcs11 import Mechanism
from tests.pkcs11.sequence import by_id, object_id, secret_key

token = pkcs11.lib(sys.argv[1]).get_token(token_label=sys.argv[2])
held = held_key = None
for line in sys.stdin:
    cmd = json.loads(line)
    try:
        if cmd["op"] == "seal":
            with token.open() as s:
                key = secret_key(s, cmd["label"])
                nonce = os.urandom(12)
                ct = key.encrypt(cmd["data"].encode(), mechanism=Mechanism.AES_GCM,
                                 mechanism_param=pkcs11.GCMParams(nonce))
                out = {"id": object_id(key), "nonce": nonce.hex(), "ct": bytes(ct).hex()}
        elif cmd["op"] == "open":
            with token.open() as s:
                key = by_id(s, cmd["id"])
                plain = key.decrypt(bytes.fromhex(cmd["ct"]), mechanism=Mechanism.AES_GCM,
                                    mechanism_param=pkcs11.GCMParams(bytes.fromhex(cmd["nonce"])))
                out = {"plain": bytes(plain).decode()}
        elif cmd["op"] == "hold":
            held = token.open()
            held_key = secret_key(held, cmd["label"])
            out = {"id": object_id(held_key)}
        elif cmd["op"] == "seal_held":
            held_key.encrypt(b"after the revocation", mechanism=Mechanism.AES_GCM,
                        mechanism_param=pkcs11.GCMParams(os.urandom(12)))
            out = {"sealed": True}
    except pkcs11.PKCS11Error as e:
        out = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(out), flush=True)
"""


class Pkcs11Consumer:
    def __init__(self, module: Path, conf: Path, token_label: str, actor: str) -> None:
        self.actor = actor  # as the audit log names it
        self.proc = subprocess.Popen(
            [str(REPO / ".venv" / "bin" / "python"), "-c", CONSUMER, str(module), token_label], cwd=REPO,
            env={**os.environ, CONF_ENV: str(conf)}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)

    def __call__(self, op: str, **args: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the PKCS#11 consumer exited: {self.proc.stderr.read() if self.proc.stderr else ''}"
        return dict(json.loads(line))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


# The KMIP tenancy group of the application's PKCS#11 and MongoDB identities, which the key is made for.
APP_GROUP = "console-observed"


@pytest.fixture
def pkcs11_consumer(services: Services, tmp_path: Path) -> Iterator[Pkcs11Consumer]:
    make()
    listener = build_listener(services, port=0)
    listener.start()
    token = Token("strongroom console-observed", issue_client(services, tmp_path, "kmip-client", APP_GROUP), None)
    conf = write_conf(tmp_path / "strongroom-pkcs11.conf", [(token, listener.port)])
    consumer = Pkcs11Consumer(BUILD / "libstrongroom-pkcs11.so", conf, token.label, f"kmip:{token.files.name}")
    try:
        yield consumer
    finally:
        consumer.close()
        listener.stop()


@pytest.fixture
def mongo_app(services: Services, tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    """An application's identity and a KMIP listener, for MongoDB clients made on demand."""
    listener = build_listener(services, port=0)
    listener.start()
    files = issue_client(services, tmp_path, "kmip-client", APP_GROUP)
    made: list[Mongo] = []

    def client(keys: list[dict[str, Any]]) -> Mongo:
        made.append(Mongo(files, listener.port, keys))
        return made[-1]

    try:
        yield client, files
    finally:
        for m in made:
            m.close()
        listener.stop()


def in_console(action: str, *, base_url: str, ca_file: Path, username: str, password: str, key: str,
               database: str = "") -> dict[str, Any]:
    """`action` done in Chromium on the key's page (console_actions.mjs); what it showed."""
    node = _require_prerequisites(base_url, ca_file)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), "BASE_URL": base_url,
           "TRUST_SPKI": server_spki_pin(base_url), "WEBUI": str(WEBUI), "CHROMIUM": CHROMIUM,
           "USERNAME": username, "PASSWORD": password, "KEY": key, "ACTION": action, "DATABASE": database}
    done = subprocess.run([node, str(HERE / "console_actions.mjs")], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"the console {action} failed:\n{done.stdout}\n{done.stderr[-6000:]}"
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def key_uses(services: Services, since: int, actor: str, key_id: str) -> list[tuple[str, str, int | None]]:
    """(action, outcome, version) of `actor`'s uses of the managed key, in chain order."""
    return [(e.action, e.outcome, (e.details or {}).get("version")) for e in audit_since(services, since, actor)
            if e.object_id == key_id and e.action in ("key.encrypt", "key.decrypt")]


def test_a_rotation_and_a_revocation_in_the_console_are_observed_by_every_consumer(
        services: Services, admin: httpx.Client, base_url: str, ca_file: Path, mariadb: MariaDB,  # noqa: F811
        pkcs11_consumer: Pkcs11Consumer, mongo_app: tuple[Any, Any]) -> None:
    _require_prerequisites(base_url, ca_file)
    ctx = system_context("tests")
    tag = uuid.uuid4().hex[:8]
    name = f"console-observed-{tag}"
    created = admin.post("/api/v1/keys", json={"name": name, "description": "issue 27: seen by every consumer",
                                               "kmip_group": APP_GROUP})
    assert created.status_code == 201, created.text
    key_id = created.json()["id"]
    username, password = f"console-{tag}", f"console-observed-{uuid.uuid4().hex}"
    services.identity.create_user(ctx, username=username, role="admin", password=password)
    console = {"base_url": base_url, "ca_file": ca_file, "username": username, "password": password, "key": name}

    def versions() -> dict[int, str]:
        """The key's versions: number → KMIP Unique Identifier."""
        return {v.version: str(v.id) for v in services.keys.get(ctx, name).versions}

    # --- MariaDB: the key under MariaDB's key ids 1 and 2, a table encrypted with it ----
    db = admin.post("/api/v1/databases", json={"name": f"shop-{tag}", "description": "console-observed test"})
    assert db.status_code == 201, db.text
    database, db_token = db.json()["database"]["name"], db.json()["token"]
    for kv_id in (1, 2):
        r = admin.post(f"/api/v1/databases/{database}/grants", json={"key": name, "key_id": kv_id})
        assert r.status_code == 201, r.text
    db_actor = f"database:{database}"
    options = ["--plugin-load-add=hashicorp_key_management",
               f"--hashicorp-key-management-vault-url={base_url}/v1/strongroom",
               f"--hashicorp-key-management-token={db_token}",
               f"--hashicorp-key-management-vault-ca={ca_file}",
               "--hashicorp-key-management-cache-version-timeout=500",  # a rotation seen within a second
               "--innodb-encryption-threads=2", "--innodb-encryption-rotate-key-age=1"]
    seq = last_seq(services)
    mariadb.start(options)
    mariadb.sql("CREATE DATABASE shop; CREATE TABLE shop.orders (id INT PRIMARY KEY, note VARCHAR(200)) "
                "ENGINE=InnoDB ENCRYPTED=YES ENCRYPTION_KEY_ID=1")
    rows = ",".join(f"({i}, 'console-observed-{i:04d}')" for i in range(ROWS))
    mariadb.sql(f"INSERT INTO shop.orders VALUES {rows}")  # noqa: S608 - the test's own constants

    def table_key() -> tuple[int, int]:
        """(key version for new writes, oldest page's version); (0, 0) while re-encrypting."""
        out = mariadb.sql("SELECT CURRENT_KEY_ID, CURRENT_KEY_VERSION, MIN_KEY_VERSION, ROTATING_OR_FLUSHING FROM "
                          "information_schema.INNODB_TABLESPACES_ENCRYPTION WHERE NAME='shop/orders'")
        kv_id, current, oldest, busy = (int(x) for x in out.split("\t"))
        assert kv_id == 1
        return (0, 0) if busy else (current, oldest)

    assert wait_for("the table encrypted under version 1", lambda: table_key() == (1, 1))
    reads = reads_since(services, admin, seq, db_actor)
    assert reads and {(e["object_id"], e["outcome"], e["details"]["version"]) for e in reads} == {
        (key_id, "allowed", 1)}

    # --- MongoDB: a data key under version 1 (delegated: the master key stays in the HSM) -
    mongo, app_files = mongo_app
    mongo_actor = f"kmip:{app_files.name}"
    v1_uid = versions()[1]
    vault: list[dict[str, Any]] = []
    first = mongo(vault)
    dk1 = first.encrypter.create_data_key("kmip", master_key={"keyId": v1_uid, "delegated": True})
    stored1 = encrypt_documents(first, dk1)

    # --- PKCS#11: AES-GCM under the key its label finds -------------------------------
    p11_actor = pkcs11_consumer.actor
    sealed1 = pkcs11_consumer("seal", label=name, data="sealed under version 1")
    assert sealed1["id"] == v1_uid, sealed1
    assert key_uses(services, seq, p11_actor, key_id) == [("key.encrypt", "allowed", 1)]
    mongo_uses = key_uses(services, seq, mongo_actor, key_id)
    assert mongo_uses[0] == ("key.encrypt", "allowed", 1) and set(mongo_uses) <= {
        ("key.encrypt", "allowed", 1), ("key.decrypt", "allowed", 1)}, mongo_uses  # the data key used

    # === Rotate, in the console ===========================================================
    shown = in_console("rotate", **console)
    assert shown["versions"].count("active") == 1 and "deactivated" in shown["versions"], shown
    v2_uid = versions()[2]
    assert v2_uid != v1_uid
    seq = last_seq(services)

    # MariaDB, in its own view: new writes under version 2, while the pages written under
    # version 1 stay so (one version behind is within innodb_encryption_rotate_key_age) and read.
    mariadb.sql("INSERT INTO shop.orders VALUES (1000, 'console-observed-after-rotation')")
    wait_for("MariaDB writing under key version 2", lambda: table_key()[0] == 2)
    assert wait_for("new writes under version 2, old pages under 1", lambda: table_key() == (2, 1))
    assert mariadb.sql("SELECT COUNT(*) FROM shop.orders WHERE note LIKE 'console-observed-%'") == str(ROWS + 1)
    assert (key_id, "allowed", 2) in {(e["object_id"], e["outcome"], e["details"]["version"])
                                      for e in reads_since(services, admin, seq, db_actor)}

    # MongoDB: a new data key lands on version 2; the old one is rewrapped onto it; old
    # ciphertexts still decrypt, through a fresh client.
    assert decrypt_documents(mongo(vault), stored1) == DOCUMENTS  # version 1 still decrypts
    dk2 = first.encrypter.create_data_key("kmip", master_key={"keyId": v2_uid, "delegated": True})
    stored2 = encrypt_documents(first, dk2)
    rewrap(mongo(vault), provider="kmip", master_key={"keyId": v2_uid, "delegated": True})
    assert {d["masterKey"]["keyId"] for d in vault} == {v2_uid}
    assert decrypt_documents(mongo(vault), stored1 + stored2) == DOCUMENTS + DOCUMENTS
    mongo_uses = key_uses(services, seq, mongo_actor, key_id)
    assert ("key.decrypt", "allowed", 1) in mongo_uses
    assert [u for u in mongo_uses if u[0] == "key.encrypt"] == [("key.encrypt", "allowed", 2)] * 3  # new + 2 rewraps

    # PKCS#11: a new session's label finds version 2; version 1's ciphertext still opens.
    sealed2 = pkcs11_consumer("seal", label=name, data="sealed under version 2")
    assert sealed2["id"] == v2_uid, sealed2
    assert pkcs11_consumer("open", **{k: sealed1[k] for k in ("id", "nonce", "ct")}) == {
        "plain": "sealed under version 1"}
    assert key_uses(services, seq, p11_actor, key_id) == [("key.encrypt", "allowed", 2),
                                                          ("key.decrypt", "allowed", 1)]

    # === MariaDB shut down cleanly, then Revoke, in the console ===========================
    # A slow shutdown: every page flushed and the purge finished, so that nothing is left
    # that a restart would have to do in the table before a client asks for it.
    mariadb.sql("SET GLOBAL innodb_max_dirty_pages_pct=0; SET GLOBAL innodb_fast_shutdown=0")
    mariadb.stop()
    held = pkcs11_consumer("hold", label=name)  # a session that found the key before
    assert held == {"id": v2_uid}
    shown = in_console("revoke", **console, database=database)
    # One database, granted the key under two key ids: named once, before anything is typed.
    warning = shown["warning"]
    assert warning.startswith("A database reads this key") and warning.count(database) == 1, warning
    assert "Shut that database down cleanly first" in warning, warning
    assert {v.state for v in services.keys.get(ctx, name).versions} & {"active"} == set()
    seq = last_seq(services)

    # MariaDB: the restarted server cannot open the table (restarted without encryption
    # threads, so that the first to ask for the key is this query, not a background thread).
    mariadb.start([*options, "--innodb-encryption-threads=0"])
    with pytest.raises(SqlError) as refused:
        mariadb.sql("SELECT COUNT(*) FROM shop.orders")
    first_refusal = str(refused.value)
    assert "hashicorp: Unable to get key data" in first_refusal, f"{first_refusal}\n{mariadb.log.read_text()[-3000:]}"
    with pytest.raises(SqlError, match="is corrupted"):  # what MariaDB 10.11 calls it after
        mariadb.sql("SELECT COUNT(*) FROM shop.orders")
    log = mariadb.log.read_text()
    assert 'Hashicorp server error: 403, response: {"errors":["permission denied"]}' in log, log[-3000:]
    denied = [e for e in reads_since(services, admin, seq, db_actor) if e["outcome"] == "denied"]
    assert denied and {(e["object_id"], e["details"]["reason"]) for e in denied} == {(key_id, "key_revoked")}

    # PKCS#11: the held key is refused encryption, precisely; what version 1 sealed still opens.
    answer = pkcs11_consumer("seal_held")
    assert answer["error"].endswith(f"Unmapped error code {CKR_KEY_FUNCTION_NOT_PERMITTED:#x}"), answer
    assert ("key.encrypt", "denied", 2) in key_uses(services, seq, p11_actor, key_id)
    for sealed, plain in ((sealed1, "sealed under version 1"), (sealed2, "sealed under version 2")):
        assert pkcs11_consumer("open", **{k: sealed[k] for k in ("id", "nonce", "ct")}) == {"plain": plain}

    # MongoDB: no new data key under the revoked key (Illegal Operation); old data reads.
    message = failure(lambda: first.encrypter.create_data_key(
        "kmip", master_key={"keyId": v2_uid, "delegated": True}))
    assert "Illegal Operation" in message, message
    assert ("key.encrypt", "denied", 2) in key_uses(services, seq, mongo_actor, key_id)
    assert ("kmip.encrypt", v2_uid, "denied") in [(e.action, e.object_id, e.outcome)
                                                  for e in audit_since(services, seq, mongo_actor)]
    assert decrypt_documents(mongo(vault), stored1 + stored2) == DOCUMENTS + DOCUMENTS
