"""Guard-point policy on the server: definitions, validation, revisions, and what a host
sees of them (its guard points, their keys delivered to it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agents.test_agent_port import enroll_host
from tests.conftest import unique


def make(admin: httpx.Client, **body: Any) -> httpx.Response:
    return admin.post("/api/v1/guard-points", json=body)


@pytest.fixture
def key(admin: httpx.Client) -> str:
    r = admin.post("/api/v1/keys", json={"name": unique("gpkey")})
    assert r.status_code == 201
    return str(r.json()["name"])


def test_define_change_and_delete(admin: httpx.Client, key: str, services: Any) -> None:
    group = unique("g")
    rules = [{"effect": "permit", "users": ["postgres"], "executables": ["/usr/lib/postgresql/15/bin/postgres"]},
             {"effect": "deny", "access": "write", "audit": True}]
    r = make(admin, host_group=group, path="/srv/pg", key=key, rules=rules, default_effect="deny")
    assert r.status_code == 201, r.text
    gp = r.json()
    assert gp["backing_path"] == "/srv/.pg.strongroom" and gp["revision"] == 1 and gp["key_name"] == key
    assert gp["rules"][0]["users"] == ["postgres"] and gp["rules"][1]["access"] == "write"
    assert gp["mode"] == "enforce" and gp["chunk_size"] == 4096

    changed = admin.put(f"/api/v1/guard-points/{gp['id']}", json={
        "host_group": group, "path": "/srv/pg", "key": key, "mode": "learn", "rules": rules[:1]}).json()
    assert changed["revision"] == 2 and changed["mode"] == "learn" and len(changed["rules"]) == 1
    moved = admin.put(f"/api/v1/guard-points/{gp['id']}", json={"host_group": group, "path": "/srv/other", "key": key})
    assert moved.status_code == 409 and moved.json()["code"] == "guard_point_fixed"

    assert admin.delete(f"/api/v1/guard-points/{gp['id']}").status_code == 204
    assert admin.get(f"/api/v1/guard-points/{gp['id']}").status_code == 404
    services.audit.flush()
    actions = [e["action"] for e in admin.get("/api/v1/audit/events", params={
        "object_id": gp["id"], "limit": 10}).json()["items"]]
    assert sorted(actions) == ["guard_point.create", "guard_point.delete", "guard_point.update"]


def test_unprotect_only_in_mode_off(admin: httpx.Client, key: str, services: Any) -> None:
    group = unique("g")
    gp = make(admin, host_group=group, path="/srv/files", key=key).json()
    refused = admin.post(f"/api/v1/guard-points/{gp['id']}/unprotect")
    assert refused.status_code == 409 and refused.json()["code"] == "illegal_state"
    assert "set its mode to off first" in refused.json()["detail"]
    off = admin.put(f"/api/v1/guard-points/{gp['id']}", json={"host_group": group, "path": "/srv/files", "key": key,
                                                                "mode": "off"}).json()
    assert off["mode"] == "off" and off["revision"] == 2 and off["unprotect_generation"] == 0
    asked = admin.post(f"/api/v1/guard-points/{gp['id']}/unprotect")
    assert asked.status_code == 202
    assert asked.json()["unprotect_generation"] == 1 and asked.json()["revision"] == 3
    assert admin.post("/api/v1/guard-points/00000000-0000-0000-0000-000000000009/unprotect").status_code == 404
    services.audit.flush()
    events = admin.get("/api/v1/audit/events", params={"object_id": gp["id"], "limit": 10}).json()["items"]
    unprotect = [e for e in events if e["action"] == "guard_point.unprotect"]
    assert [e["outcome"] for e in unprotect] == ["allowed"] and unprotect[0]["details"]["generation"] == 1


@pytest.mark.parametrize("body,status,code", [
    ({"path": "srv/rel"}, 400, "invalid_input"),
    ({"path": "/srv/../etc"}, 400, "invalid_input"),
    ({"path": "/srv/x/"}, 400, "invalid_input"),
    ({"path": "/srv/x", "backing_path": "/srv/x/inner"}, 400, "invalid_input"),
    ({"path": "/srv/x", "host_id": "00000000-0000-0000-0000-000000000001"}, 400, "invalid_input"),  # two targets
    ({"path": "/srv/x", "chunk_size": 3000}, 400, "invalid_input"),
    ({"path": "/srv/x", "mode": "disabled"}, 422, "validation_error"),
    ({"path": "/srv/x", "rules": [{"effect": "maybe"}]}, 422, "validation_error"),
    ({"path": "/srv/x", "rules": [{"effect": "deny", "executables": ["relative/bin"]}]}, 422, "validation_error"),
    ({"path": "/srv/x", "key": "no-such-key"}, 404, "key_not_found"),
])
def test_bad_definitions_are_refused(admin: httpx.Client, key: str, body: dict[str, Any], status: int,
                                     code: str) -> None:
    r = make(admin, **{"host_group": unique("g"), "key": key, **body})
    assert r.status_code == status, r.text
    assert r.json()["code"] == code


def test_overlaps_and_keys_without_an_active_version(admin: httpx.Client, key: str) -> None:
    group = unique("g")
    assert make(admin, host_group=group, path="/data", key=key).status_code == 201
    inner = make(admin, host_group=group, path="/data/sub", key=key)
    assert inner.status_code == 409 and inner.json()["code"] == "guard_point_overlaps"
    assert make(admin, host_group=unique("g"), path="/data/sub", key=key).status_code == 201  # other hosts
    pre = admin.post("/api/v1/keys", json={"name": unique("pre"), "activate": False}).json()["name"]
    r = make(admin, host_group=group, path="/elsewhere", key=pre)
    assert r.status_code == 409 and "no Active version" in r.json()["detail"]


def test_a_host_gets_its_guard_points_and_their_keys(tmp_path: Path, base_url: str, agent_url: str,
                                                      admin: httpx.Client, key: str) -> None:
    host = enroll_host(tmp_path, base_url, agent_url, admin, name="gp")
    before = host.client.heartbeat(os_name="x")["guard_points_tag"]
    with pytest.raises(Exception, match="may not receive"):
        host.client.fetch(key)  # not tagged for the group, no guard point yet
    gp = make(admin, host_group=host.group, path="/srv/app", key=key).json()
    own = make(admin, host_id=host.id, path="/srv/own", key=key).json()
    make(admin, host_group=unique("g"), path="/srv/app", key=key)  # another group's
    after = host.client.heartbeat(os_name="x")["guard_points_tag"]
    assert after != before
    listed = host.client.guard_points()
    assert {g["id"] for g in listed} == {gp["id"], own["id"]}
    assert host.client.fetch(key).name == key  # a guard point's key is deliverable to its hosts
    admin.put(f"/api/v1/guard-points/{gp['id']}", json={"host_group": host.group, "path": "/srv/app", "key": key,
                                                       "mode": "learn"})
    assert host.client.heartbeat(os_name="x")["guard_points_tag"] != after


def test_a_re_key_that_skipped_hard_links_is_reported(tmp_path: Path, base_url: str, agent_url: str,
                                                       admin: httpx.Client, key: str) -> None:
    """The agent names the hard-linked files a re-key left alone; its heartbeat carrying
    them was refused (422), so the host went silent after such a re-key."""
    host = enroll_host(tmp_path, base_url, agent_url, admin, name="gphl")
    gp = make(admin, host_id=host.id, path="/srv/linked", key=key).json()
    report = {"id": gp["id"], "revision": 1, "path": "/srv/linked", "key": key, "state": "mounted",
              "rekey": {"generation": 1, "done": 2, "total": 2, "finished": True,
                        "skipped_hard_links": ["a/linked.db", "b/also"]}}
    host.client.heartbeat(os_name="x", guard_points=[report])
    shown = admin.get(f"/api/v1/hosts/{host.id}").json()["guard_points"][0]["rekey"]
    assert shown == {"generation": 1, "done": 2, "total": 2, "finished": True}
    too_many = {**report, "rekey": {**report["rekey"], "skipped_hard_links": ["x"] * 101}}
    with pytest.raises(Exception, match=r"422|skipped_hard_links"):
        host.client.heartbeat(os_name="x", guard_points=[too_many])
