"""Retiring a key version (decision 0024): the inventory of use per version, destroy
refused while a version is in use (and shredding when asked by name), the held
retirement and its exclusions, and the signed zero-use statement written once when the
inventory reaches zero. On both stores, through REST and the agent port."""

from __future__ import annotations

import base64
import hashlib
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from sqlalchemy import select

from agents.keyclient.client import ServerRefused
from hsm import HsmBackend
from keyserver.core.approvals import ApprovalPending
from keyserver.core.audit.statements import RETIRED_ACTION, statement_problem
from keyserver.core.errors import Conflict, InvalidInput, NotFound
from keyserver.core.keys import KeySpec
from keyserver.core.principal import system_context
from keyserver.services import Services
from keyserver.store.models import AuditEvent
from tests.agents.test_agent_port import Host, enroll_host, group_key
from tests.api.test_approvals import _person
from tests.conftest import own_services, unique
from tests.integrations.test_xks import Xks


def _records(services: Services, key_id: str, action: str) -> list[AuditEvent]:
    services.audit.flush()
    with services.db() as s:
        return list(s.execute(select(AuditEvent).where(AuditEvent.object_id == key_id, AuditEvent.action == action)
                              .order_by(AuditEvent.seq)).scalars())


def _audit_key(admin: httpx.Client) -> tuple[ec.EllipticCurvePublicKey, str]:
    """The audit public key as an outside verifier gets it, and its fingerprint."""
    r = admin.get("/api/v1/audit/status")
    assert r.status_code == 200, r.text
    public = serialization.load_pem_public_key(r.json()["public_key_pem"].encode())
    assert isinstance(public, ec.EllipticCurvePublicKey)
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return public, hashlib.sha256(der).hexdigest()


def _report(host: Host, gp_id: str, path: str, key: str, versions: dict[str, int], at: datetime) -> None:
    host.client.heartbeat(os_name="Linux test", guard_points=[{
        "id": gp_id, "path": path, "key": key, "state": "mounted", "versions": versions,
        "scanned_at": at.isoformat()}])


def _inventory(admin: httpx.Client, key: str, version: int) -> dict[str, Any]:
    r = admin.get(f"/api/v1/keys/{key}/versions/{version}/inventory")
    assert r.status_code == 200, r.text
    return dict(r.json())


def _holder(inv: dict[str, Any], kind: str) -> dict[str, Any]:
    found = [h for h in inv["holders"] if h["kind"] == kind]
    assert len(found) == 1, inv["holders"]
    return dict(found[0])


