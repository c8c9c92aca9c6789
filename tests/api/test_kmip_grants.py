"""KMIP tenancy over REST (docs/api.md "KMIP tenancy"): a client's group, the groups
listed, grants validated precisely (404 naming what to do, 409 naming the grant, 422),
export granted only by whoever may export, and every change audited."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from keyserver.services import Services
from tests import https
from tests.conftest import Actor, unique


def _client(admin: httpx.Client, **body: Any) -> dict[str, Any]:
    r = admin.post("/api/v1/kmip/clients", json={"name": unique("tc"), "role": "kmip-client", **body})
    assert r.status_code == 201, r.text
    return dict(r.json()["client"])


def _key(admin: httpx.Client, **body: Any) -> dict[str, Any]:
    r = admin.post("/api/v1/keys", json={"name": unique("tk"), **body})
    assert r.status_code == 201, r.text
    return dict(r.json())


def _events(admin: httpx.Client, services: Services, **params: Any) -> list[dict[str, Any]]:
    services.audit.flush()
    return list(admin.get("/api/v1/audit/events", params={"limit": 20, **params}).json()["items"])


def test_a_client_has_a_group_set_on_issue_and_changed_by_patch(actors: dict[str, Actor],
                                                                  services: Services) -> None:
    admin = actors["admin"].client
    plain = _client(admin)
    assert plain["group"] == plain["name"]
    grouped = _client(admin, group="vcenter.cluster-1")
    assert grouped["group"] == "vcenter.cluster-1"
    for bad in ("Upper", "-lead", "a" * 65, "sp ace", ""):
        r = admin.post("/api/v1/kmip/clients", json={"name": unique("tc"), "role": "kmip-client", "group": bad})
        assert r.status_code == 422, bad
    r = admin.patch(f"/api/v1/kmip/clients/{plain['id']}", json={})
    assert r.status_code == 422 and "key_export, group or both" in r.json()["detail"]
    r = admin.patch(f"/api/v1/kmip/clients/{plain['id']}", json={"group": "backup"})
    assert r.status_code == 200 and r.json()["group"] == "backup" and r.json()["key_export"] == "plaintext"
    [change] = _events(admin, services, action="kmip_client.update", object_id=plain["id"])
    assert change["details"]["group"] == "backup" and change["details"]["group_was"] == plain["name"]
    r = actors["key-officer"].client.patch(f"/api/v1/kmip/clients/{plain['id']}", json={"group": "other"})
    assert r.status_code == 403


def test_keys_take_a_kmip_group_on_create_and_patch(actors: dict[str, Actor], services: Services) -> None:
    admin = actors["admin"].client
    key = _key(admin, kmip_group="nas")
    assert key["kmip_group"] == "nas"
    assert admin.post("/api/v1/keys", json={"name": unique("tk"), "kmip_group": "NAS!"}).status_code == 422
    r = admin.patch(f"/api/v1/keys/{key['id']}", json={"description": "unchanged group"})
    assert r.status_code == 200 and r.json()["kmip_group"] == "nas"
    r = admin.patch(f"/api/v1/keys/{key['id']}", json={"kmip_group": None})
    assert r.status_code == 200 and r.json()["kmip_group"] is None
    [create] = _events(admin, services, action="key.create", object_id=key["id"])
    assert create["details"]["kmip_group"] == "nas"


def test_grants_are_validated_with_what_to_do(actors: dict[str, Actor], services: Services) -> None:
    admin = actors["admin"].client
    client = _client(admin)
    key = _key(admin, kmip_group=unique("owners"))
    grantee = f"client:{client['name']}"

    def post(**body: Any) -> httpx.Response:
        return admin.post("/api/v1/kmip/grants", json={"grantee": grantee, "rights": ["read"], **body})

    # 422: the shape
    assert post().status_code == 422  # no target
    assert post(key=key["name"], group="x").status_code == 422  # two targets
    assert post(key=key["name"], rights=[]).status_code == 422
    assert post(key=key["name"], rights=["read", "rotate"]).status_code == 422
    assert admin.post("/api/v1/kmip/grants", json={"grantee": "user:bob", "key": key["name"],
                                                   "rights": ["read"]}).status_code == 422
    # 404: what does not exist, and what to do
    r = admin.post("/api/v1/kmip/grants", json={"grantee": "client:nobody-here", "key": key["name"],
                                                "rights": ["read"]})
    assert r.status_code == 404 and r.json()["code"] == "kmip_client_not_found" and "issue it" in r.json()["detail"]
    r = admin.post("/api/v1/kmip/grants", json={"grantee": "group:no-such-group", "key": key["name"],
                                                "rights": ["read"]})
    assert r.status_code == 404 and r.json()["code"] == "kmip_group_not_found"
    r = post(key="no-such-key")
    assert r.status_code == 404 and r.json()["code"] == "key_not_found"
    r = post(group="no-such-group")
    assert r.status_code == 404 and "GET /api/v1/kmip/groups" in r.json()["detail"]
    r = post(object=str(uuid.uuid4()))
    assert r.status_code == 404 and r.json()["code"] == "object_not_found"
    version = key["id"]  # a key's id is no standalone object either
    assert post(object=version).status_code == 404
    # 201, then 409 naming the grant
    r = post(key=key["id"], rights=["use", "read", "read"])
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["rights"] == ["read", "use"] and made["target"] == key["id"] and made["target_name"] == key["name"]
    assert made["grantee"] == grantee and made["created_by"] == actors["admin"].username + "/token:tests"
    r = post(key=key["name"])
    assert r.status_code == 409 and made["id"] in r.json()["detail"]
    # listed, filtered
    assert [g["id"] for g in admin.get("/api/v1/kmip/grants", params={"grantee": grantee}).json()] == [made["id"]]
    assert [g["id"] for g in admin.get("/api/v1/kmip/grants", params={"key": key["name"]}).json()] == [made["id"]]
    assert admin.get("/api/v1/kmip/grants", params={"key": "no-such-key"}).json() == []
    # deleted once
    assert admin.delete(f"/api/v1/kmip/grants/{made['id']}").status_code == 204
    r = admin.delete(f"/api/v1/kmip/grants/{made['id']}")
    assert r.status_code == 404 and r.json()["code"] == "kmip_grant_not_found"
    assert admin.get("/api/v1/kmip/grants", params={"grantee": grantee}).json() == []

    created = _events(admin, services, action="kmip.grant.create", object_id=made["id"])
    assert [e["details"] for e in created] == [{"grantee": grantee, "target_kind": "key", "target": key["id"],
                                                "target_name": key["name"], "rights": ["read", "use"]}]
    [deleted] = _events(admin, services, action="kmip.grant.delete", object_id=made["id"])
    assert deleted["details"]["target_name"] == key["name"] and deleted["details"]["rights"] == ["read", "use"]


def test_export_is_granted_only_by_whoever_may_export(actors: dict[str, Actor], services: Services) -> None:
    admin = actors["admin"]
    client = _client(admin.client)
    key = _key(admin.client)
    r = admin.session.post("/api/v1/tokens", json={"name": "grants-only", "scopes": ["kmip:clients"]})
    assert r.status_code == 201, r.text
    with https.client(base_url=str(admin.client.base_url),
                      headers={"Authorization": f"Bearer {r.json()['secret']}"}) as narrow:
        body = {"grantee": f"client:{client['name']}", "key": key["id"]}
        r = narrow.post("/api/v1/kmip/grants", json={**body, "rights": ["read", "export"]})
        assert r.status_code == 403 and "keys:export" in r.json()["detail"]
        r = narrow.post("/api/v1/kmip/grants", json={**body, "rights": ["read", "use", "destroy"]})
        assert r.status_code == 201, r.text
    [refused] = [e for e in _events(admin.client, services, action="kmip.grant.create", outcome="denied")
                 if e["object_id"] == f"client:{client['name']}"]
    assert refused["details"] == {"missing_permission": "keys:export"}


def test_groups_list_clients_and_live_objects(actors: dict[str, Actor]) -> None:
    admin = actors["admin"].client
    group = unique("grp")
    first, second = _client(admin, group=group), _client(admin, group=group)
    _key(admin, kmip_group=group)
    only_keys = unique("keysonly")
    _key(admin, kmip_group=only_keys)
    listed = {g["name"]: g for g in admin.get("/api/v1/kmip/groups").json()}
    assert sorted(listed[group]["clients"]) == sorted([first["name"], second["name"]])
    assert listed[group]["objects"] == 1
    assert listed[only_keys] == {"name": only_keys, "clients": [], "objects": 1}
    assert actors["auditor"].client.get("/api/v1/kmip/groups").status_code == 200  # keys:read


def test_a_client_without_a_group_is_its_own_group(actors: dict[str, Actor], services: Services) -> None:
    """What a replica of the previous release issues during a rolling upgrade (no group
    column known to it, migration 0026): the client's group is its name."""
    from sqlalchemy import update

    from keyserver.store.models import KmipClient

    admin = actors["admin"].client
    client = _client(admin, group=unique("before"))
    with services.db() as s, s.begin():
        s.execute(update(KmipClient).where(KmipClient.id == uuid.UUID(client["id"])).values(group=None))
    [listed] = [c for c in admin.get("/api/v1/kmip/clients").json() if c["id"] == client["id"]]
    assert listed["group"] == client["name"]
    groups = {g["name"]: g for g in admin.get("/api/v1/kmip/groups").json()}
    assert groups[client["name"]]["clients"] == [client["name"]]
    r = admin.post("/api/v1/kmip/grants", json={"grantee": f"group:{client['name']}", "key": _key(admin)["id"],
                                                "rights": ["read"]})
    assert r.status_code == 201, r.text
