"""The hosts list as the console pages it: search, group and status filters with counts
per status, sorting, paging; and a host's heartbeats per hour (its online timeline)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from agents.keyclient.identity import HostIdentity
from keyserver.services import Services
from tests.api.test_hosts import enroll
from tests.conftest import unique


def test_search_filter_sort_and_page(tmp_path: Path, base_url: str, admin: httpx.Client,
                                     services: Services) -> None:
    group = unique("fleet")
    secret = admin.post("/api/v1/enrollment-tokens", json={"host_group": group, "max_uses": 4}).json()["secret"]
    ids = {}
    for name in ("web-b.example.com", "web-a.example.com", "db-a.example.com", "db-b.example.com"):
        r = enroll(base_url, secret, HostIdentity.load_or_create(tmp_path / name), name)
        assert r.status_code == 201, r.text
        ids[name] = r.json()["host_id"]
    hosts = {h["hostname"]: h for h in admin.get("/api/v1/hosts", params={"group": group}).json()["items"]}
    for name in ("web-a.example.com", "db-b.example.com", "web-b.example.com"):  # web-b beats last
        _, row = services.hosts.authenticate(hosts[name]["cert_serial"])
        services.hosts.heartbeat(row, os_name="Debian 12", agent_version="0.2.0", guard_points=[], source_ip="10.1.2.3")
    assert admin.post(f"/api/v1/hosts/{ids['web-b.example.com']}/revoke").status_code == 200

    def page(**params: object) -> dict[str, object]:
        r = admin.get("/api/v1/hosts", params={"group": group, **params})
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    def names(p: dict[str, object]) -> list[str]:
        return [h["hostname"] for h in p["items"]]  # type: ignore[attr-defined]

    everything = page()
    assert names(everything) == ["db-a.example.com", "db-b.example.com", "web-a.example.com", "web-b.example.com"]
    assert everything["total"] == 4 and everything["counts"] == {"online": 2, "offline": 1, "revoked": 1}
    assert group in everything["groups"]  # type: ignore[operator]
    assert names(page(status="online")) == ["db-b.example.com", "web-a.example.com"]
    assert names(page(status="offline")) == ["db-a.example.com"]
    assert page(status="revoked")["total"] == 1
    # Search: any case, any part of hostname, group, address or OS; counts follow it.
    web = page(q="WEB-")
    assert names(web) == ["web-a.example.com", "web-b.example.com"]
    assert web["counts"] == {"online": 1, "offline": 0, "revoked": 1}
    assert names(page(q="10.1.2")) == ["db-b.example.com", "web-a.example.com", "web-b.example.com"]
    # Sorting: latest heartbeat first, the never-seen host last either way; then paging.
    assert names(page(sort="-last_heartbeat_at")) == [
        "web-b.example.com", "db-b.example.com", "web-a.example.com", "db-a.example.com"]
    assert names(page(sort="last_heartbeat_at"))[-1] == "db-a.example.com"
    second = page(sort="hostname", limit=2, offset=2)
    assert names(second) == ["web-a.example.com", "web-b.example.com"] and second["total"] == 4
    for bad in ({"sort": "cert_pem"}, {"status": "asleep"}, {"limit": 0}):
        r = admin.get("/api/v1/hosts", params=bad)
        assert r.status_code in (400, 422), r.text

    now = datetime.now(UTC)
    r = admin.get(f"/api/v1/hosts/{ids['web-a.example.com']}/heartbeats",
                  params={"since": (now - timedelta(hours=5)).isoformat(),
                          "until": (now + timedelta(minutes=1)).isoformat()})
    assert r.status_code == 200, r.text
    hours = r.json()
    assert len(hours) in (6, 7) and hours[-1]["count"] + hours[-2]["count"] >= 1
    assert sum(h["count"] for h in hours) == 1
    r = admin.get(f"/api/v1/hosts/{ids['web-a.example.com']}/heartbeats",
                  params={"since": (now - timedelta(days=40)).isoformat(), "until": now.isoformat()})
    assert r.status_code == 400 and "31 days" in r.json()["detail"]
