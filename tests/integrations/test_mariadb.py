"""MariaDB encrypts at rest with keys held in Strongroom: a real MariaDB server (its
own throwaway mariadbd, never the shared instance) with the Debian package's
hashicorp_key_management plugin, reading keys from the key server's KV-v2 front over
HTTPS (docs/integrations.md, MariaDB).

Three managed keys, granted under MariaDB's key ids: 1 (the server's own data: redo
log, system tablespace, the default for tables), 2 (temporary data: MariaDB asks for
it and falls back to 1 without it) and 5 (the table's ENCRYPTION_KEY_ID). The
test writes, restarts (keys read again, audited), cuts the key server off (the running
server goes on from its cache; a restart cannot), rotates key 5 twice and watches the
encryption threads re-encrypt the table, looks for the plaintext in every
file on disk (and finds it, as a control, in an unencrypted table's file), then
revokes key 5 and shows the restarted server refusing the table, and revokes the
database identity and shows the server refusing to start at all. A key revoked under
the running server aborts it at its next page write, and its recovery cannot finish.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from keyserver.services import Services

MARIADBD = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
PLUGIN = Path("/usr/lib/mysql/plugin/hashicorp_key_management.so")
pytestmark = pytest.mark.skipif(
    not (Path(MARIADBD).exists() and PLUGIN.exists()),
    reason="needs mariadb-server and mariadb-plugin-hashicorp-key-management (scripts/test installs both)")

ENC_MARKER = "STRONGROOM-SECRET-ROW"
PLAIN_MARKER = "STRONGROOM-CONTROL-ROW"
TABLE_KEY_ID = 5
LATE_KEY_ID = 6  # a table whose key is revoked while the server runs


class MariaDB:
    """A throwaway mariadbd in its own directory, on its own socket, no TCP port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.datadir = root / "data"
        self.socket = root / "mysqld.sock"
        self.log = root / "error.log"
        self.proc: subprocess.Popen[bytes] | None = None
        subprocess.run(["mariadb-install-db", "--no-defaults", "--user=root", f"--datadir={self.datadir}",
                        "--auth-root-authentication-method=normal", "--skip-test-db"],
                       check=True, capture_output=True, timeout=120)

    def start(self, options: list[str], *, expect_up: bool = True) -> None:
        self.log.write_text("")
        self.proc = subprocess.Popen(
            [MARIADBD, "--no-defaults", "--user=root", f"--datadir={self.datadir}", f"--socket={self.socket}",
             "--skip-networking", f"--log-error={self.log}", f"--pid-file={self.root / 'mysqld.pid'}",
             "--innodb-buffer-pool-size=32M", "--innodb-log-file-size=8M", "--performance-schema=OFF",
             "--innodb-use-native-aio=0", "--skip-log-bin", *options],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if expect_up:
                    raise AssertionError(f"mariadbd exited:\n{self.log.read_text()}")
                return
            if self.socket.exists() and self._ping():
                if not expect_up:
                    raise AssertionError(f"mariadbd started:\n{self.log.read_text()}")
                return
            time.sleep(0.2)
        raise AssertionError(f"mariadbd did not start in 60 s:\n{self.log.read_text()}")

    def _ping(self) -> bool:
        return subprocess.run(["mariadb", "--no-defaults", "-S", str(self.socket), "-uroot", "-e", "SELECT 1"],
                              capture_output=True, timeout=30).returncode == 0

    def sql(self, query: str) -> str:
        r = subprocess.run(["mariadb", "--no-defaults", "-S", str(self.socket), "-uroot", "-N", "-B", "-e", query],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise SqlError(r.stderr.strip())
        return r.stdout.strip()

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: a normal shutdown, dirty pages flushed
            self.proc.wait(timeout=120)
        self.proc = None


class SqlError(Exception):
    pass


class Outage:
    """A TCP relay between MariaDB and the key server that can be cut: while it is down,
    connections to its port are refused, as from a key server that is not running."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.port = 0
        self._listener: socket.socket | None = None
        self._open: list[socket.socket] = []

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.port, self._listener = listener.getsockname()[1], listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for c in self._open:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()
        self._open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def wait_for(what: str, check: Any, *, seconds: float = 60) -> Any:
    """Poll `check` until it gives something true; a bound on waiting, not a timing test."""
    deadline = time.monotonic() + seconds
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {seconds} s for {what}")
        time.sleep(0.25)


@pytest.fixture
def mariadb() -> Iterator[MariaDB]:
    # Short: a Unix socket path is at most 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="srdb-"))
    db = MariaDB(root)
    try:
        yield db
    finally:
        db.stop()
        shutil.rmtree(root, ignore_errors=True)


def files_containing(root: Path, marker: str) -> list[str]:
    needle = marker.encode()
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes())


def reads_since(services: Services, admin: httpx.Client, seq: int, actor: str) -> list[dict[str, Any]]:
    services.audit.flush()
    items = admin.get("/api/v1/audit/events", params={"actor": actor, "action": "database.key_read",
                                                       "limit": 500}).json()["items"]
    return [e for e in items if e["seq"] > seq]


def last_seq(services: Services, admin: httpx.Client) -> int:
    services.audit.flush()
    return int(admin.get("/api/v1/audit/events", params={"limit": 1}).json()["items"][0]["seq"])


def test_mariadb_encrypts_with_strongroom_keys(mariadb: MariaDB, services: Services, admin: httpx.Client,
                                                base_url: str, ca_file: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    system_key = admin.post("/api/v1/keys", json={"name": f"mariadb-system-{tag}"}).json()
    temp_key = admin.post("/api/v1/keys", json={"name": f"mariadb-temp-{tag}"}).json()
    table_key = admin.post("/api/v1/keys", json={"name": f"mariadb-orders-{tag}"}).json()
    late_key = admin.post("/api/v1/keys", json={"name": f"mariadb-invoices-{tag}"}).json()
    created = admin.post("/api/v1/databases", json={"name": f"orders-{tag}", "description": "MariaDB test"})
    assert created.status_code == 201, created.text
    name, token = created.json()["database"]["name"], created.json()["token"]
    # The URL the console gives is the server's public one; this test's server listens elsewhere.
    assert created.json()["vault_url"] == f"{services.settings.url}/v1/strongroom"
    relay = Outage(int(base_url.rsplit(":", 1)[1]))
    relay.up()
    url = f"https://127.0.0.1:{relay.port}/v1/strongroom"
    for key, kv_id in ((system_key, 1), (temp_key, 2), (table_key, TABLE_KEY_ID), (late_key, LATE_KEY_ID)):
        r = admin.post(f"/api/v1/databases/{name}/grants", json={"key": key["name"], "key_id": kv_id})
        assert r.status_code == 201, r.text
    actor = f"database:{name}"
    options = [
        "--plugin-load-add=hashicorp_key_management",
        f"--hashicorp-key-management-vault-url={url}",
        f"--hashicorp-key-management-token={token}",
        f"--hashicorp-key-management-vault-ca={ca_file}",
        # The plugin caches a key's latest version this long (ms): low, so that a rotation
        # is seen within a second here (docs/integrations.md says what to choose).
        "--hashicorp-key-management-cache-version-timeout=500",
        "--innodb-encrypt-tables=ON", "--innodb-encrypt-log=ON", "--innodb-encrypt-temporary-tables=ON",
        "--encrypt-tmp-files=ON", "--innodb-encryption-threads=2", "--innodb-encryption-rotate-key-age=1",
    ]
    seq = last_seq(services, admin)
    mariadb.start(options)
    assert mariadb.sql("SELECT PLUGIN_STATUS FROM information_schema.PLUGINS "
                       "WHERE PLUGIN_NAME='hashicorp_key_management'") == "ACTIVE"
    mariadb.sql(f"""CREATE DATABASE shop;
        CREATE TABLE shop.orders (id INT PRIMARY KEY, note VARCHAR(200)) ENGINE=InnoDB
            ENCRYPTED=YES ENCRYPTION_KEY_ID={TABLE_KEY_ID};
        CREATE TABLE shop.invoices (id INT PRIMARY KEY, note VARCHAR(200)) ENGINE=InnoDB
            ENCRYPTED=YES ENCRYPTION_KEY_ID={LATE_KEY_ID};
        CREATE TABLE shop.public_notes (id INT PRIMARY KEY, note VARCHAR(200)) ENGINE=InnoDB ENCRYPTED=NO;""")
    rows = ",".join(f"({i}, '{ENC_MARKER}-{i:04d}')" for i in range(200))
    mariadb.sql(f"INSERT INTO shop.orders VALUES {rows}")  # noqa: S608 - the test's own constants
    mariadb.sql(f"INSERT INTO shop.invoices VALUES {rows}")  # noqa: S608 - the test's own constants
    controls = ",".join(f"({i}, '{PLAIN_MARKER}-{i:04d}')" for i in range(200))
    mariadb.sql(f"INSERT INTO shop.public_notes VALUES {controls}")  # noqa: S608 - the test's own constants
    first = reads_since(services, admin, seq, actor)
    assert {(e["details"]["key_id"], e["outcome"]) for e in first} >= {(1, "allowed"), (TABLE_KEY_ID, "allowed")}
    assert all(e["outcome"] == "allowed" for e in first), first
    assert {e["object_id"] for e in first} <= {system_key["id"], temp_key["id"], table_key["id"], late_key["id"]}

    # A restart reads the keys again (the plugin's cache is the process's memory).
    mariadb.stop()
    seq = last_seq(services, admin)
    mariadb.start(options)
    assert mariadb.sql("SELECT COUNT(*) FROM shop.orders WHERE note LIKE 'STRONGROOM-SECRET-ROW-%'") == "200"
    again = reads_since(services, admin, seq, actor)
    assert {e["details"]["key_id"] for e in again if e["outcome"] == "allowed"} >= {1, TABLE_KEY_ID}

    # An outage of the key server: the running server goes on with the keys in its cache.
    relay.down()
    time.sleep(1)  # past the version cache (500 ms): the plugin asks again, and cannot reach the server
    mariadb.sql("INSERT INTO shop.orders VALUES (1000, 'STRONGROOM-SECRET-ROW-outage')")
    assert mariadb.sql("SELECT COUNT(*) FROM shop.orders") == "201"
    mariadb.sql("FLUSH TABLES shop.orders FOR EXPORT; UNLOCK TABLES")  # its pages written, encrypted
    # ... but a restart needs the key server: the plugin's cache is the process's memory.
    mariadb.stop()
    mariadb.start(options, expect_up=False)
    down = mariadb.log.read_text()
    assert "hashicorp: curl returned this error code: 7" in down, down[-3000:]  # could not connect
    assert "Plugin 'hashicorp_key_management' init function returned error." in down and "Aborting" in down
    relay.up()
    mariadb.start(options)

    def table_versions() -> tuple[int, int]:
        """The table's key version for new writes and the oldest of its pages' versions,
        (0, 0) while the encryption threads are at work on it."""
        out = mariadb.sql("SELECT CURRENT_KEY_ID, CURRENT_KEY_VERSION, MIN_KEY_VERSION, ROTATING_OR_FLUSHING FROM "
                          "information_schema.INNODB_TABLESPACES_ENCRYPTION WHERE NAME='shop/orders'")
        key_id, current, oldest, busy = (int(x) for x in out.split("\t"))
        assert key_id == TABLE_KEY_ID
        return (0, 0) if busy else (current, oldest)

    assert wait_for("the table encrypted under version 1", lambda: table_versions() == (1, 1))
    # Rotation in Strongroom is a new KV version: MariaDB writes with it as soon as its
    # version cache expires, and its encryption threads re-encrypt the pages written under
    # a version more than innodb_encryption_rotate_key_age (1) behind the latest.
    assert admin.post(f"/api/v1/keys/{table_key['name']}/rotate").status_code == 200
    wait_for("new writes under key version 2", lambda: table_versions()[0] == 2)
    assert admin.post(f"/api/v1/keys/{table_key['name']}/rotate").status_code == 200
    wait_for("every page re-encrypted under key version 3", lambda: table_versions() == (3, 3))
    latest = [e for e in reads_since(services, admin, seq, actor)
              if e["outcome"] == "allowed" and e["details"]["key_id"] == TABLE_KEY_ID]
    assert {2, 3} <= {e["details"]["version"] for e in latest}
    grant = next(g for g in admin.get(f"/api/v1/databases/{name}").json()["grants"] if g["key_id"] == TABLE_KEY_ID)
    assert grant["last_read_version"] in (1, 2, 3) and grant["last_read_at"] is not None

    # At rest: a clean shutdown flushes every page; no file holds the encrypted rows.
    mariadb.sql("SET GLOBAL innodb_max_dirty_pages_pct=0")
    mariadb.stop()
    assert files_containing(mariadb.datadir, ENC_MARKER) == [], "plaintext of an encrypted table on disk"
    assert "shop/public_notes.ibd" in files_containing(mariadb.datadir, PLAIN_MARKER), "the control"
    assert any(p.name.startswith("ib_logfile") for p in mariadb.datadir.iterdir())

    # Revocation: the restarted server cannot open the table.
    r = admin.post(f"/api/v1/keys/{table_key['name']}/revoke", json={"reason": "superseded"})
    assert r.status_code == 200, r.text
    seq = last_seq(services, admin)
    mariadb.start(options)
    with pytest.raises(SqlError) as refused:
        mariadb.sql("SELECT COUNT(*) FROM shop.orders")
    message = str(refused.value)
    # What MariaDB 10.11 says: the plugin's refusal reaches the client, the server's log
    # names the key server's answer; later reads call the undecryptable table corrupted.
    assert "hashicorp: Unable to get key data" in message, message
    log = mariadb.log.read_text()
    assert 'Hashicorp server error: 403, response: {"errors":["permission denied"]}' in log, log[-3000:]
    with pytest.raises(SqlError, match="is corrupted"):
        mariadb.sql("SELECT COUNT(*) FROM shop.orders")
    assert mariadb.sql("SELECT COUNT(*) FROM shop.public_notes") == "200"
    assert mariadb.sql("SELECT COUNT(*) FROM shop.invoices") == "200"
    denied = [e for e in reads_since(services, admin, seq, actor) if e["outcome"] == "denied"]
    assert denied and {e["details"]["reason"] for e in denied} == {"key_revoked"}

    # A key revoked under a running server: once the version cache has expired, the next
    # page written under it asks again, is refused, and MariaDB 10.11 aborts; its crash
    # recovery then needs that key, so the whole server stays down.
    r = admin.post(f"/api/v1/keys/{late_key['name']}/revoke", json={"reason": "superseded"})
    assert r.status_code == 200, r.text
    time.sleep(1)  # past the version cache (500 ms)
    mariadb.sql("INSERT INTO shop.invoices VALUES (2000, 'written after the revocation')")
    with pytest.raises(SqlError):
        mariadb.sql("FLUSH TABLES shop.invoices FOR EXPORT; UNLOCK TABLES")
    assert mariadb.proc is not None and mariadb.proc.wait(timeout=60) != 0
    assert "got signal 6" in mariadb.log.read_text()
    mariadb.proc = None
    mariadb.start(options, expect_up=False)
    crashed = mariadb.log.read_text()
    assert "InnoDB: Recovery cannot access file ./shop/invoices.ibd" in crashed, crashed[-3000:]

    # The database identity revoked: its token is refused, the redo log's key with it,
    # and the server does not start.
    assert admin.post(f"/api/v1/databases/{name}/revoke").status_code == 200
    mariadb.start(options, expect_up=False)
    log = mariadb.log.read_text()
    assert 'Hashicorp server error: 403, response: {"errors":["permission denied"]}' in log, log[-3000:]
    assert "Plugin 'hashicorp_key_management' init function returned error." in log
    services.audit.flush()
    refused_auth = admin.get("/api/v1/audit/events", params={"action": "database.authenticate", "actor": actor}).json()
    assert any(e["details"] == {"code": "database_revoked"} for e in refused_auth["items"])

