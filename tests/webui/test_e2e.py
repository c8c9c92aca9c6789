"""The web console end to end: Debian's Chromium (driven by playwright-core, no browser
download) against a real keyserver of its own, on a fresh store of the session's kind
(PostgreSQL or the embedded default) with the session's SoftHSM2 token: a new
installation's first hour, whatever other tests left on the session's server.

Builds nothing: it needs webui/dist (scripts/test runs `npm run build` before pytest;
a server mounts the console only if dist existed when it was created)
and webui/node_modules. Set STRONGROOM_UPDATE_SCREENSHOTS=1 to refresh the screenshots
in docs/screenshots/ (otherwise they go to a temporary directory).

Hosts are real: enrolled on the agent port with the agent's own client (a CSR of a key
made on the "host"), heartbeating while the browser runs, one fetching its group's key
and reporting a refusal; the enrollment token the console shows is then used to enroll
one more host, and the host revoked in the console is refused at its next call."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from sqlalchemy import update

from agents.keyclient.client import HostRevoked, ServerClient, ServerRefused
from agents.keyclient.identity import HostIdentity
from keyserver.core.audit import utcnow
from keyserver.core.principal import system_context
from keyserver.services import Services
from keyserver.store.models import ApprovalRequest
from tests import https
from tests.conftest import REPO
from tests.https import server_spki_pin
from tests.webui.conftest import Installation

WEBUI = REPO / "webui"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def _kmip_files_work(services: Services, out: Path, good: str, revoked: str) -> None:
    from kmip.core import enums

    from keyserver.kmip.server import build_listener
    from tests.kmip.conftest import ClientFiles, make_client

    listener = build_listener(services, port=0)
    listener.start()
    try:
        def files(name: str) -> ClientFiles:
            return ClientFiles(name, "", out / f"{name}-cert.pem", out / f"{name}-key.pem", out / f"{name}-ca.pem")

        cert = x509.load_pem_x509_certificate(files(good).cert.read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert good in san.get_values_for_type(x509.DNSName)
        with make_client(files(good), listener.port) as client:
            uid = client.create(enums.CryptographicAlgorithm.AES, 256, name=f"from-console-{uuid.uuid4().hex[:6]}")
            assert uid
        with pytest.raises(Exception) as refused, make_client(files(revoked), listener.port) as client:
            client.locate()
        assert "PERMISSION_DENIED" in str(refused.value) or isinstance(refused.value, OSError | EOFError), refused.value
    finally:
        listener.stop()


def _require_prerequisites(base_url: str, ca_file: Path) -> str:
    node = shutil.which("node")
    missing = []
    if not node:
        missing.append("Node.js (apt-get install nodejs npm)")
    if not Path(CHROMIUM).exists():
        missing.append(f"Chromium at {CHROMIUM} (apt-get install chromium)")
    if not (WEBUI / "node_modules" / "playwright-core").is_dir():
        missing.append("webui/node_modules (cd webui && npm ci)")
    if not (WEBUI / "dist" / "index.html").exists():
        missing.append("webui/dist (cd webui && npm run build)")
    assert not missing, "scripts/test prepares these; missing: " + "; ".join(missing)
    page = https.get(base_url + "/", ca_file=ca_file, timeout=10).text
    assert '<div id="root">' in page, ("the test server does not serve the console: webui/dist did not exist "
                                       "when the test's server started")
    assert node
    return node


DOMAIN = "corp.example.net"
GROUP = "db-servers"
OS_NAME = "Debian GNU/Linux 13 (trixie)"


@dataclass
class FakeHost:
    """A machine that ran the installer: its own key pair and certificate, its client."""

    hostname: str
    id: str
    identity: HostIdentity
    client: ServerClient
    guard_points: list[dict[str, Any]]

    def beat(self) -> None:
        self.client.heartbeat(os_name=OS_NAME, guard_points=self.guard_points)


def _enroll(tmp_path: Path, agent_url: str, ca_file: Path, secret: str, hostname: str,
            guard_points: list[dict[str, Any]] | None = None) -> FakeHost:
    identity = HostIdentity.load_or_create(tmp_path / "hosts" / hostname)
    with ServerClient(agent_url, ca_file, identity) as c:
        result = c.enroll(secret, hostname=hostname, os_name=OS_NAME)
    return FakeHost(hostname, result["host_id"], identity, ServerClient.for_host(agent_url, identity),
                    guard_points or [])


def _token(admin: httpx.Client, group: str, max_uses: int) -> str:
    r = admin.post("/api/v1/enrollment-tokens", json={"host_group": group, "max_uses": max_uses})
    assert r.status_code == 201, r.text
    return str(r.json()["secret"])


def _prepare_hosts(tmp_path: Path, base_url: str, agent_url: str, admin: httpx.Client,
                   trusted: Path) -> dict[str, FakeHost]:
    """Two online database hosts (one with a guard point in error), a web host that never
    sent a heartbeat, and one to revoke from the console; keys for the database group."""
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(https.get(f"{base_url}/ca.pem", ca_file=trusted).content)
    for name in ("pg-main", "pg-wal"):
        r = admin.post("/api/v1/keys", json={"name": name, "description": f"PostgreSQL {name[3:]} volume",
                                             "tags": {"host-group": GROUP, "env": "prod"}})
        assert r.status_code == 201, r.text
    db = _token(admin, GROUP, 3)
    hosts = {
        "db1": _enroll(tmp_path, agent_url, ca_file, db, f"pg-01.{DOMAIN}", [
            {"path": "/srv/postgresql/16/main", "key": "pg-main", "state": "mounted"},
            {"path": "/srv/postgresql/wal", "key": "pg-wal", "state": "mounted"}]),
        "db2": _enroll(tmp_path, agent_url, ca_file, db, f"pg-02.{DOMAIN}", [
            {"path": "/srv/postgresql/16/main", "key": "pg-main", "state": "mounted"},
            {"path": "/srv/backup", "key": "pg-backup", "state": "error",
             "detail": "no key named or with id 'pg-backup'"}]),
        "old": _enroll(tmp_path, agent_url, ca_file, db, f"pg-old.{DOMAIN}",
                       [{"path": "/srv/postgresql/12/main", "key": "pg-main", "state": "unmounted"}]),
        "web": _enroll(tmp_path, agent_url, ca_file, _token(admin, "web", 1), f"web-01.{DOMAIN}"),
    }
    for name in ("db1", "db2", "old"):
        hosts[name].beat()
    assert hosts["db1"].client.fetch("pg-main").key.version == 1  # audited as key.deliver by host:pg-01…
    # What the agent's guard point manager spools (agents/guardpoint/manager.py): the data
    # directory mounted, its data plane crashed (status 139) and mounted again at once.
    now = time.time()
    hosts["db1"].client.send_events([
        {"event": "guardpoint.mounted", "time": now - 5 * 3600, "guard_point": "gp-main",
         "path": "/srv/postgresql/16/main", "revision": 1},
        {"event": "guardpoint.unmounted", "time": now - 2 * 3600, "guard_point": "gp-main",
         "path": "/srv/postgresql/16/main", "status": 139},
        {"event": "guardpoint.mounted", "time": now - 2 * 3600 + 600, "guard_point": "gp-main",
         "path": "/srv/postgresql/16/main", "revision": 1}])
    # Block volumes as `kms-agent volume create` and `open` record them (agents/volume):
    # the data volume open in userspace, an old WAL volume to revoke in the console.
    for name, state in (("pg-data", "open"), ("pg-wal-old", "closed")):
        made = hosts["db1"].client.create_volume(name=name, path=f"/dev/disk/by-id/{name}", key="pg-main",
                                                 size_bytes=200 << 30)
        hosts["db1"].client.report_volume(made.volume["id"], "closed", luks_uuid=str(uuid.uuid4()),
                                          size_bytes=200 << 30)
        if state == "open":
            hosts["db1"].client.report_volume(made.volume["id"], "open", opened_by="userspace")
    hosts["db2"].client.send_events([{  # as a guard point reports a refused reader
        "event": "access.denied", "time": time.time(), "path": "/srv/postgresql/16/main/base", "access": "read",
        "uid": 1001, "user": "backup", "pid": 4242, "exe": "/usr/bin/tar", "rule": "default", "mode": "enforce"}])
    return hosts


@contextmanager
def _pending_approval(services: Services, requested_by: str) -> Iterator[str]:
    """A key's destruction that another person asked for and that waits for approval, as
    core/approvals.py records one where the two-person rule holds key.destroy (the test's
    server holds nothing): the console's Approve dialog opens on it. Rejected afterwards,
    so nothing is left pending."""
    target = f"approval-target-{uuid.uuid4().hex[:6]}"
    now = utcnow()
    request = ApprovalRequest(id=uuid.uuid4(), action="key.destroy", target=target, params={},
                              requested_by=requested_by, requester_user_id=None, required=1, approvals=[],
                              state="pending", created_at=now, expires_at=now + timedelta(hours=1))
    with services.db.begin() as s:
        s.add(request)
    try:
        yield target
    finally:
        with services.db.begin() as s:
            s.execute(update(ApprovalRequest).where(ApprovalRequest.id == request.id)
                      .values(state="rejected", decided_at=now))


@contextmanager
def _heartbeating(hosts: list[FakeHost], every: float = 5.0) -> Iterator[None]:
    """The agents keep reporting while the browser runs, so they stay online."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(every):
            for h in hosts:
                h.beat()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


