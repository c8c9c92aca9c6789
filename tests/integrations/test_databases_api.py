"""Database identities over REST: create, token re-issue, revoke, grants and their
refusals, the KV-v2 front's answers, the key's consumers, and the audit of each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from keyserver.services import Services
from tests.conftest import Actor, unique


def _db(admin: httpx.Client, **extra: Any) -> dict[str, Any]:
    r = admin.post("/api/v1/databases", json={"name": unique("db"), **extra})
    assert r.status_code == 201, r.text
    return dict(r.json())


def _key(admin: httpx.Client, **extra: Any) -> dict[str, Any]:
    r = admin.post("/api/v1/keys", json={"name": unique("tde"), **extra})
    assert r.status_code == 201, r.text
    return dict(r.json())


def _hmac_key(services: Services) -> str:
    from keyserver.core.keys import KeySpec
    from keyserver.core.principal import system_context

    return services.keys.create(system_context("tests"), KeySpec(name=unique("hmac"), algorithm="HMAC-SHA256")).name


def _kv(base_url: str, tls: Any, token: str | None) -> httpx.Client:
    headers = {"X-Vault-Token": token} if token is not None else {}
    return httpx.Client(base_url=base_url, headers=headers, verify=tls, timeout=30)


def _events(services: Services, admin: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    services.audit.flush()
    r = admin.get("/api/v1/audit/events", params={"limit": 100, **params})
    assert r.status_code == 200, r.text
    return list(r.json()["items"])


def test_create_returns_token_url_and_config_once(admin: httpx.Client, services: Services) -> None:
    out = _db(admin, description="orders")
    db = out["database"]
    assert db["kind"] == "mariadb" and db["description"] == "orders" and db["grants"] == []
    assert db["revoked_at"] is None and db["last_seen_at"] is None
    assert out["token"].startswith("srdb_")
    assert out["vault_url"] == f"{services.settings.url}/v1/strongroom"
    assert f"hashicorp-key-management-token = {out['token']}" in out["config"]
    assert f"hashicorp-key-management-vault-url = {out['vault_url']}" in out["config"]
    got = admin.get(f"/api/v1/databases/{db['name']}").json()
    assert "token" not in got and got["id"] == db["id"]
    listed = admin.get("/api/v1/databases").json()
    assert db["name"] in {d["name"] for d in listed["items"]} and listed["total"] >= 1
    events = _events(services, admin, action="database.create")
    assert any(e["object_id"] == db["name"] for e in events)
    assert all(out["token"] not in str(e) for e in events)


@pytest.mark.parametrize(("body", "code"), [
    ({"name": "Upper"}, "invalid_database_name"),
    ({"name": "-dash"}, "invalid_database_name"),
    ({"name": "a b"}, "invalid_database_name"),
])
def test_create_validation(admin: httpx.Client, body: dict[str, Any], code: str) -> None:
    r = admin.post("/api/v1/databases", json=body)
    assert r.status_code == 400 and r.json()["code"] == code, r.text


def test_create_refuses_unknown_kind_and_duplicates(admin: httpx.Client) -> None:
    assert admin.post("/api/v1/databases", json={"name": unique("db"), "kind": "oracle"}).status_code == 422
    name = _db(admin)["database"]["name"]
    r = admin.post("/api/v1/databases", json={"name": name})
    assert r.status_code == 409 and r.json()["code"] == "database_exists"
    assert admin.get("/api/v1/databases/nope-none").json()["code"] == "database_not_found"


def test_grant_read_rotate_and_versions(admin: httpx.Client, services: Services, base_url: str, tls: Any) -> None:
    out = _db(admin)
    name, token = out["database"]["name"], out["token"]
    key = _key(admin)
    r = admin.post(f"/api/v1/databases/{name}/grants", json={"key": key["name"], "key_id": 1})
    assert r.status_code == 201, r.text
    assert r.json()["key_id"] == 1 and r.json()["key_name"] == key["name"] and r.json()["key_uuid"] == key["id"]
    with _kv(base_url, tls, token) as kv:
        tune = kv.get("/v1/sys/mounts/strongroom/tune")
        assert tune.status_code == 200 and tune.json()["options"]["version"] == "2"
        first = kv.get("/v1/strongroom/data/1")
        assert first.status_code == 200, first.text
        assert first.headers["cache-control"] == "no-store"
        body = first.json()["data"]
        assert body["metadata"]["version"] == 1 and body["metadata"]["destroyed"] is False
        v1 = bytes.fromhex(body["data"]["data"])
        assert len(v1) == 32
        assert admin.post(f"/api/v1/keys/{key['name']}/rotate").status_code == 200
        latest = kv.get("/v1/strongroom/data/1").json()["data"]
        assert latest["metadata"]["version"] == 2
        assert bytes.fromhex(latest["data"]["data"]) != v1
        # The old version stays readable (Deactivated: process, not protect).
        again = kv.get("/v1/strongroom/data/1", params={"version": 1}).json()["data"]
        assert bytes.fromhex(again["data"]["data"]) == v1
        assert kv.get("/v1/strongroom/data/1", params={"version": 0}).json()["data"]["metadata"]["version"] == 2
        missing = kv.get("/v1/strongroom/data/1", params={"version": 9})
        assert missing.status_code == 404 and missing.json() == {"errors": []}
        ungranted = kv.get("/v1/strongroom/data/2")
        assert ungranted.status_code == 403 and ungranted.json() == {"errors": ["permission denied"]}
        assert kv.get("/v1/strongroom/data/0").status_code == 404
        assert kv.get("/v1/strongroom/data/abc").status_code == 404
        assert kv.get("/v1/strongroom/data/1", params={"version": "x"}).status_code == 400
    got = admin.get(f"/api/v1/databases/{name}").json()
    assert got["last_seen_at"] is not None
    assert got["grants"][0]["last_read_version"] == 2 and got["grants"][0]["last_read_at"] is not None
    reads = _events(services, admin, action="database.key_read", actor=f"database:{name}")
    allowed = [e for e in reads if e["outcome"] == "allowed"]
    assert {e["details"]["version"] for e in allowed} == {1, 2}
    assert all(e["object_id"] == key["id"] and e["details"]["key"] == key["name"] for e in allowed)
    denied = [e for e in reads if e["outcome"] == "denied"]
    assert {e["details"]["reason"] for e in denied} == {"no_such_version", "no_grant"}
    hexes = {v1.hex()}
    assert not any(h in str(e) for e in reads for h in hexes), "no key bytes in the audit"


def test_revoked_key_refuses_latest_and_old_versions(admin: httpx.Client, services: Services, base_url: str,
                                                      tls: Any) -> None:
    out = _db(admin)
    name, token = out["database"]["name"], out["token"]
    key = _key(admin)
    assert admin.post(f"/api/v1/databases/{name}/grants", json={"key": key["id"], "key_id": 7}).status_code == 201
    assert admin.post(f"/api/v1/keys/{key['name']}/rotate").status_code == 200
    assert admin.post(f"/api/v1/keys/{key['name']}/revoke", json={"reason": "superseded"}).status_code \
        == 200
    with _kv(base_url, tls, token) as kv:
        for params in ({}, {"version": 1}, {"version": 2}):
            r = kv.get("/v1/strongroom/data/7", params=params)
            assert r.status_code == 403 and r.json() == {"errors": ["permission denied"]}, (params, r.text)
    denied = _events(services, admin, action="database.key_read", actor=f"database:{name}", outcome="denied")
    assert {e["details"]["reason"] for e in denied} == {"key_revoked"}
    # Destroyed versions are not found.
    assert admin.post(f"/api/v1/keys/{key['name']}/destroy", json={"version": 1}).status_code == 200
    with _kv(base_url, tls, token) as kv:
        assert kv.get("/v1/strongroom/data/7", params={"version": 1}).status_code == 404


def test_token_reissue_stops_the_old_one(admin: httpx.Client, services: Services, base_url: str,
                                         tls: Any) -> None:
    out = _db(admin)
    name, old = out["database"]["name"], out["token"]
    key = _key(admin)
    assert admin.post(f"/api/v1/databases/{name}/grants", json={"key": key["name"], "key_id": 1}).status_code == 201
    r = admin.post(f"/api/v1/databases/{name}/token")
    assert r.status_code == 200, r.text
    new = r.json()["token"]
    assert new != old and r.json()["config"].count(new) == 1
    with _kv(base_url, tls, old) as kv:
        assert kv.get("/v1/strongroom/data/1").status_code == 403
        assert kv.get("/v1/sys/mounts/strongroom/tune").status_code == 403
    with _kv(base_url, tls, new) as kv:
        assert kv.get("/v1/strongroom/data/1").status_code == 200
    with _kv(base_url, tls, None) as kv:
        assert kv.get("/v1/strongroom/data/1").json() == {"errors": ["permission denied"]}
    refused = _events(services, admin, action="database.authenticate", outcome="denied")
    assert refused and all(old not in str(e) for e in refused)
    assert any(e["object_id"] == name for e in _events(services, admin, action="database.token"))


def test_revoked_database_is_refused(admin: httpx.Client, services: Services, base_url: str, tls: Any) -> None:
    out = _db(admin)
    name, token = out["database"]["name"], out["token"]
    key = _key(admin)
    assert admin.post(f"/api/v1/databases/{name}/grants", json={"key": key["name"], "key_id": 1}).status_code == 201
    r = admin.post(f"/api/v1/databases/{name}/revoke")
    assert r.status_code == 200 and r.json()["revoked_at"] is not None
    with _kv(base_url, tls, token) as kv:
        assert kv.get("/v1/strongroom/data/1").status_code == 403
    denied = _events(services, admin, action="database.authenticate", actor=f"database:{name}")
    assert denied and denied[0]["details"] == {"code": "database_revoked"}
    r = admin.post(f"/api/v1/databases/{name}/grants", json={"key": key["name"], "key_id": 2})
    assert r.status_code == 409 and r.json()["code"] == "database_revoked"
    assert admin.post(f"/api/v1/databases/{name}/token").json()["code"] == "database_revoked"


def test_grant_refusals(admin: httpx.Client, services: Services) -> None:
    name = _db(admin)["database"]["name"]
    key = _key(admin)
    grants = f"/api/v1/databases/{name}/grants"
    assert admin.post(grants, json={"key": key["name"], "key_id": 1}).status_code == 201
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"key": _key(admin)["name"], "key_id": 1}, 409, "key_id_in_use"),
        ({"key": _hmac_key(services), "key_id": 2}, 409, "wrong_key_algorithm"),
        ({"key": _key(admin, exportable=False)["name"], "key_id": 2}, 409, "key_not_exportable"),
        ({"key": _key(admin, activate=False)["name"], "key_id": 2}, 409, "key_not_active"),
        ({"key": "no-such-key-here", "key_id": 2}, 404, "key_not_found"),
    ]
    revoked = _key(admin)
    assert admin.post(f"/api/v1/keys/{revoked['name']}/revoke", json={"reason": "superseded"}).status_code == 200
    cases.append(({"key": revoked["name"], "key_id": 2}, 409, "key_not_active"))
    destroyed = _key(admin)
    admin.post(f"/api/v1/keys/{destroyed['name']}/revoke", json={"reason": "superseded"})
    assert admin.post(f"/api/v1/keys/{destroyed['name']}/destroy", json={}).status_code == 200
    cases.append(({"key": destroyed["id"], "key_id": 2}, 409, "key_destroyed"))
    for body, status, code in cases:
        r = admin.post(grants, json=body)
        assert r.status_code == status and r.json()["code"] == code, (body, r.text)
    for bad in (0, 2**32, -1):
        assert admin.post(grants, json={"key": key["name"], "key_id": bad}).status_code == 422
    assert admin.delete(f"{grants}/1").status_code == 204
    assert admin.delete(f"{grants}/1").json()["code"] == "grant_not_found"
    assert admin.post(grants, json={"key": key["name"], "key_id": 4294967295}).status_code == 201
    actions = {e["action"] for e in _events(services, admin, object_id=name)}
    assert {"database.create", "database.grant", "database.ungrant"} <= actions


def test_consumers_lists_databases_and_kmip_clients(admin: httpx.Client, services: Services) -> None:
    from keyserver.core.principal import Principal, RequestContext

    key = _key(admin)
    name = _db(admin)["database"]["name"]
    assert admin.post(f"/api/v1/databases/{name}/grants", json={"key": key["name"], "key_id": 3}).status_code == 201
    # A KMIP client's use of the key, recorded as the KMIP server records it.
    client = unique("kc")
    ctx = RequestContext(Principal(name=f"kmip:{client}", actor_type="host", role="kmip-client",
                                   permissions=frozenset()))
    services.audit.record_now(ctx, action="key.export", outcome="allowed", object_type="key", object_id=key["id"],
                              details={"version": 1})
    services.audit.flush()
    r = admin.get(f"/api/v1/keys/{key['name']}/consumers")
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    assert {"kind": "database", "name": name, "detail": "key id 3", "last_used_at": None} in items
    kmip = [i for i in items if i["kind"] == "kmip-client"]
    assert [i["name"] for i in kmip] == [client] and kmip[0]["last_used_at"] is not None
    assert admin.get("/api/v1/keys/no-such-key-here/consumers").json()["code"] == "key_not_found"


@pytest.mark.parametrize("role", ["admin", "key-officer", "operator", "auditor"])
def test_roles(role: str, actors: dict[str, Actor]) -> None:
    """Who may: managers (admin, key-officer) change; the auditor reads; the operator neither."""
    actor = actors[role]
    listed = actor.client.get("/api/v1/databases")
    assert listed.status_code == (403 if role == "operator" else 200)
    created = actor.session.post("/api/v1/databases", json={"name": unique("db")})
    assert created.status_code == (201 if role in ("admin", "key-officer") else 403), created.text
    if created.status_code == 403:
        assert created.json()["code"] == "forbidden"


def test_user_credentials_do_not_read_keys(actors: dict[str, Actor]) -> None:
    """The KV front takes database tokens only: an API token or a session is refused."""
    admin = actors["admin"]
    token = admin.client.headers["Authorization"].removeprefix("Bearer ")
    r = admin.client.get("/v1/strongroom/data/1", headers={"X-Vault-Token": token})
    assert r.status_code == 403 and r.json() == {"errors": ["permission denied"]}
    assert admin.session.get("/v1/strongroom/data/1").status_code == 403
    assert admin.session.get("/v1/sys/mounts/strongroom/tune").status_code == 403


def test_a_grant_waits_for_approval_under_the_two_person_rule(services: Services, hsm_backend: Any,
                                                              tmp_path: Path) -> None:
    """`database.grant` held like `key.export`: the grant is made, as its requester, once
    another key officer approves."""
    from keyserver.core.approvals import ApprovalPending
    from keyserver.core.keys import KeySpec
    from keyserver.core.principal import RequestContext, system_context
    from tests.conftest import own_services

    password = "a long enough passphrase 1"
    with own_services(tmp_path / "data", hsm_backend, approvals={"database.grant": 1}) as held:
        def person() -> RequestContext:
            name = unique("officer")
            held.identity.create_user(system_context("tests"), username=name, role="key-officer", password=password)
            return RequestContext(held.identity.login(name, password, source_ip=None, request_id=None).principal)

        alice, bob = person(), person()
        key = held.keys.create(alice, KeySpec(name=unique("held")))
        name = held.databases.create(alice, name=unique("held-db")).database.name
        with pytest.raises(ApprovalPending) as pending:
            held.databases.grant(alice, name, key=key.name, key_id=1)
        assert held.databases.get(alice, name).grants == ()
        decision = held.approvals.approve(bob, pending.value.request.id)
        assert decision.executed
        grants = held.databases.get(alice, name).grants
        assert [(g.key_id, g.key_name, g.granted_by) for g in grants] == [(1, key.name, alice.principal.name)]