def test_a_version_is_counted_refused_destruction_retired_and_proven_unused(
        tmp_path: Path, base_url: str, agent_url: str, admin: httpx.Client, services: Services) -> None:
    host = enroll_host(tmp_path, base_url, agent_url, admin, name="ret")
    key = group_key(admin, host.group)
    name, key_id = key["name"], key["id"]
    # Under v1: three data keys, a volume and a guard point whose walk found 5 files.
    blobs = []
    for _ in range(3):
        r = admin.post(f"/api/v1/keys/{name}/generate-data-key", json={})
        assert r.status_code == 200 and r.json()["key_version"] == 1, r.text
        blobs.append(r.json()["ciphertext_blob"])
    volume = host.client.create_volume(name="db", path="/srv/db.img", key=name)
    assert volume.key_version == 1
    r = admin.post("/api/v1/guard-points", json={"host_id": host.id, "path": "/srv/data", "key": name})
    assert r.status_code == 201, r.text
    gp_id = r.json()["id"]
    _report(host, gp_id, "/srv/data", name, {"1": 5}, datetime.now(UTC))

    assert admin.post(f"/api/v1/keys/{name}/rotate", json={}).status_code == 200
    # Two blobs re-encrypted, one of them twice: it counts once.
    for b in (blobs[0], blobs[1], blobs[0]):
        r = admin.post("/api/v1/datakeys/reencrypt", json={"ciphertext_blob": b})
        assert r.status_code == 200 and r.json()["key_version"] == 2, r.text
    inv = _inventory(admin, name, 1)
    assert inv["in_use"] is True and inv["state"] == "deactivated" and inv["retirement"] is None
    assert inv["kinds"] == {"data_keys": 1, "guard_point_files": 5, "volumes": 1, "databases": 0, "xks_stores": 0,
                            "kmip_clients": 0}
    gp = _holder(inv, "guard_point")
    assert (gp["holder"], gp["count"], gp["state"], gp["host"]) == (f"{gp_id}@{host.id}", 5, "in_use",
                                                                   "ret.example.com")
    assert _holder(inv, "volume")["state"] == "in_use" and _holder(inv, "data_keys")["count"] == 1
    assert _inventory(admin, name, 2)["in_use"] is False  # nothing under v2 yet but what just moved there

    # Destroying v1 now would shred what it protects: refused with the holders, audited.
    r = admin.post(f"/api/v1/keys/{name}/destroy", json={"version": 1})
    assert r.status_code == 409 and r.json()["code"] == "version_in_use", r.text
    assert {e["kind"] for e in r.json()["errors"]} == {"data_keys", "guard_point", "volume"}
    refused = [e for e in _records(services, key_id, "key.destroy") if e.outcome == "denied"]
    assert refused and refused[-1].details["reason"] == "version_in_use"

    # The Active version cannot be retired; the old one can.
    r = admin.post(f"/api/v1/keys/{name}/versions/2/retire", json={"reason": "x"})
    assert r.status_code == 409 and r.json()["code"] == "version_active", r.text
    assert admin.post(f"/api/v1/keys/{name}/versions/9/retire", json={}).json()["code"] == "version_not_found"
    r = admin.post(f"/api/v1/keys/{name}/versions/1/retire", json={"reason": "ISO 27001 A.8.24"})
    assert r.status_code == 201, r.text
    retirement = r.json()
    assert retirement["state"] == "running" and retirement["initial"]["data_keys"] == 1
    r = admin.post(f"/api/v1/keys/{name}/versions/1/retire", json={})
    assert r.status_code == 409 and r.json()["code"] == "retirement_running"
    assert {(k["name"], tuple(k["retiring_versions"])) for k in host.client.list_keys()} == {(name, (1,))}
    listed = admin.get("/api/v1/retirements", params={"state": "running"}).json()
    assert retirement["id"] in [x["id"] for x in listed]
    assert admin.get("/api/v1/retirements", params={"state": "bogus"}).status_code == 422
    # The host's walk predates the retirement: it is named, not trusted.
    inv = _inventory(admin, name, 1)
    assert _holder(inv, "guard_point")["state"] == "unreported" and inv["unreported_hosts"] == ["ret.example.com"]

    # Every holder moves: the last blob re-encrypted, the volume resealed, the host walks again.
    assert admin.post("/api/v1/datakeys/reencrypt", json={"ciphertext_blob": blobs[2]}).status_code == 200
    _, new = host.client.reseal_volume(volume.volume["id"], volume.blob)
    assert new.key_version == 2
    host.client.report_volume(volume.volume["id"], "closed", key_version=2)
    _report(host, gp_id, "/srv/data", name, {"2": 5}, datetime.now(UTC) + timedelta(seconds=1))

    inv = _inventory(admin, name, 1)  # reading it completes the retirement
    assert inv["in_use"] is False and inv["unreported_hosts"] == []
    assert set(inv["kinds"].values()) == {0}
    done = inv["retirement"]
    assert done["state"] == "complete" and done["statement_seq"] is not None
    statements = _records(services, key_id, RETIRED_ACTION)
    assert len(statements) == 1 and statements[0].seq == done["statement_seq"]
    public, fingerprint = _audit_key(admin)
    details = statements[0].details
    assert statement_problem(details, public, fingerprint) is None
    st = details["statement"]
    assert (st["version"], st["retirement"], st["initial"]["guard_point_files"]) == (1, retirement["id"], 5)
    assert st["hosts"] == ["ret.example.com"] and st["excluded"] == []
    forged = {**details, "statement": {**st, "counts": {**st["counts"], "data_keys": 0, "volumes": 1}}}
    assert statement_problem(forged, public, fingerprint) == "the statement's signature does not verify"
    # Reading again writes no second statement; a second retirement is refused.
    _inventory(admin, name, 1)
    assert services.retirement.run_due() == 0
    assert len(_records(services, key_id, RETIRED_ACTION)) == 1
    r = admin.post(f"/api/v1/keys/{name}/versions/1/retire", json={})
    assert r.status_code == 409 and r.json()["code"] == "version_retired", r.text
    assert host.client.list_keys()[0]["retiring_versions"] == []
    # Only now does destroy go, without shredding anything.
    r = admin.post(f"/api/v1/keys/{name}/destroy", json={"version": 1})
    assert r.status_code == 200, r.text
    assert [v["state"] for v in r.json()["versions"]] == ["destroyed", "active"]


