"""The audit log says what it promised and reads in names: the operator's revocation
message, each object's name beside its id, whole paths, and a revoked host's refusals
under the host's own name (docs/audit.md "Fields")."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.keyclient.client import ServerRefused
from keyserver.services import Services
from tests.agents.test_agent_port import enroll_host
from tests.conftest import Actor, unique


def _records(services: Services, client: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    services.audit.flush()
    r = client.get("/api/v1/audit/events", params={"limit": 100, **params})
    assert r.status_code == 200, r.text
    return list(r.json()["items"])


def test_a_revocation_records_the_operators_message(admin: httpx.Client, services: Services) -> None:
    key = admin.post("/api/v1/keys", json={"name": unique("revoked")}).json()
    message = "laptop with the export stolen on 2026-11-25; ticket SEC-4411"
    r = admin.post(f"/api/v1/keys/{key['id']}/revoke", json={"reason": "key-compromise", "message": message})
    assert r.status_code == 200, r.text
    revoke = _records(services, admin, object_id=key["id"], action="key.revoke")
    assert len(revoke) == 1
    assert revoke[0]["details"]["message"] == message and revoke[0]["details"]["reason"] == "key-compromise"
    # The message is part of the record: found by a search, as every detail is.
    assert [e["seq"] for e in _records(services, admin, q="SEC-4411")] == [revoke[0]["seq"]]


def test_records_name_their_objects(admin: httpx.Client, actors: dict[str, Actor], services: Services) -> None:
    key = admin.post("/api/v1/keys", json={"name": unique("named")}).json()
    assert admin.post(f"/api/v1/keys/{key['id']}/rotate").status_code == 200
    rows = _records(services, admin, object_id=key["id"])
    assert [e["action"] for e in rows] == ["key.rotate", "key.create"]
    # The rotation's details hold no name: the chainer looked it up.
    assert all(e["object_name"] == key["name"] == e["details"]["object_name"] for e in rows)
    one = admin.get(f"/api/v1/audit/events/{rows[0]['seq']}").json()
    assert one["object_name"] == key["name"] and one["object_id"] == key["id"]
    # An API token, recorded by id, reads as its name.
    token = actors["auditor"].session.post("/api/v1/tokens", json={"name": unique("ci-token")})
    assert token.status_code == 201, token.text
    tok = token.json()["token"]
    made = _records(services, admin, object_id=tok["id"], action="token.create")
    assert len(made) == 1 and made[0]["object_name"] == tok["name"]
    # And a search by the name finds the records that hold only the id.
    assert {e["seq"] for e in rows} <= {e["seq"] for e in _records(services, admin, q=key["name"])}

def test_a_guard_point_path_is_recorded_whole(admin: httpx.Client, actors: dict[str, Actor],
                                               services: Services) -> None:
    """A path longer than the old 200-character cut, refused and then made: the record
    holds all of it, and is found by it."""
    path = "/srv/" + "/".join(f"{unique('d')}-{'x' * 40}" for _ in range(8))
    assert len(path) > 300
    key = admin.post("/api/v1/keys", json={"name": unique("gp")}).json()
    spec = {"host_group": unique("grp"), "path": path, "key": key["name"]}
    refused = actors["auditor"].client.post("/api/v1/guard-points", json=spec)
    assert refused.status_code == 403, refused.text
    denied = _records(services, admin, object_id=path, outcome="denied")
    assert len(denied) == 1 and denied[0]["object_id"] == path and denied[0]["action"] == "guard_point.create"
    made = admin.post("/api/v1/guard-points", json=spec)
    assert made.status_code == 201, made.text
    created = _records(services, admin, object_id=made.json()["id"])
    assert created and created[0]["object_name"] == path


def test_a_revoked_hosts_refusals_name_the_host(tmp_path: Path, base_url: str, agent_url: str,
                                                admin: httpx.Client, services: Services) -> None:
    name = unique("web")
    host = enroll_host(tmp_path, base_url, agent_url, admin, name=name)
    # An agent's event about a path longer than any B-tree entry: chained whole (it
    # stopped the chainer on PostgreSQL while object ids were cut at 200 characters).
    deep = "/data/" + "/".join(unique("p") * 20 for _ in range(18))
    assert 3000 < len(deep) <= 4096
    host.client.send_events([{"event": "access.denied", "time": time.time(), "path": deep, "uid": 1000}])
    event = _records(services, admin, object_id=deep)
    assert len(event) == 1 and event[0]["actor"] == f"host:{name}.example.com"
    # A copy kept outside (the record as the API lists it) is compared whole, too.
    copy = [{"type": "record", **{k: v for k, v in event[0].items() if k != "object_name"}}]
    verified = admin.post("/api/v1/audit/verify", json={"outside": copy})
    assert verified.status_code == 200, verified.text
    assert verified.json()["ok"] and verified.json()["outside_records"] == 1
    assert admin.post(f"/api/v1/hosts/{host.id}/revoke").status_code == 200
    with pytest.raises(ServerRefused) as refused:
        host.client.heartbeat(os_name="Linux test")
    assert refused.value.code == "host_revoked"
    rows = _records(services, admin, object_id=host.id, action="host.authenticate")
    assert rows and rows[0]["outcome"] == "denied" and rows[0]["details"]["reason"] == "revoked"
    assert (rows[0]["actor"], rows[0]["actor_type"]) == (f"host:{name}.example.com", "host")
    assert rows[0]["object_name"] == f"{name}.example.com"
    # Who keeps knocking is found by the host's name, not lost among "anonymous".
    by_host = _records(services, admin, actor=f"host:{name}.example.com", outcome="denied")
    assert {e["action"] for e in by_host} >= {"host.authenticate"}
