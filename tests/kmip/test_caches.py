"""The listener's per-replica caches (client principals, objects for Get) never outlive
a change made by another replica, and concurrent Gets share audit commits without
losing a record. "Another replica" is a separate connection pool that changes a row and
sends the notification in the same transaction, as every replica's (or, on the embedded
store, the CLI's) commit does."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from kmip.core import enums
from kmip.pie.exceptions import KmipOperationFailure
from sqlalchemy import update
from sqlalchemy.orm import Session

from keyserver.kmip.listener import KmipListener
from keyserver.services import Services
from keyserver.store import db
from keyserver.store.models import KeyVersion, KmipClient
from keyserver.store.notify import Notifier, Topic
from tests.conftest import unique
from tests.kmip.conftest import ClientFiles, make_client
from tests.kmip.raw import connect, query_request, roundtrip


def _other_replica(services: Services, change: Any, topic: Topic) -> None:
    """`change` committed by another process on the same store, with the notification
    its commit carries (LISTEN/NOTIFY on PostgreSQL, the change counter on SQLite)."""
    engine = db.make_engine(services.settings.effective_database_url, pool_size=1)
    try:
        with Session(engine) as s, s.begin():
            s.execute(change)
            Notifier(engine).publish(s, topic)
    finally:
        engine.dispose()


def _eventually(check: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def test_a_client_revoked_by_another_replica_is_refused(services: Services, kmip_listener: KmipListener,
                                                         kmip_files: Callable[[str], ClientFiles]) -> None:
    assert services.notifier.healthy
    files = kmip_files("operator")
    with connect(files, kmip_listener.port) as conn:
        for _ in range(3):  # the principal is cached now
            assert roundtrip(conn, query_request()).batch_items[0].result_status.value == enums.ResultStatus.SUCCESS
        _other_replica(services, update(KmipClient).where(KmipClient.id == uuid.UUID(files.client_id))
                       .values(revoked_at=datetime.now(UTC)), Topic.PRINCIPALS)

        def refused() -> bool:
            answer = roundtrip(conn, query_request()).batch_items[0]
            return answer.result_status.value != enums.ResultStatus.SUCCESS

        assert _eventually(refused)


def test_a_key_destroyed_by_another_replica_is_not_served_from_the_cache(services: Services, kmip: Any) -> None:
    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=unique("cached"))
    kmip.activate(uid)
    assert len(kmip.get(uid).value) == 32
    assert len(kmip.get(uid).value) == 32  # from the cache
    _other_replica(services, update(KeyVersion).where(KeyVersion.id == uuid.UUID(uid))
                   .values(state="destroyed", wrapped_key=None, destroy_date=datetime.now(UTC)), Topic.KEYS)

    def refused() -> bool:
        try:
            kmip.get(uid)
        except KmipOperationFailure as exc:
            return bool(exc.reason == enums.ResultReason.ILLEGAL_OPERATION)
        return False

    assert _eventually(refused)


def test_concurrent_gets_each_leave_an_audit_record(services: Services, kmip: Any, officer_files: ClientFiles,
                                                    kmip_listener: KmipListener) -> None:
    uid = kmip.create(enums.CryptographicAlgorithm.AES, 256, name=unique("grouped"))
    kmip.activate(uid)
    services.audit.flush()
    before = _exports(services, uid)
    threads, per_thread, errors = 8, 5, []
    start = threading.Barrier(threads)

    def worker() -> None:
        try:
            with make_client(officer_files, kmip_listener.port) as client:
                start.wait()
                for _ in range(per_thread):
                    assert len(client.get(uid).value) == 32
        except Exception as exc:  # reported below
            errors.append(exc)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(60)
    assert not errors
    services.audit.flush()
    assert _exports(services, uid) - before == threads * per_thread


def _exports(services: Services, uid: str) -> int:
    from sqlalchemy import func, select

    from keyserver.store.models import AuditEvent, KeyVersion

    with services.db() as s:
        key_id = s.execute(select(KeyVersion.key_id).where(KeyVersion.id == uuid.UUID(uid))).scalar_one()
        return int(s.execute(select(func.count()).select_from(AuditEvent).where(
            AuditEvent.action == "key.export", AuditEvent.object_id == str(key_id))).scalar_one())


@pytest.fixture(autouse=True)
def _listener_connected(services: Services) -> None:
    # The caches are used only while the notification listener is connected.
    assert _eventually(lambda: services.notifier.healthy)


def test_a_notification_drops_only_the_caches_of_its_topic(services: Services) -> None:
    """A burst of key changes must not empty every replica's credential caches, and a
    credential change must still reach them; a notification with no topic (an older
    replica's) drops everything."""
    fired: list[str] = []
    notifier = Notifier(services.notifier._engine)  # a fresh subscriber list, same store
    notifier.subscribe(Topic.KEYS, lambda: fired.append("keys"))
    notifier.subscribe(Topic.PRINCIPALS, lambda: fired.append("principals"))
    notifier.start()
    try:
        assert _eventually(lambda: notifier.healthy)
        time.sleep(0.5)  # past the drop-everything of the listener's own (re)connection
        engine = db.make_engine(services.settings.effective_database_url, pool_size=1)
        try:
            for topic in (Topic.KEYS, Topic.PRINCIPALS):
                fired.clear()
                with Session(engine) as s, s.begin():
                    Notifier(engine).publish(s, topic)
                assert _eventually(lambda: bool(fired))
                time.sleep(0.5)  # anything else it would fire has arrived by now
                if services.notifier._postgres:
                    assert set(fired) == {topic.value}
                else:  # the embedded store's change counter carries no topic
                    assert set(fired) == {"keys", "principals"}
            if services.notifier._postgres:
                fired.clear()
                with engine.connect() as conn:
                    conn.exec_driver_sql("NOTIFY strongroom_invalidate")
                    conn.commit()
                assert _eventually(lambda: set(fired) == {"keys", "principals"})
        finally:
            engine.dispose()
    finally:
        notifier.stop()
