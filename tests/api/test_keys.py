"""Managed key lifecycle through the REST API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import select, update

from keyserver.core.principal import system_context
from keyserver.services import Services, build_services
from keyserver.settings import Settings
from keyserver.store.models import KeyVersion, ManagedKey
from tests.conftest import unique


def states(key: dict[str, Any]) -> list[str]:
    return [v["state"] for v in key["versions"]]


def test_create_and_read(admin: httpx.Client) -> None:
    name = unique("orders")
    r = admin.post("/api/v1/keys", json={"name": name, "description": "orders DB",
                                         "tags": {"team": "payments"}, "rotation_period_days": 30})
    assert r.status_code == 201, r.text
    key = r.json()
    assert key["name"] == name and key["state"] == "active" and key["current_version"] == 1
    assert key["algorithm"] == "AES" and key["length_bits"] == 256
    assert key["versions"][0]["wrapping_mechanism"].startswith("RSA-OAEP")
    assert key["next_rotation_at"] is not None
    assert "wrapped_key" not in key["versions"][0]
    by_id = admin.get(f"/api/v1/keys/{key['id']}").json()
    by_name = admin.get(f"/api/v1/keys/{name}").json()
    assert by_id == by_name


@pytest.mark.parametrize("body,status", [
    ({"name": ""}, 422),
    ({"name": " "}, 400),
    ({"name": "tab\there"}, 400),
    ({"name": "zero\u200bwidth"}, 400),
    ({"name": "caf\u00e9"}, 400),
    ({"name": "0b6f0a4e-35f5-4a3c-9a29-5f1c3b0e8d11"}, 400),
    ({"name": "ok", "unknown_field": 1}, 422),
    ({"name": "ok", "rotation_period_days": 0}, 422),
    ({"name": "ok", "tags": {"a": 1}}, 422),
    ({"name": 12}, 422),
])
def test_create_rejects_bad_input(admin: httpx.Client, body: dict[str, Any], status: int) -> None:
    r = admin.post("/api/v1/keys", json=body)
    assert r.status_code == status, r.text
    problem = r.json()
    assert r.headers["content-type"].startswith("application/problem+json")
    assert problem["status"] == status and problem["detail"] and problem["request_id"]


def test_duplicate_name_conflicts(admin: httpx.Client, new_key: dict[str, Any]) -> None:
    r = admin.post("/api/v1/keys", json={"name": new_key["name"]})
    assert r.status_code == 409 and r.json()["code"] == "key_exists"


def test_unknown_key_is_404(admin: httpx.Client) -> None:
    for ref in ("no-such-key", "0b6f0a4e-35f5-4a3c-9a29-5f1c3b0e8d11"):
        r = admin.get(f"/api/v1/keys/{ref}")
        assert r.status_code == 404 and r.json()["code"] == "key_not_found"
    assert admin.post("/api/v1/keys/no-such-key/rotate").status_code == 404


def test_rotate_makes_new_active_version(admin: httpx.Client, new_key: dict[str, Any]) -> None:
    r = admin.post(f"/api/v1/keys/{new_key['name']}/rotate")
    assert r.status_code == 200
    key = r.json()
    assert key["current_version"] == 2 and states(key) == ["deactivated", "active"]
    v1, v2 = key["versions"]
    assert v1["replaced_by"] == 2 and v2["replaces"] == 1
    assert v1["deactivation_date"] is not None


def test_lifecycle_transitions(admin: httpx.Client) -> None:
    name = unique("life")
    key = admin.post("/api/v1/keys", json={"name": name, "activate": False}).json()
    assert states(key) == ["pre-active"]
    assert admin.post(f"/api/v1/keys/{name}/rotate").status_code == 409
    assert states(admin.post(f"/api/v1/keys/{name}/activate").json()) == ["active"]
    assert admin.post(f"/api/v1/keys/{name}/activate").json()["code"] == "illegal_state"
    # KMIP: an Active key must be revoked/deactivated before it can be destroyed.
    r = admin.post(f"/api/v1/keys/{name}/destroy", json={})
    assert r.status_code == 409 and "revoke or deactivate" in r.json()["detail"]
    assert states(admin.post(f"/api/v1/keys/{name}/deactivate").json()) == ["deactivated"]
    destroyed = admin.post(f"/api/v1/keys/{name}/destroy", json={}).json()
    assert states(destroyed) == ["destroyed"]
    assert destroyed["versions"][0]["destroy_date"] is not None
    r = admin.post(f"/api/v1/keys/{name}/rotate")
    assert r.status_code == 409 and "destroyed" in r.json()["detail"]
    assert admin.post(f"/api/v1/keys/{name}/destroy", json={}).status_code == 409
    # Compromise after destruction is still recordable (KMIP Destroyed -> Destroyed-Compromised).
    r = admin.post(f"/api/v1/keys/{name}/revoke", json={"reason": "key-compromise"})
    assert states(r.json()) == ["destroyed-compromised"]


def test_destroy_erases_material_keeps_metadata(admin: httpx.Client, services: Services,
                                                new_key: dict[str, Any]) -> None:
    name = new_key["name"]
    admin.post(f"/api/v1/keys/{name}/rotate")
    admin.post(f"/api/v1/keys/{name}/revoke", json={"reason": "cessation-of-operation"})
    r = admin.post(f"/api/v1/keys/{name}/destroy", json={"version": 1})
    assert states(r.json()) == ["destroyed", "deactivated"]
    with services.db() as s:
        rows = {v.version: v for v in s.execute(select(KeyVersion).join(ManagedKey)
                                                 .where(ManagedKey.name == name)).scalars()}
    assert rows[1].wrapped_key is None and rows[2].wrapped_key is not None
    assert admin.post(f"/api/v1/keys/{name}/destroy", json={"version": 9}).status_code == 404


def test_compromise_then_destroy(admin: httpx.Client, new_key: dict[str, Any]) -> None:
    name = new_key["name"]
    r = admin.post(f"/api/v1/keys/{name}/revoke", json={"reason": "key-compromise", "message": "laptop lost"})
    v = r.json()["versions"][0]
    assert v["state"] == "compromised" and v["revocation_message"] == "laptop lost"
    assert v["compromise_date"] is not None
    assert states(admin.post(f"/api/v1/keys/{name}/destroy", json={}).json()) == ["destroyed-compromised"]


def test_revoke_rejects_unknown_reason(admin: httpx.Client, new_key: dict[str, Any]) -> None:
    r = admin.post(f"/api/v1/keys/{new_key['name']}/revoke", json={"reason": "bored"})
    assert r.status_code == 422


def test_update_metadata_and_schedule(admin: httpx.Client, new_key: dict[str, Any]) -> None:
    name = new_key["name"]
    r = admin.patch(f"/api/v1/keys/{name}", json={"description": "new", "tags": {"tier": "gold"},
                                                  "rotation_period_days": 7})
    key = r.json()
    assert key["description"] == "new" and key["tags"] == {"tier": "gold"}
    assert key["rotation_period_days"] == 7 and key["next_rotation_at"] is not None
    key = admin.patch(f"/api/v1/keys/{name}", json={"clear_rotation": True}).json()
    assert key["rotation_period_days"] is None and key["next_rotation_at"] is None


def test_a_destroyed_key_takes_no_rotation_schedule(admin: httpx.Client, services: Services) -> None:
    """It is never rotated again: a schedule would promise a rotation that cannot happen
    (the console offered one, "next rotation tomorrow"). Refused and audited."""
    name = unique("gone")
    key = admin.post("/api/v1/keys", json={"name": name}).json()
    admin.post(f"/api/v1/keys/{name}/deactivate")
    assert admin.post(f"/api/v1/keys/{name}/destroy", json={}).status_code == 200
    r = admin.patch(f"/api/v1/keys/{name}", json={"rotation_period_days": 30})
    assert r.status_code == 409 and r.json()["code"] == "illegal_state", r.text
    assert "never rotated again" in r.json()["detail"]
    after = admin.get(f"/api/v1/keys/{name}").json()
    assert after["rotation_period_days"] is None and after["next_rotation_at"] is None
    services.audit.flush()
    refused = admin.get("/api/v1/audit/events", params={"object_id": key["id"], "outcome": "error"}).json()
    assert [e["action"] for e in refused["items"]] == ["key.update"]
    # Metadata can still be corrected on a destroyed key.
    assert admin.patch(f"/api/v1/keys/{name}", json={"description": "shredded 2026"}).status_code == 200


def test_list_filters_and_pages(admin: httpx.Client) -> None:
    marker = unique("flt")
    for i in range(5):
        admin.post("/api/v1/keys", json={"name": f"{marker}-{i}", "tags": {"batch": marker},
                                         "activate": i % 2 == 0})
    page = admin.get("/api/v1/keys", params={"q": marker, "limit": 2}).json()
    assert page["total"] == 5 and len(page["items"]) == 2
    page2 = admin.get("/api/v1/keys", params={"q": marker, "limit": 2, "offset": 2}).json()
    assert {k["name"] for k in page["items"]}.isdisjoint({k["name"] for k in page2["items"]})
    pre = admin.get("/api/v1/keys", params={"q": marker, "state": "pre-active"}).json()
    assert pre["total"] == 2 and all(k["state"] == "pre-active" for k in pre["items"])
    tagged = admin.get("/api/v1/keys", params={"tag": f"batch={marker}"}).json()
    assert tagged["total"] == 5
    assert admin.get("/api/v1/keys", params={"state": "sleepy"}).status_code == 400
    assert admin.get("/api/v1/keys", params={"limit": 0}).status_code == 422


def test_list_sorts_on_the_server_and_pages_stay_disjoint(admin: httpx.Client) -> None:
    marker = unique("srt")
    for i, (owner, period) in enumerate([("carol", 30), ("alice", None), ("bob", 7), ("alice", 90)]):
        body: dict[str, object] = {"name": f"{marker}-{i}", "owner": owner}
        if period:
            body["rotation_period_days"] = period
        assert admin.post("/api/v1/keys", json=body).status_code == 201

    def names(sort: str, **extra: object) -> list[str]:
        r = admin.get("/api/v1/keys", params={"q": marker, "sort": sort, **extra})
        assert r.status_code == 200, r.text
        return [k["name"] for k in r.json()["items"]]

    assert names("name") == [f"{marker}-{i}" for i in range(4)]
    assert names("-name") == [f"{marker}-{i}" for i in reversed(range(4))]
    assert names("owner") == [f"{marker}-1", f"{marker}-3", f"{marker}-2", f"{marker}-0"]  # ties by name
    # Soonest rotation first; a key with none scheduled last, in either direction.
    assert names("next_rotation_at") == [f"{marker}-2", f"{marker}-0", f"{marker}-3", f"{marker}-1"]
    assert names("-next_rotation_at") == [f"{marker}-3", f"{marker}-0", f"{marker}-2", f"{marker}-1"]
    assert names("-created_at", limit=2) + names("-created_at", limit=2, offset=2) == names("-created_at")
    r = admin.get("/api/v1/keys", params={"sort": "secret_material"})
    assert r.status_code == 400 and "sort by one of name, owner" in r.json()["detail"]


def _make_due(services: Services, name: str) -> None:
    with services.db.begin() as s:
        s.execute(update(ManagedKey).where(ManagedKey.name == name)
                  .values(next_rotation_at=datetime.now(UTC) - timedelta(minutes=1)))


def test_scheduled_rotation_survives_restart(admin: httpx.Client, services: Services,
                                             settings: Settings) -> None:
    name = unique("sched")
    admin.post("/api/v1/keys", json={"name": name, "rotation_period_days": 1})
    _make_due(services, name)
    # A second, freshly built set of services (a restarted or another replica) finds
    # the due rotation in the database alone.
    other = build_services(settings, hsm=services.hsm, migrate=False)
    try:
        counts = other.scheduler.run_once()
    finally:
        other.scheduler.stop()
        other.engine.dispose()
    assert counts["rotated"] >= 1
    key = admin.get(f"/api/v1/keys/{name}").json()
    assert key["current_version"] == 2
    assert datetime.fromisoformat(key["next_rotation_at"]) > datetime.now(UTC) + timedelta(hours=23)
    services.audit.flush()
    events = admin.get("/api/v1/audit/events", params={"object_id": key["id"], "action": "key.rotate"}).json()
    assert events["items"][0]["actor"] == "scheduler"
    assert events["items"][0]["details"]["reason"] == "scheduled"


def test_activation_and_deactivation_dates(admin: httpx.Client, services: Services) -> None:
    name = unique("dated")
    soon = datetime.now(UTC) + timedelta(seconds=1)
    later = soon + timedelta(seconds=1)
    key = admin.post("/api/v1/keys", json={"name": name, "activation_date": soon.isoformat(),
                                           "deactivation_date": later.isoformat()}).json()
    assert key["state"] == "pre-active"
    frozen = later + timedelta(seconds=1)
    services.keys._now = lambda: frozen  # the scheduler runs "later"
    try:
        services.keys.run_due(system_context("scheduler"))  # activates (date passed)
        services.keys.run_due(system_context("scheduler"))  # deactivates
    finally:
        from keyserver.core.audit import utcnow
        services.keys._now = utcnow
    assert admin.get(f"/api/v1/keys/{name}").json()["state"] == "deactivated"


def test_concurrent_rotations_do_not_collide(admin: httpx.Client, new_key: dict[str, Any]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    name = new_key["name"]
    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: admin.post(f"/api/v1/keys/{name}/rotate").status_code, range(8)))
    assert codes == [200] * 8
    key = admin.get(f"/api/v1/keys/{name}").json()
    assert [v["version"] for v in key["versions"]] == list(range(1, 10))
    assert states(key).count("active") == 1 and key["versions"][-1]["state"] == "active"
