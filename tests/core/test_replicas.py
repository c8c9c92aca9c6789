"""The replicas list (System page): each replica's housekeeping reports it; one not heard
from for three intervals is shown as gone, then forgotten after a day."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import delete

from keyserver.core.principal import system_context
from keyserver.core.replicas import ReplicaRegistry
from keyserver.services import Services
from keyserver.store.models import Replica


def test_live_gone_and_forgotten(services: Services) -> None:
    clock = [datetime(2026, 11, 25, 10, 0, tzinfo=UTC)]
    ctx = system_context("tests")
    with services.db.begin() as s:
        s.execute(delete(Replica))

    def registry() -> ReplicaRegistry:
        r = ReplicaRegistry(services.db, services.policy, interval_seconds=30, store="postgresql",
                            now=lambda: clock[0])
        r.id += f":{id(r)}"  # two replicas of one test process
        return r

    old, new = registry(), registry()
    old.beat()
    clock[0] += timedelta(seconds=30)
    new.beat()
    listed = {r.id: live for r, live in new.list(ctx)}
    assert listed == {old.id: True, new.id: True}
    clock[0] += timedelta(seconds=75)  # old: 105 s since its last report, new: 75 s
    new.beat()
    assert {r.id: live for r, live in new.list(ctx)} == {old.id: False, new.id: True}
    clock[0] += timedelta(days=1)
    new.beat(scheduler_error="hsm_unavailable: the HSM did not answer")  # the old one is forgotten
    assert [(r.id, r.scheduler_error) for r, _ in new.list(ctx)] == [
        (new.id, "hsm_unavailable: the HSM did not answer")]


def test_health_lists_the_replicas(services: Services, admin: httpx.Client) -> None:
    services.replicas.beat()
    r = admin.get("/api/v1/system/health")
    assert r.status_code == 200, r.text
    me = [x for x in r.json()["replicas"] if x["id"] == services.replicas.id]
    assert len(me) == 1 and me[0]["live"] and me[0]["version"] == r.json()["version"]


def test_the_scheduler_reports_its_replica_and_what_failed(services: Services) -> None:
    from keyserver.core.errors import ServiceUnavailable
    from keyserver.core.scheduler import Scheduler

    class Keys:
        def run_due(self, ctx: object) -> dict[str, int]:
            raise ServiceUnavailable("the HSM did not answer", code="hsm_unavailable")

    registry = ReplicaRegistry(services.db, services.policy, interval_seconds=0.05, store="postgresql")
    registry.id += ":scheduler-test"
    scheduler = Scheduler(Keys(), services.keks, interval_seconds=0.05, replicas=registry)  # type: ignore[arg-type]
    scheduler.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            rows = {r.id: r for r, _ in registry.list(system_context("tests"))}
            if registry.id in rows:
                break
            assert time.monotonic() < deadline, "the scheduler never reported its replica"
            time.sleep(0.05)
    finally:
        scheduler.stop()
    assert rows[registry.id].scheduler_error == "the HSM did not answer"