def test_shred_destroys_a_version_in_use_by_name_and_records_the_holders(
        tmp_path: Path, base_url: str, agent_url: str, admin: httpx.Client, services: Services) -> None:
    host = enroll_host(tmp_path, base_url, agent_url, admin, name="shred")
    key = group_key(admin, host.group)
    volume = host.client.create_volume(name="scratch", path="/srv/scratch.img", key=key["name"])
    assert admin.post(f"/api/v1/keys/{key['name']}/rotate", json={}).status_code == 200
    r = admin.post(f"/api/v1/keys/{key['name']}/destroy", json={"version": 1})
    assert r.status_code == 409 and [e["holder"] for e in r.json()["errors"]] == [volume.volume["id"]]
    r = admin.post(f"/api/v1/keys/{key['name']}/destroy", json={"version": 1, "shred": True})
    assert r.status_code == 200, r.text
    destroyed = [e for e in _records(services, key["id"], "key.destroy") if e.outcome == "allowed"]
    assert destroyed[-1].details["shred"] is True
    assert [h["holder"] for h in destroyed[-1].details["holders"]] == [volume.volume["id"]]
    r = admin.post(f"/api/v1/keys/{key['name']}/versions/1/retire", json={})
    assert r.status_code == 409 and r.json()["code"] == "version_destroyed"


def test_a_running_retirement_can_be_cancelled_and_refusals_are_precise(
        admin: httpx.Client, services: Services) -> None:
    name = unique("cancel")
    key_id = admin.post("/api/v1/keys", json={"name": name}).json()["id"]
    assert admin.post(f"/api/v1/keys/{name}/generate-data-key", json={}).status_code == 200
    assert admin.post(f"/api/v1/keys/{name}/rotate", json={}).status_code == 200
    assert admin.post(f"/api/v1/keys/{name}/versions/1/retire", json={}).status_code == 201
    base = f"/api/v1/keys/{name}/versions/1/retire"
    r = admin.post(f"{base}/exclusions", json={"kind": "volume", "holder": str(uuid.uuid4()), "reason": "gone"})
    assert r.status_code == 404 and r.json()["code"] == "holder_not_found", r.text
    r = admin.post(f"{base}/exclusions", json={"kind": "planet", "holder": "x", "reason": "gone"})
    assert r.status_code == 422
    r = admin.delete(base)
    assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
    r = admin.delete(base)
    assert r.status_code == 409 and r.json()["code"] == "retirement_not_running"
    r = admin.delete(f"/api/v1/keys/{name}/versions/7/retire")
    assert r.status_code == 404 and r.json()["code"] == "version_not_found"
    r = admin.post(f"{base}/exclusions", json={"kind": "data_keys", "holder": "applications", "reason": "gone"})
    assert r.status_code == 409 and r.json()["code"] == "retirement_not_running"
    reasons = {(e.action, e.details.get("reason")) for e in _records(services, key_id, "key.retire_cancel")
               + _records(services, name, "key.retire_exclude") if e.outcome == "denied"}
    assert ("key.retire_cancel", "retirement_not_running") in reasons
    assert [e.details["version"] for e in _records(services, name, "key.retire_cancel")] == [7]
    assert ("key.retire_exclude", "holder_not_found") in reasons
    assert ("key.retire_exclude", "retirement_not_running") in reasons
    assert _records(services, key_id, RETIRED_ACTION) == []


