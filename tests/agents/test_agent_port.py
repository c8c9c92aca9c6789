"""The agent port end to end, with the agent's own client: real TLS with the internal
CA pinned, client certificates, key delivery unwrapped on the host, heartbeats, event
batches, revocation and the refusals around them."""

from __future__ import annotations

import ssl
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.cryptfile import KeyUnavailable
from agents.daemon import AgentDaemon, clock_skew
from agents.keyclient.cache import ServerUnreachable
from agents.keyclient.client import HostRevoked, ServerClient, ServerKeyring, ServerRefused
from agents.keyclient.identity import HostIdentity
from agents.keyclient.spool import EventSpool
from hsm import WrappedKey
from keyserver.services import Services
from keyserver.store.models import KeyVersion, ManagedKey
from tests import https
from tests.conftest import unique


class Host:
    """An enrolled host: its state directory and a client with its certificate."""

    def __init__(self, state: Path, agent_url: str, group: str, host_id: str) -> None:
        self.identity = HostIdentity.load_or_create(state)
        self.client = ServerClient.for_host(agent_url, self.identity)
        self.group, self.id = group, host_id


def _ca_file(tmp_path: Path, base_url: str) -> Path:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(https.get(f"{base_url}/ca.pem").content)
    return ca


def enroll_host(tmp_path: Path, base_url: str, agent_url: str, admin: httpx.Client, *, group: str | None = None,
                name: str = "h") -> Host:
    group = group or unique("grp")
    secret = admin.post("/api/v1/enrollment-tokens", json={"host_group": group}).json()["secret"]
    state = tmp_path / f"state-{name}"
    with ServerClient(agent_url, _ca_file(tmp_path, base_url), HostIdentity.load_or_create(state)) as c:
        result = c.enroll(secret, hostname=f"{name}.example.com", os_name="Linux test")
    return Host(state, agent_url, group, result["host_id"])


@pytest.fixture
def host(tmp_path: Path, base_url: str, agent_url: str, admin: httpx.Client) -> Host:
    return enroll_host(tmp_path, base_url, agent_url, admin)


def group_key(admin: httpx.Client, group: str) -> dict[str, Any]:
    r = admin.post("/api/v1/keys", json={"name": unique("gp"), "tags": {"host-group": group}})
    assert r.status_code == 201, r.text
    return dict(r.json())


def stored_material(services: Services, name: str, version: int) -> bytes:
    with services.db() as s:
        v = s.query(KeyVersion).join(ManagedKey).filter(ManagedKey.name == name, KeyVersion.version == version).one()
        return services.hsm.unwrap_key(WrappedKey(v.wrapping_key_id, v.wrapping_mechanism, v.wrapped_key))


def test_delivery_is_unwrapped_on_the_host_only(tmp_path: Path, base_url: str, agent_url: str,
                                                admin: httpx.Client, services: Services, host: Host) -> None:
    key = group_key(admin, host.group)
    delivered = host.client.fetch(key["name"])
    assert delivered.name == key["name"] and delivered.key.version == 1 and delivered.state == "active"
    assert delivered.key.material == stored_material(services, key["name"], 1)
    # A second host of the same group gets the same key under its own public key.
    other = enroll_host(tmp_path, base_url, agent_url, admin, group=host.group, name="h2")
    assert other.client.fetch(key["id"]).key.material == delivered.key.material
    # The wire carries only the wrapped form.
    raw = httpx.get(f"{agent_url}/api/v1/agent/keys/{key['name']}", verify=_tls(host)).json()
    assert raw["mechanism"].startswith("RSA-OAEP") and delivered.key.material.hex() not in str(raw)
    assert [k["name"] for k in host.client.list_keys()] == [key["name"]]


def _tls(host: Host) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(host.identity.state_dir / "ca.crt"))
    ctx.load_cert_chain(host.identity.state_dir / "host.crt", host.identity.state_dir / "host.key")
    return ctx


def test_refusals_name_what_is_wrong(host: Host, admin: httpx.Client, services: Services) -> None:
    mine = group_key(admin, host.group)
    foreign = admin.post("/api/v1/keys", json={"name": unique("other")}).json()
    with pytest.raises(ServerRefused) as exc:
        host.client.fetch(foreign["name"])
    assert exc.value.status == 403 and host.group in exc.value.detail
    with pytest.raises(ServerRefused) as exc:
        host.client.fetch(mine["name"], version=7)
    assert exc.value.status == 404 and exc.value.code == "version_not_found"
    with pytest.raises(ServerRefused) as exc:
        host.client.fetch(unique("missing"))
    assert exc.value.code == "key_not_found"
    # A destroyed version: the keyring says precisely why it cannot be had.
    assert admin.post(f"/api/v1/keys/{mine['name']}/rotate").status_code == 200
    r = admin.post(f"/api/v1/keys/{mine['name']}/destroy", json={"version": 1})
    assert r.status_code == 200, r.text
    keyring = ServerKeyring(host.client, ttl_seconds=60, max_entries=8)
    with pytest.raises(KeyUnavailable, match="is destroyed"):
        keyring.get(uuid.UUID(mine["id"]), 1)
    assert keyring.get(uuid.UUID(mine["id"]), 2).version == 2