@pytest.mark.slow
@pytest.mark.store  # a server of its own on the session's kind of store (tests/webui/conftest.py)
# On the embedded store, alone on the machine (tests/parallel.py): SQLite takes one writer at a
# time and a request waits at most 5 s for it; beside the whole suite on two cores the console's
# dialogs at 375 px met error pages instead (2 runs of 3), on PostgreSQL never.
@pytest.mark.exclusive(stores=["embedded"])
@pytest.mark.timeout(1200)  # the browser run's own bound is 1100 s; on a loaded machine it needs many minutes
def test_console_end_to_end(fresh_installation: Installation, tmp_path: Path) -> None:
    it = fresh_installation
    base_url, agent_url, services, admin, ca_file = it.base_url, it.agent_url, it.services, it.admin, it.ca_file
    node = _require_prerequisites(base_url, ca_file)
    hosts = _prepare_hosts(tmp_path, base_url, agent_url, admin, ca_file)
    spare = _token(admin, "web", 5)  # revoked in the console
    ca = x509.load_pem_x509_certificate(https.get(f"{base_url}/ca.pem", ca_file=ca_file).content)
    out = tmp_path / "e2e-out"
    out.mkdir()
    ctx = system_context("tests")
    admin_user = f"e2e-admin-{uuid.uuid4().hex[:6]}"
    _, otp = services.identity.create_user(ctx, username=admin_user, role="admin")
    kmip_client, kmip_revoked = (f"{n}-{uuid.uuid4().hex[:6]}.{DOMAIN}" for n in ("backup", "retired"))
    auditor_user = f"e2e-auditor-{uuid.uuid4().hex[:6]}"
    auditor_password = f"audit-only-{uuid.uuid4().hex}"
    services.identity.create_user(ctx, username=auditor_user, role="auditor", password=auditor_password)
    assert otp
    shots = REPO / "docs" / "screenshots" if os.environ.get("STRONGROOM_UPDATE_SCREENSHOTS") else tmp_path / "shots"
    env = {
        "PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path),
        "BASE_URL": base_url, "CHROMIUM": CHROMIUM, "SCREENSHOT_DIR": str(shots),
        # The browser pins the server's key; the test's own API calls (Node) trust the CA.
        "TRUST_SPKI": server_spki_pin(base_url, ca_file=ca_file), "NODE_EXTRA_CA_CERTS": str(ca_file),
        "ADMIN_USER": admin_user, "ADMIN_OTP": otp,
        "AUDITOR_USER": auditor_user, "AUDITOR_PASSWORD": auditor_password,
        "AGENT_URL": agent_url, "CA_FINGERPRINT": ca.fingerprint(hashes.SHA256()).hex(":").upper(),
        "HOST_GROUP": GROUP, "E2E_OUT": str(out), "SPARE_TOKEN": "_".join(spare.split("_")[:2]),
        "KMIP_CLIENT": kmip_client, "KMIP_REVOKED": kmip_revoked,
        **{f"HOST_{name.upper()}": h.hostname for name, h in hosts.items()},
    }
    # As in production, the chainer appends audit records in the background, and the
    # replica reports itself (its scheduler would, every interval).
    services.audit.start(poll_seconds=0.1)
    services.replicas.beat()
    try:
        with _heartbeating([hosts["db1"], hosts["db2"]]), _pending_approval(services, auditor_user) as target:
            env["APPROVAL_TARGET"] = target
            proc = subprocess.run([node, "e2e/run.mjs"], cwd=WEBUI, env=env, capture_output=True, text=True,
                                  timeout=1100)  # some 30 dialogs opened three times, axe run in each
    finally:
        services.audit.stop()
    log = proc.stdout + proc.stderr
    (tmp_path / "browser.log").write_text(log)  # the whole run, where the assertion shows its end
    summary = [line for line in log.splitlines() if line.startswith(("ok ", "not ok ", "# pass", "# fail"))]
    print("\n".join(summary))
    assert proc.returncode == 0, f"browser tests failed (exit {proc.returncode}):\n{log[-12000:]}"
    assert "# fail 0" in log and "# pass 0" not in log, log[-4000:]
    assert sorted(p.name for p in shots.glob("*.png")) == sorted(
        f"{n}.png" for n in ("sign-in", "dashboard", "keys", "key-detail", "audit", "users", "tokens",
                             "hosts", "host-detail", "enroll", "guard-points", "guard-point-editor",
                             "keys-375", "keys-768", "keys-1440", "kek-hsm", "host-detail-dark", "kmip-issued",
                             "kmip-clients", "host-activity", "key-usage", "key-try", "guard-point-timeline",
                             "account-totp", "volumes", "volume-detail", "database-connected", "database-detail"))
    # The files the console handed out work with a stock KMIP client (PyKMIP) against a
    # real listener of this server; the client revoked in the console is refused.
    _kmip_files_work(services, out, kmip_client, kmip_revoked)
    # The token read from the console enrolls a real host, into the group chosen there.
    secret = (out / "enrollment-token.txt").read_text().strip()
    fresh = _enroll(tmp_path, agent_url, tmp_path / "ca.pem", secret, f"pg-03.{DOMAIN}")
    assert fresh.client.heartbeat(os_name=OS_NAME)["host_group"] == GROUP
    # The token revoked in the console enrolls nobody.
    with pytest.raises(ServerRefused) as refused:
        _enroll(tmp_path, agent_url, tmp_path / "ca.pem", spare, f"web-02.{DOMAIN}")
    assert refused.value.code == "enrollment_revoked"
    # The volume revoked in the console no longer opens: the server refuses its host.
    (wal,) = [v for v in hosts["db1"].client.volumes() if v["name"] == "pg-wal-old"]
    assert wal["state"] == "revoked"
    with pytest.raises(ServerRefused) as sealed:
        hosts["db1"].client.unseal_volume(wal["id"], b"\0" * 64)
    assert sealed.value.code == "volume_revoked"
    # The host revoked in the console is refused at its next call.
    with pytest.raises(HostRevoked):
        hosts["old"].beat()
    for h in [*hosts.values(), fresh]:
        h.client.close()