@pytest.fixture
def held(services: Services, hsm_backend: HsmBackend, tmp_path: Path) -> Any:
    with own_services(tmp_path / "data", hsm_backend,
                      approvals={"key.destroy": 2, "key.retire": 2, "key.retire_exclude": 1}) as svc:
        yield svc


def test_retiring_and_excluding_are_held_under_the_two_person_rule(held: Services) -> None:
    alice, bob, carol = (_person(held, "key-officer") for _ in range(3))
    system = system_context("tests")
    key = held.keys.create(alice, KeySpec(name=unique("held-ret")))
    held.datakeys.generate(system, str(key.id))  # an application holds a blob under v1 and discards it
    held.keys.rotate(alice, str(key.id))
    with pytest.raises(Conflict) as in_use:
        held.keys.destroy(alice, str(key.id), version=1)
    assert in_use.value.code == "version_in_use"
    assert held.approvals.list(bob, state="pending") == []  # refused before anything was held
    with pytest.raises(Conflict) as active:
        held.retirement.retire(alice, str(key.id), 2)
    assert active.value.code == "version_active"  # refused before anything is held
    with pytest.raises(ApprovalPending) as e:
        held.retirement.retire(alice, str(key.id), 1, reason="retire v1")
    assert held.retirement.list(alice, state="running") == []  # nothing happened yet
    assert not held.approvals.approve(bob, e.value.request.id).executed
    assert held.approvals.approve(carol, e.value.request.id).executed
    inv = held.retirement.inventory(alice, str(key.id), 1)
    assert inv["retirement"]["state"] == "running" and inv["kinds"]["data_keys"] == 1
    assert inv["retirement"]["requested_by"] == alice.principal.name

    with pytest.raises(NotFound) as missing:
        held.retirement.exclude(alice, str(key.id), 1, kind="host", holder="nowhere", reason="decommissioned")
    assert missing.value.code == "holder_not_found"
    with pytest.raises(InvalidInput) as bare:
        held.retirement.exclude(alice, str(key.id), 1, kind="data_keys", holder="applications", reason=" ")
    assert bare.value.code == "reason_required"
    with pytest.raises(ApprovalPending) as x:
        held.retirement.exclude(alice, str(key.id), 1, kind="data_keys", holder="applications",
                                reason="the batch job discarded its blobs")
    done = held.approvals.approve(bob, x.value.request.id)
    assert done.executed and done.result["state"] == "complete"
    statements = _records(held, str(key.id), RETIRED_ACTION)
    assert len(statements) == 1
    der = held.audit.public_key_der()
    public = serialization.load_der_public_key(der)
    assert isinstance(public, ec.EllipticCurvePublicKey)
    details = statements[0].details
    assert statement_problem(details, public, hashlib.sha256(der).hexdigest()) is None
    assert details["statement"]["excluded"] == [{"kind": "data_keys", "holder": "applications",
                                                 "reason": "the batch job discarded its blobs",
                                                 "by": alice.principal.name}]
    assert details["statement"]["counts"]["data_keys"] == 0 and details["statement"]["initial"]["data_keys"] == 1
    with pytest.raises(Conflict) as again:
        held.retirement.retire(alice, str(key.id), 1)
    assert again.value.code == "version_retired"
    assert base64.b64decode(details["signature"])  # DER, base64
    # Retired, the version is destroyed as any is: held, and run once two others approve.
    with pytest.raises(ApprovalPending) as d:
        held.keys.destroy(alice, str(key.id), version=1)
    held.approvals.approve(bob, d.value.request.id)
    assert held.approvals.approve(carol, d.value.request.id).executed
    assert [v.state for v in held.keys.get(alice, str(key.id)).versions] == ["destroyed", "active"]