def test_agent_routes_need_a_host_certificate(tmp_path: Path, base_url: str, agent_url: str,
                                              admin: httpx.Client) -> None:
    ca = _ca_file(tmp_path, base_url)
    r = httpx.get(f"{agent_url}/api/v1/agent/keys", verify=ssl.create_default_context(cafile=str(ca)))
    assert r.status_code == 401 and r.json()["code"] == "client_certificate_required"
    # A certificate from elsewhere does not get through the TLS layer at all.
    stranger = HostIdentity.load_or_create(tmp_path / "stranger")
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import NameOID

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stranger")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(stranger.private_key.public_key()).serial_number(1)
            .not_valid_before(datetime.now(UTC) - timedelta(days=1)).not_valid_after(datetime.now(UTC) + timedelta(1))
            .sign(stranger.private_key, hashes.SHA256()))
    (tmp_path / "stranger" / "host.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.load_cert_chain(tmp_path / "stranger" / "host.crt", tmp_path / "stranger" / "host.key")
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{agent_url}/api/v1/agent/keys", verify=ctx).raise_for_status()
    # The agent port's own certificate is for the name the agent uses, from the pinned CA.
    assert httpx.get(f"{agent_url}/healthz", verify=ssl.create_default_context(cafile=str(ca))).status_code == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{agent_url}/healthz")  # the system trust store does not know our CA


def test_heartbeat_makes_the_host_online_with_its_guard_points(host: Host, admin: httpx.Client) -> None:
    before = admin.get(f"/api/v1/hosts/{host.id}").json()
    assert before["online"] is False and before["last_heartbeat_at"] is None
    gp = {"path": "/srv/db", "key": "db-key", "state": "mounted", "detail": ""}
    answer = host.client.heartbeat(os_name="Linux 6.1 (x86_64)", guard_points=[gp])
    assert answer["host_id"] == host.id and answer["state"] == "active" and answer["heartbeat_seconds"] == 30
    after = admin.get(f"/api/v1/hosts/{host.id}").json()
    assert after["online"] is True and after["os"] == "Linux 6.1 (x86_64)"
    assert after["guard_points"] == [{**gp, "id": None, "revision": None, "rekey": None, "unprotect": None}]
    assert after["last_seen_ip"] == "127.0.0.1"
    host.client.heartbeat(os_name="Linux 6.1 (x86_64)")  # `kms-agent status`: leaves the guard points alone
    assert admin.get(f"/api/v1/hosts/{host.id}").json()["guard_points"] == after["guard_points"]
    with pytest.raises(ServerRefused) as exc:
        host.client.heartbeat(os_name="x", guard_points=[{"path": "", "key": "k", "state": "sideways"}])
    assert exc.value.status == 422


def test_event_batches_become_audit_records_of_the_host(tmp_path: Path, host: Host, admin: httpx.Client,
                                                        services: Services) -> None:
    spool = EventSpool(tmp_path / "spool")
    marker = unique("f")
    spool.append({"event": "access.denied", "path": f"/srv/db/{marker}", "uid": 1001, "exe": "/usr/bin/cat"})
    spool.append({"event": "file.encrypt", "path": f"/srv/db/{marker}"})
    assert spool.send(host.client.send_events) == 2 and spool.pending() == 0
    services.audit.flush()
    items = admin.get("/api/v1/audit/events", params={"object_id": f"/srv/db/{marker}", "limit": 10}).json()["items"]
    got = {(e["action"], e["outcome"], e["actor"]) for e in items}
    assert got == {("agent.access.denied", "denied", "host:h.example.com"),
                   ("agent.file.encrypt", "allowed", "host:h.example.com")}
    denied = next(e for e in items if e["action"] == "agent.access.denied")
    assert denied["details"]["uid"] == 1001 and denied["details"]["host"] == host.id
    # A batch the server refuses as invalid is set aside, not retried forever.
    spool.append({"event": "NOT A NAME", "path": "/x"})
    spool.append({"event": "file.decrypt", "path": "/y"})
    spool.send(host.client.send_events, rejected=(ServerRefused,))
    assert spool.pending() == 0 and list((tmp_path / "spool").glob("*.rejected"))


def test_revocation_refuses_the_host_and_drops_its_cache(tmp_path: Path, host: Host, admin: httpx.Client) -> None:
    key = group_key(admin, host.group)
    keyring = ServerKeyring(host.client, ttl_seconds=3600, max_entries=8)
    keyring.get(uuid.UUID(key["id"]), 1)
    spool = EventSpool(tmp_path / "spool")
    daemon = AgentDaemon(host.client, keyring, spool)
    daemon.beat()
    assert len(keyring.cache) == 1
    assert admin.post(f"/api/v1/hosts/{host.id}/revoke").status_code == 200
    with pytest.raises(HostRevoked):
        daemon.beat()
    assert len(keyring.cache) == 0 and daemon.revoked
    with pytest.raises(HostRevoked):
        host.client.fetch(key["name"])


def test_the_cache_carries_the_agent_through_an_outage(tmp_path: Path, host: Host, admin: httpx.Client) -> None:
    """Within the TTL a cached version serves without the server; after it, a clear
    failure, never a stale key."""
    key = group_key(admin, host.group)
    now = [0.0]
    keyring = ServerKeyring(host.client, ttl_seconds=60, max_entries=8)
    keyring.cache._clock = lambda: now[0]  # the cache's injectable clock, not wall time
    kid = uuid.UUID(key["id"])
    first = keyring.get(kid, 1)
    host.client.close()
    dead = ServerClient.for_host("https://127.0.0.1:9", host.identity, timeout=2)  # nothing listens on port 9
    keyring._client = dead
    now[0] = 59.0
    assert keyring.get(kid, 1) is first
    now[0] = 61.0
    with pytest.raises(KeyUnavailable, match="unreachable"):
        keyring.get(kid, 1)
    with pytest.raises(ServerUnreachable):
        dead.heartbeat(os_name="x")


def test_a_server_outside_the_pinned_ca_is_refused(tmp_path: Path, agent_url: str, host: Host) -> None:
    other_ca = tmp_path / "other-ca.pem"
    other_ca.write_bytes(_self_signed_pem())
    client = ServerClient(agent_url, other_ca, host.identity)
    with pytest.raises(ServerUnreachable, match="not from the pinned CA"):
        client.heartbeat(os_name="x")


def test_clock_skew_is_measured_against_the_server() -> None:
    from datetime import UTC, datetime

    now = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
    assert clock_skew("2026-11-22T11:57:00+00:00", now) == 180.0
    assert clock_skew("2026-11-22T12:00:30Z", now) == -30.0


def _self_signed_pem() -> bytes:
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "another CA")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(2).not_valid_before(datetime.now(UTC) - timedelta(days=1))
            .not_valid_after(datetime.now(UTC) + timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


def test_re_enrollment_replaces_the_old_identity(tmp_path: Path, base_url: str, agent_url: str,
                                                 admin: httpx.Client, host: Host) -> None:
    """A revoked host comes back with a new token; so does one renewing its certificate.
    Either way one identity per host key stays active, and the old certificate is refused."""
    old_client = host.client
    old_client.heartbeat(os_name="x")
    secret = admin.post("/api/v1/enrollment-tokens", json={"host_group": host.group}).json()["secret"]
    with ServerClient(agent_url, _ca_file(tmp_path, base_url), host.identity) as c:
        new_id = c.enroll(secret, hostname="h.example.com")["host_id"]
    assert new_id != host.id
    assert admin.get(f"/api/v1/hosts/{host.id}").json()["state"] == "revoked"
    with pytest.raises(HostRevoked):
        old_client.heartbeat(os_name="x")
    fresh = ServerClient.for_host(agent_url, host.identity)
    assert fresh.heartbeat(os_name="x")["host_id"] == new_id


def test_the_agent_port_serves_hosts_only(tmp_path: Path, base_url: str, agent_url: str,
                                          admin: httpx.Client) -> None:
    """The console and the administrative API are on the main port only: a valid admin
    token gets nothing from the agent port but the routes a host needs."""
    trust = ssl.create_default_context(cafile=str(_ca_file(tmp_path, base_url)))
    token = admin.headers["authorization"]
    for path in ("/api/v1/keys", "/api/v1/users", "/api/v1/audit/events", "/", "/api/docs",
                 "/api/v1/openapi.json", "/metrics", "/api/v1/enrollX"):
        r = httpx.get(f"{agent_url}{path}", headers={"Authorization": token}, verify=trust)
        assert r.status_code == 404 and r.json()["code"] == "not_on_agent_port", path
    assert httpx.get(f"{base_url}/api/v1/keys", headers={"Authorization": token}, verify=trust).status_code == 200
    for path in ("/healthz", "/ca.pem", "/install.sh"):
        assert httpx.get(f"{agent_url}{path}", verify=trust).status_code == 200, path
    assert httpx.post(f"{agent_url}/api/v1/enroll", json={}, verify=trust).status_code == 422
