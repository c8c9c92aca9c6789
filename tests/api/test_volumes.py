"""Block volumes on the key server, through the agent port with the agent's own client
(real TLS, host certificates): sealing, unsealing bound to the volume, who may open
it, revocation, crypto-shredding by destroying the key, rotation, the recovery record,
re-key requests, and the audit of each (docs/volumes.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.keyclient.client import ServerRefused
from keyserver.services import Services
from tests.agents.test_agent_port import Host, enroll_host, group_key
from tests.conftest import unique


def _audit(services: Services, admin: httpx.Client, volume_id: str) -> list[dict[str, Any]]:
    services.audit.flush()
    r = admin.get("/api/v1/audit/events", params={"object_id": volume_id, "limit": 100})
    assert r.status_code == 200, r.text
    return list(r.json()["items"])


@pytest.fixture
def pair(tmp_path: Path, base_url: str, agent_url: str, admin: httpx.Client) -> tuple[Host, Host, dict[str, Any]]:
    """Two hosts of one group and a key tagged for it."""
    a = enroll_host(tmp_path, base_url, agent_url, admin, name="a")
    b = enroll_host(tmp_path, base_url, agent_url, admin, group=a.group, name="b")
    return a, b, group_key(admin, a.group)


def test_a_volume_opens_only_for_its_host_and_only_with_its_own_blob(
        pair: tuple[Host, Host, dict[str, Any]], admin: httpx.Client, services: Services) -> None:
    a, b, key = pair
    made = a.client.create_volume(name="pgdata", path="/srv/pgdata.img", key=key["name"], size_bytes=64 << 20)
    assert len(made.passphrase) == 32 and made.key_version == 1
    assert made.volume["state"] == "created" and made.volume["scope"] == "host"
    opened = a.client.unseal_volume(made.volume["id"], made.blob)
    assert opened.passphrase == made.passphrase
    # Another host of the same group: the volume is this host's own.
    with pytest.raises(ServerRefused) as refused:
        b.client.unseal_volume(made.volume["id"], made.blob)
    assert refused.value.status == 403
    # A blob made for another volume does not open this one (the context binds it).
    other = a.client.create_volume(name="logs", path="/srv/logs.img", key=key["name"])
    with pytest.raises(ServerRefused) as swapped:
        a.client.unseal_volume(made.volume["id"], other.blob)
    assert swapped.value.code == "integrity_failure"
    # The same name twice on one host is refused.
    with pytest.raises(ServerRefused) as twice:
        a.client.create_volume(name="pgdata", path="/srv/other.img", key=key["name"])
    assert twice.value.status == 409 and twice.value.code == "volume_exists"
    events = _audit(services, admin, made.volume["id"])
    seen = {(e["action"], e["outcome"]) for e in events}
    assert {("volume.create", "allowed"), ("volume.unseal", "allowed"), ("volume.open", "denied")} <= seen
    assert not any("passphrase" in str(e["details"]) for e in events)


def test_a_shared_volume_opens_on_every_host_of_its_group(pair: tuple[Host, Host, dict[str, Any]]) -> None:
    a, b, key = pair
    made = a.client.create_volume(name="san", path="/dev/sdx", key=key["name"], scope="group")
    assert b.client.unseal_volume(made.volume["id"], made.blob).passphrase == made.passphrase
    assert [v["name"] for v in b.client.volumes()] == ["san"]


def test_a_key_not_for_the_host_is_refused(tmp_path: Path, base_url: str, agent_url: str,
                                          admin: httpx.Client) -> None:
    host = enroll_host(tmp_path, base_url, agent_url, admin)
    foreign = admin.post("/api/v1/keys", json={"name": unique("foreign")}).json()
    with pytest.raises(ServerRefused) as refused:
        host.client.create_volume(name="x", path="/dev/sdy", key=foreign["name"])
    assert refused.value.status == 403 and "host-group=" in refused.value.detail


def test_revocation_and_key_destruction_make_the_volume_unopenable(
        pair: tuple[Host, Host, dict[str, Any]], admin: httpx.Client, services: Services) -> None:
    a, _, key = pair
    made = a.client.create_volume(name="revoked", path="/srv/r.img", key=key["name"])
    r = admin.post(f"/api/v1/volumes/{made.volume['id']}/revoke")
    assert r.status_code == 200 and r.json()["state"] == "revoked" and r.json()["revoked_at"]
    with pytest.raises(ServerRefused) as refused:
        a.client.unseal_volume(made.volume["id"], made.blob)
    assert refused.value.status == 403 and refused.value.code == "volume_revoked"
    assert "recovery passphrase" in refused.value.detail
    assert admin.post(f"/api/v1/volumes/{made.volume['id']}/revoke").status_code == 409
    denied = [e for e in _audit(services, admin, made.volume["id"]) if e["outcome"] == "denied"]
    assert denied and denied[0]["details"]["reason"] == "revoked"

    # Crypto-shredding: with the key destroyed, the sealed passphrase cannot be opened.
    shred = a.client.create_volume(name="shredded", path="/srv/s.img", key=key["name"])
    assert admin.post(f"/api/v1/keys/{key['name']}/revoke", json={"reason": "cessation-of-operation"}).status_code \
        == 200
    assert admin.post(f"/api/v1/keys/{key['name']}/destroy", json={"shred": True}).status_code == 200
    with pytest.raises(ServerRefused) as gone:
        a.client.unseal_volume(shred.volume["id"], shred.blob)
    assert gone.value.status == 409
    assert any(e["action"] == "volume.open" and e["outcome"] == "denied"
               for e in _audit(services, admin, shred.volume["id"]))


def test_rotation_reseals_under_the_new_version(pair: tuple[Host, Host, dict[str, Any]],
                                               admin: httpx.Client) -> None:
    a, _, key = pair
    made = a.client.create_volume(name="rot", path="/srv/rot.img", key=key["name"])
    assert admin.post(f"/api/v1/keys/{key['name']}/rotate").status_code == 200
    current, new = a.client.reseal_volume(made.volume["id"], made.blob)
    assert current.passphrase == made.passphrase and current.key_version == 1
    assert new.key_version == 2 and new.passphrase != made.passphrase
    v = a.client.report_volume(made.volume["id"], "closed", key_version=new.key_version)
    assert v["key_version"] == 2
    # The old blob still opens (its version is Deactivated, not destroyed) until the host replaces it.
    assert a.client.unseal_volume(made.volume["id"], new.blob).passphrase == new.passphrase


def test_states_recovery_and_rekey_requests(pair: tuple[Host, Host, dict[str, Any]], admin: httpx.Client,
                                           services: Services) -> None:
    a, b, key = pair
    made = a.client.create_volume(name="life", path="/srv/life.img", key=key["name"])
    vid = made.volume["id"]
    luks_uuid = "0f6e7c5e-2a55-4c3e-9d5c-9d1b8a1f0a11"
    assert a.client.report_volume(vid, "closed", luks_uuid=luks_uuid, size_bytes=1 << 30)["luks_uuid"] == luks_uuid
    v = a.client.report_volume(vid, "open", opened_by="userspace")
    assert v["state"] == "open" and v["opened_by"] == "userspace" and v["last_opened_at"]
    with pytest.raises(ServerRefused) as bad:
        a.client.report_volume(vid, "revoked")
    assert bad.value.status == 422
    with pytest.raises(ServerRefused):
        b.client.report_volume(vid, "closed")  # not b's
    assert a.client.record_volume_recovery(vid)["has_recovery"] is True
    with pytest.raises(ServerRefused) as again:
        a.client.record_volume_recovery(vid)
    assert again.value.code == "recovery_exists"
    r = admin.post(f"/api/v1/volumes/{vid}/rekey")
    assert r.status_code == 202 and r.json()["rekey_generation"] == 1
    a.client.report_volume(vid, "rekeying", rekey={"generation": 1, "done": 0, "total": 100, "finished": False})
    a.client.report_volume(vid, "rekeying", rekey={"generation": 1, "done": 10, "total": 100, "finished": False})
    done = a.client.report_volume(vid, "closed", rekey={"generation": 1, "done": 100, "total": 100,
                                                        "finished": True})
    assert done["rekey_applied"] == 1 and done["rekey"]["finished"] is True
    assert done["has_recovery"] is False  # re-encryption keeps only the sealed keyslot
    listed = admin.get("/api/v1/volumes", params={"host_id": a.id}).json()
    assert [v["name"] for v in listed] == ["life"] and listed[0]["hostname"] == "a.example.com"
    assert admin.get("/api/v1/volumes", params={"state": "bogus"}).status_code == 422
    assert admin.get(f"/api/v1/volumes/{vid}").json()["state"] == "closed"
    events = _audit(services, admin, vid)
    actions = [e["action"] for e in events]
    # Started and finished are events; the progress between is not.
    assert [e["details"].get("rekeyed") for e in events if e["action"] == "volume.rekey"] == [1, None]
    for wanted in ("volume.create", "volume.open", "volume.close", "volume.recovery", "volume.rekey_requested",
                   "volume.rekey"):
        assert wanted in actions, (wanted, actions)


def test_a_rekey_reported_interrupted_is_closed_unfinished_and_audited(
        pair: tuple[Host, Host, dict[str, Any]], admin: httpx.Client, services: Services) -> None:
    a, _, key = pair
    vid = a.client.create_volume(name="cut", path="/srv/cut.img", key=key["name"]).volume["id"]
    assert admin.post(f"/api/v1/volumes/{vid}/rekey").status_code == 202
    a.client.report_volume(vid, "rekeying", rekey={"generation": 1, "done": 0, "total": 100, "finished": False})
    a.client.report_volume(vid, "rekeying", rekey={"generation": 1, "done": 40, "total": 100, "finished": False})
    # What the agent says of a run killed with its process: closed, where it stood.
    v = a.client.report_volume(vid, "closed", rekey={"generation": 1, "done": 40, "total": 100, "finished": False},
                               detail="re-key interrupted: `kms-agent volume rekey cut` resumes it")
    assert v["state"] == "closed" and v["rekey"] == {"generation": 1, "done": 40, "total": 100, "finished": False}
    assert v["rekey_applied"] == 0 and v["rekey_generation"] == 1  # still asked for
    rekeys = [e for e in _audit(services, admin, vid) if e["action"] == "volume.rekey"]
    # The start and the interruption are events (a progress tick is not).
    assert [(e["details"]["state"], e["details"].get("detail")) for e in rekeys] == [
        ("closed", "re-key interrupted: `kms-agent volume rekey cut` resumes it"), ("rekeying", None)]


def test_bad_input_gets_a_precise_answer(pair: tuple[Host, Host, dict[str, Any]]) -> None:
    a, _, key = pair
    for fields, status in (({"name": "Bad Name"}, 400), ({"path": "relative/x"}, 400), ({"path": "/a/../b"}, 400),
                           ({"sector_size": 1024}, 422), ({"key": "no-such-key"}, 404)):
        body = {"name": "ok", "path": "/srv/ok.img", "key": key["name"], **fields}
        with pytest.raises(ServerRefused) as refused:
            a.client.create_volume(**body)
        assert refused.value.status == status, (fields, refused.value.detail)
    with pytest.raises(ServerRefused) as unknown:
        a.client.unseal_volume("00000000-0000-4000-8000-000000000000", b"x" * 60)
    assert unknown.value.status == 404 and unknown.value.code == "volume_not_found"