def test_a_host_that_never_walks_blocks_until_excluded_and_contents_rekeys_guard_points(
        tmp_path: Path, base_url: str, agent_url: str, admin: httpx.Client, services: Services) -> None:
    a = enroll_host(tmp_path, base_url, agent_url, admin, name="walks")
    b = enroll_host(tmp_path, base_url, agent_url, admin, group=a.group, name="silent")
    key = group_key(admin, a.group)
    name = key["name"]
    r = admin.post("/api/v1/guard-points", json={"host_group": a.group, "path": "/srv/shared", "key": name})
    assert r.status_code == 201, r.text
    gp = r.json()
    for h in (a, b):
        _report(h, gp["id"], "/srv/shared", name, {"1": 3}, datetime.now(UTC))
    # What a walk may report is bounded and its time must say its zone.
    with pytest.raises(ServerRefused) as big:
        _report(a, gp["id"], "/srv/shared", name, {str(n): 1 for n in range(1, 66)}, datetime.now(UTC))
    assert big.value.status == 422
    with pytest.raises(ServerRefused) as naive:
        _report(a, gp["id"], "/srv/shared", name, {"1": 3}, datetime.now(UTC).replace(tzinfo=None))
    assert naive.value.status == 422

    assert admin.post(f"/api/v1/keys/{name}/rotate", json={}).status_code == 200
    r = admin.post(f"/api/v1/keys/{name}/versions/1/retire", json={"reason": "rekey too", "contents": True})
    assert r.status_code == 201 and r.json()["initial"]["guard_point_files"] == 6, r.text
    rekeyed = admin.get(f"/api/v1/guard-points/{gp['id']}").json()
    assert rekeyed["rekey_generation"] == gp["rekey_generation"] + 1  # the server asked for new file keys
    assert sorted(_inventory(admin, name, 1)["unreported_hosts"]) == ["silent.example.com", "walks.example.com"]
    _report(a, gp["id"], "/srv/shared", name, {"2": 3}, datetime.now(UTC) + timedelta(seconds=1))
    inv = _inventory(admin, name, 1)
    assert inv["unreported_hosts"] == ["silent.example.com"] and inv["retirement"]["state"] == "running"
    assert services.retirement.run_due() == 0  # the scheduler's turn finds it blocked too

    base = f"/api/v1/keys/{name}/versions/1/retire/exclusions"
    r = admin.post(base, json={"kind": "host", "holder": "silent.example.com", "reason": "decommissioned"})
    assert r.status_code == 201 and r.json()["state"] == "complete", r.text
    assert r.json()["exclusions"][0]["holder"] == b.id  # a host is excluded by its id
    r = admin.post(base, json={"kind": "host", "holder": b.id, "reason": "again"})
    assert r.status_code == 409 and r.json()["code"] == "retirement_not_running"
    (statement,) = _records(services, key["id"], RETIRED_ACTION)
    public, fingerprint = _audit_key(admin)
    assert statement_problem(statement.details, public, fingerprint) is None
    st = statement.details["statement"]
    assert st["hosts"] == ["walks.example.com"] and st["counts"]["guard_point_files"] == 0
    assert st["excluded"] == [{"kind": "host", "holder": b.id, "reason": "decommissioned",
                               "by": st["excluded"][0]["by"]}]


