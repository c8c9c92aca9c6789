"""The data-key route's hot path (keyserver/api/hotpath.py): the common case is served
without FastAPI's route, and every answer — success, refusal, bad input — is the same
as the route's, with every data key's audit record committed before the key is out."""

from __future__ import annotations

import concurrent.futures
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from keyserver.core.datakeys import DataKeyService
from keyserver.services import Services
from keyserver.store.models import AuditEvent, AuditInbox
from tests.conftest import Actor
from tests.serve import eventually


@pytest.fixture
def route_calls(services: Services, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Counts the calls that reach the FastAPI route (the real service still answers)."""
    calls: list[str] = []
    real = DataKeyService.generate

    def counted(self: DataKeyService, ctx: Any, ref: str, **kw: Any) -> Any:
        calls.append(ref)
        return real(self, ctx, ref, **kw)

    monkeypatch.setattr(DataKeyService, "generate", counted)
    yield calls


def _records(services: Services, key_id: str) -> int:
    """Committed generate records for the key, chained or still in the inbox."""
    with services.db() as s:
        chained = s.execute(select(func.count()).select_from(AuditEvent).where(
            AuditEvent.object_id == key_id, AuditEvent.action == "datakey.generate")).scalar_one()
        inbox = [row for (row,) in s.execute(select(AuditInbox.payload))]
    queued = sum(1 for p in inbox if key_id in str(p) and "datakey.generate" in str(p))
    return int(chained) + queued


def test_the_common_case_skips_the_route_and_every_key_is_audited_before_it_is_out(
        admin: httpx.Client, new_key: dict[str, Any], services: Services, route_calls: list[str]) -> None:
    name = new_key["name"]
    first = admin.post(f"/api/v1/keys/{name}/generate-data-key", json={"context": {"b": "1"}})
    assert first.status_code == 200, first.text
    assert route_calls == [name]  # the first call fills the caches through the route
    # On the embedded store the key's creation reaches this process's caches by polling:
    # once it has (its caches dropped), one more call fills them again for good.
    eventually(services.notifier.caught_up, "the server to act on the key's creation", seconds=10)
    assert admin.post(f"/api/v1/keys/{name}/generate-data-key", json={"context": {"b": "1"}}).status_code == 200
    route_calls.clear()

    def one(_: int) -> dict[str, Any]:
        r = admin.post(f"/api/v1/keys/{name}/generate-data-key", json={"context": {"b": "1"}})
        assert r.status_code == 200, r.text
        return dict(r.json())

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        made = list(pool.map(one, range(40)))
    assert route_calls == [], "the common case was served by the route"
    # Every key returned has its record committed already (no flush, no waiting).
    assert _records(services, new_key["id"]) >= 41
    for dk in made[:5]:
        assert set(dk) == {"key_id", "key_name", "key_version", "ciphertext_blob", "plaintext"}
        r = admin.post("/api/v1/datakeys/decrypt", json={"ciphertext_blob": dk["ciphertext_blob"],
                                                         "context": {"b": "1"}})
        assert r.status_code == 200 and r.json()["plaintext"] == dk["plaintext"]
    metrics = admin.get("/metrics").text
    assert 'route="/api/v1/keys/{key_ref}/generate-data-key"' in metrics


def test_answers_other_than_success_are_the_routes(admin: httpx.Client, new_key: dict[str, Any],
                                                   actors: dict[str, Actor], services: Services) -> None:
    name = new_key["name"]
    assert admin.post(f"/api/v1/keys/{name}/generate-data-key", json={}).status_code == 200  # caches warm
    bad = admin.post(f"/api/v1/keys/{name}/generate-data-key", json={"number_of_bytes": 33})
    assert bad.status_code == 422 and bad.json()["code"] == "validation_error"
    unknown = admin.post(f"/api/v1/keys/no-such-{uuid.uuid4().hex[:6]}/generate-data-key", json={})
    assert unknown.status_code == 404 and unknown.json()["code"] == "key_not_found"
    text = admin.post(f"/api/v1/keys/{name}/generate-data-key", content=b"{}",
                      headers={"content-type": "text/plain"})
    assert text.status_code == 422
    # An auditor may not make data keys: refused (403) and audited by the route, even
    # with a warm token cache.
    auditor = actors["auditor"].client
    assert auditor.get("/api/v1/keys").status_code == 200
    refused = auditor.post(f"/api/v1/keys/{name}/generate-data-key", json={})
    assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
    services.audit.flush()
    r = admin.get("/api/v1/audit/events", params={"object_id": name, "outcome": "denied"})
    assert any(e["action"] == "datakey.generate" for e in r.json()["items"]), r.json()
    # A session (cookie + CSRF) is served by the route.
    session = actors["admin"].session
    assert session.post(f"/api/v1/keys/{name}/generate-data-key", json={}).status_code == 200


def test_a_revoked_key_stops_the_hot_path_at_once(admin: httpx.Client, new_key: dict[str, Any]) -> None:
    """The cached Active version is dropped in the same commit that revokes the key (the
    store's notification): the very next request is refused."""
    name = new_key["name"]
    for _ in range(3):
        assert admin.post(f"/api/v1/keys/{name}/generate-data-key", json={}).status_code == 200
    r = admin.post(f"/api/v1/keys/{name}/revoke", json={"reason": "key-compromise"})
    assert r.status_code == 200, r.text
    refused = admin.post(f"/api/v1/keys/{name}/generate-data-key", json={})
    assert refused.status_code == 409 and refused.json()["code"] == "illegal_state"
