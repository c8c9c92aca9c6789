"""AES-GCM with random IVs is bounded to 2^32 encryptions per key (NIST SP 800-38D §8.3):
every key version counts its encryptions and refuses past the limit, telling the caller
to rotate; replicas share the count; the hot path reserves blocks instead of writing
per call."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import create_engine, event, update

from keyserver.core.errors import Conflict
from keyserver.core.gcm import BLOCK, GCM_LIMIT, GcmBudget
from keyserver.core.keys import KeySpec
from keyserver.core.principal import system_context
from keyserver.services import Services
from keyserver.store.models import KeyVersion
from tests.conftest import unique


def test_replicas_share_the_count_and_nothing_passes_the_limit(services: Services) -> None:
    key = services.keys.create(system_context("tests"), KeySpec(name=unique("gcm")))
    replicas = [GcmBudget(services.engine, limit=10, block=4) for _ in range(2)]
    done, refused = 0, set()
    while len(refused) < 2:
        for i, budget in enumerate(replicas):
            if i in refused:
                continue
            try:
                budget.spend(key.id, 1, name=key.name)
                done += 1
            except Conflict as exc:
                assert exc.code == "gcm_limit" and "rotate the key" in exc.message
                refused.add(i)
    assert done == 10  # every reserved invocation spent, none beyond the limit
    assert replicas[0].used(key.id, 1) == 10


def test_a_reservation_losing_every_race_is_not_told_the_key_is_used_up(services: Services) -> None:
    """Another replica reserves from the same counter just before each of this one's
    writes (as every replica does at once when the database comes back under load): the
    reservation still gets its block. With a compare-and-set it lost ten races in a row
    and answered `gcm_limit` for a key far from its limit (the PostgreSQL-restart drill)."""
    if services.engine.dialect.name != "postgresql":
        pytest.skip("the interleaving needs a second writer between this transaction's statements, "
                    "which SQLite does not allow (one writer at a time); the code path is the same")
    key = services.keys.create(system_context("tests"), KeySpec(name=unique("gcm-race")))
    engine = create_engine(services.engine.url)
    other = GcmBudget(services.engine, block=7)
    raced = []

    @event.listens_for(engine, "before_cursor_execute")
    def another_replica_first(conn: object, cursor: object, statement: str, *args: object) -> None:
        if statement.lstrip().upper().startswith("UPDATE KEY_VERSIONS"):
            other._reserve_alone(key.id, 1)
            raced.append(statement)

    try:
        GcmBudget(engine, block=100).spend(key.id, 1, name=key.name)
    finally:
        engine.dispose()
    assert raced  # the other replica did get in first
    assert other.used(key.id, 1) == 100 + 7 * len(raced)


def test_the_hot_path_reserves_blocks(admin: httpx.Client, services: Services) -> None:
    name = admin.post("/api/v1/keys", json={"name": unique("gcm-hot")}).json()["name"]
    key = services.keys.get(system_context("tests"), name)
    for _ in range(3):
        assert admin.post(f"/api/v1/keys/{name}/generate-data-key", json={}).status_code == 200
    assert services.datakeys._gcm.used(key.id, 1) == BLOCK  # one UPDATE for three data keys


@pytest.mark.parametrize("route", ["generate-data-key", "encrypt"])
def test_a_version_at_the_limit_refuses_to_encrypt_until_the_key_is_rotated(admin: httpx.Client, services: Services,
                                                                            route: str) -> None:
    name = admin.post("/api/v1/keys", json={"name": unique("gcm-full")}).json()["name"]
    key = services.keys.get(system_context("tests"), name)
    with services.db.begin() as s:
        s.execute(update(KeyVersion).where(KeyVersion.key_id == key.id).values(gcm_invocations=GCM_LIMIT))
    body = {} if route == "generate-data-key" else {"plaintext": "aGVsbG8="}
    r = admin.post(f"/api/v1/keys/{name}/{route}", json=body)
    assert r.status_code == 409 and r.json()["code"] == "gcm_limit" and "rotate" in r.json()["detail"], r.text
    assert admin.post(f"/api/v1/keys/{name}/rotate", json={}).status_code == 200
    assert admin.post(f"/api/v1/keys/{name}/{route}", json=body).status_code == 200