def test_the_scheduler_completes_a_retirement_once_its_last_holder_moved(admin: httpx.Client,
                                                                       services: Services) -> None:
    name = unique("sched-ret")
    key_id = admin.post("/api/v1/keys", json={"name": name}).json()["id"]
    blob = admin.post(f"/api/v1/keys/{name}/generate-data-key", json={}).json()["ciphertext_blob"]
    assert admin.post(f"/api/v1/keys/{name}/rotate", json={}).status_code == 200
    rid = admin.post(f"/api/v1/keys/{name}/versions/1/retire", json={}).json()["id"]
    assert admin.post("/api/v1/datakeys/reencrypt", json={"ciphertext_blob": blob}).status_code == 200
    # Nothing read the inventory since: the scheduler's turn is what completes it.
    assert rid in [r["id"] for r in admin.get("/api/v1/retirements", params={"state": "running"}).json()]
    assert services.scheduler.run_once()["versions_retired"] >= 1
    done = {r["id"]: r for r in admin.get("/api/v1/retirements", params={"state": "complete"}).json()}
    assert done[rid]["statement_seq"] == _records(services, key_id, RETIRED_ACTION)[0].seq


def test_an_aws_key_store_that_used_the_version_holds_it_until_excluded(admin: httpx.Client, base_url: str,
                                                                        tls: Any, services: Services) -> None:
    store = Xks(admin, base_url, tls)
    name = unique("xks-ret")
    key_id = admin.post("/api/v1/keys", json={"name": name}).json()["id"]
    external = store.grant(admin, name)
    assert store.encrypt(external, b"under v1").status_code == 200
    assert admin.post(f"/api/v1/keys/{name}/rotate", json={}).status_code == 200
    holder = _holder(_inventory(admin, name, 1), "xks_store")
    assert (holder["holder"], holder["count"], holder["state"]) == (store.name, None, "in_use")
    assert _holder(_inventory(admin, name, 2), "xks_store")["state"] == "clear"  # granted, never used v2
    r = admin.post(f"/api/v1/keys/{name}/versions/1/retire", json={})
    assert r.status_code == 201 and r.json()["initial"]["xks_stores"] == 1, r.text
    assert _inventory(admin, name, 1)["retirement"]["state"] == "running"  # AWS keeps its ciphertexts
    r = admin.post(f"/api/v1/keys/{name}/versions/1/retire/exclusions",
                   json={"kind": "xks_store", "holder": store.name, "reason": "AWS re-encrypted under v2"})
    assert r.status_code == 201 and r.json()["state"] == "complete", r.text
    assert len(_records(services, key_id, RETIRED_ACTION)) == 1


def test_a_database_holds_the_version_it_last_read(admin: httpx.Client, base_url: str, tls: Any) -> None:
    db = admin.post("/api/v1/databases", json={"name": unique("db-ret")}).json()
    name = unique("tde-ret")
    assert admin.post("/api/v1/keys", json={"name": name}).status_code == 201
    r = admin.post(f"/api/v1/databases/{db['database']['name']}/grants", json={"key": name, "key_id": 1})
    assert r.status_code == 201, r.text
    with httpx.Client(base_url=base_url, headers={"X-Vault-Token": db["token"]}, verify=tls, timeout=30) as kv:
        assert kv.get("/v1/strongroom/data/1").json()["data"]["metadata"]["version"] == 1
        assert admin.post(f"/api/v1/keys/{name}/rotate", json={}).status_code == 200
        holder = _holder(_inventory(admin, name, 1), "database")
        assert (holder["state"], holder["count"], holder["name"]) == (
            "in_use", None, f"database {db['database']['name']} (key id 1)")
        assert _holder(_inventory(admin, name, 2), "database")["state"] == "clear"
        # The database reads the new version (its own key rotation re-encrypts with it).
        assert kv.get("/v1/strongroom/data/1").json()["data"]["metadata"]["version"] == 2
    assert _holder(_inventory(admin, name, 1), "database")["state"] == "clear"
    assert _holder(_inventory(admin, name, 2), "database")["state"] == "in_use"


def test_the_counts_at_the_start_include_a_data_key_issued_a_moment_before(admin: httpx.Client) -> None:
    """`initial` goes into the signed statement: a data key whose record is not chained
    yet when the retirement starts is counted all the same (the chain is flushed first)."""
    name = admin.post("/api/v1/keys", json={"name": f"ret-initial-{uuid.uuid4().hex[:6]}"}).json()["name"]
    blob = admin.post(f"/api/v1/keys/{name}/generate-data-key", json={}).json()["ciphertext_blob"]
    assert admin.post(f"/api/v1/keys/{name}/rotate").status_code == 200
    r = admin.post(f"/api/v1/keys/{name}/versions/1/retire", json={"reason": "initial counts"})
    assert r.status_code == 201, r.text
    assert r.json()["initial"]["data_keys"] == 1, r.json()
    assert admin.post("/api/v1/datakeys/reencrypt", json={"ciphertext_blob": blob}).status_code == 200
    assert admin.get(f"/api/v1/keys/{name}/versions/1/inventory").json()["retirement"]["state"] == "complete"


def test_unreadable_files_are_counted_apart_block_nothing_and_are_named_in_the_statement(
        tmp_path: Path, base_url: str, agent_url: str, admin: httpx.Client, services: Services) -> None:
    """A walk's files whose header names no version of the key (damaged, another key's)
    come as `unreadable`: shown per guard point, not a use of any version, and listed with
    host and path in the zero-use statement so an auditor sees them."""
    host = enroll_host(tmp_path, base_url, agent_url, admin, name="unread")
    key = group_key(admin, host.group)
    name = key["name"]
    r = admin.post("/api/v1/guard-points", json={"host_id": host.id, "path": "/srv/mixed", "key": name})
    assert r.status_code == 201, r.text
    gp_id = r.json()["id"]

    def report(versions: dict[str, int], at: datetime, **extra: Any) -> None:
        host.client.heartbeat(os_name="Linux test", guard_points=[{
            "id": gp_id, "path": "/srv/mixed", "key": name, "state": "mounted", "versions": versions,
            "scanned_at": at.isoformat(), **extra}])

    report({"1": 2}, datetime.now(UTC))  # an agent from before the count: it says nothing
    assert _holder(_inventory(admin, name, 1), "guard_point")["unreadable"] is None
    report({"1": 2}, datetime.now(UTC), unreadable=1)
    gp = _holder(_inventory(admin, name, 1), "guard_point")
    assert (gp["count"], gp["unreadable"], gp["state"]) == (2, 1, "in_use")
    assert _holder(_inventory(admin, name, 1), "data_keys")["unreadable"] is None
    # A count is a whole number from 0: anything else is refused, never rounded or guessed at.
    for bad in (-1, 1.5, 1.0, "1", True, 2**62 + 1):
        with pytest.raises(ServerRefused) as refused:
            report({"1": 2}, datetime.now(UTC), unreadable=bad)
        assert refused.value.status == 422, bad
        assert "unreadable" in refused.value.detail, refused.value.detail
    assert _holder(_inventory(admin, name, 1), "guard_point")["unreadable"] == 1  # the refusals changed nothing

    assert admin.post(f"/api/v1/keys/{name}/rotate", json={}).status_code == 200
    r = admin.post(f"/api/v1/keys/{name}/versions/1/retire", json={"reason": "with a damaged file"})
    assert r.status_code == 201, r.text
    walked = datetime.now(UTC) + timedelta(seconds=1)
    report({"2": 2}, walked, unreadable=1)  # moved; the damaged file stays what it is
    inv = _inventory(admin, name, 1)
    gp = _holder(inv, "guard_point")
    assert (gp["count"], gp["unreadable"], gp["state"]) == (0, 1, "clear")
    assert inv["in_use"] is False and inv["retirement"]["state"] == "complete"
    (statement,) = _records(services, key["id"], RETIRED_ACTION)
    public, fingerprint = _audit_key(admin)
    assert statement_problem(statement.details, public, fingerprint) is None
    st = statement.details["statement"]
    assert st["unreadable"] == [{"holder": f"{gp_id}@{host.id}", "host": "unread.example.com", "path": "/srv/mixed",
                                 "files": 1, "state": "clear", "scanned_at": walked.isoformat()}]
    forged = {**statement.details, "statement": {**st, "unreadable": []}}
    assert statement_problem(forged, public, fingerprint) == "the statement's signature does not verify"
