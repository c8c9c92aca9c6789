"""Alembic is the only way the schema is made: up, down, up again on both databases,
and the models agree with the migrations."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from keyserver.store import db
from keyserver.store.models import Base, mapped_here
from tests.pg import scratch_database

TABLES = {"managed_keys", "key_versions", "users", "browser_sessions", "api_tokens", "audit_inbox",
          "audit_events", "audit_head", "keks", "kek_rotations"}


def check_roundtrip(url: str) -> None:
    db.upgrade(url)
    engine = create_engine(url)
    try:
        assert set(inspect(engine).get_table_names()) >= TABLES
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts={"include_object": mapped_here}),
                                    Base.metadata)
        assert diff == [], f"models and migrations disagree: {diff}"
        db.downgrade(url, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        db.upgrade(url)
        assert set(inspect(engine).get_table_names()) >= TABLES
    finally:
        engine.dispose()


def test_postgresql_up_down_up() -> None:
    with scratch_database() as url:
        check_roundtrip(url)


def test_sqlite_up_down_up(tmp_path: Path) -> None:
    check_roundtrip(f"sqlite:///{tmp_path / 'm.db'}")


def check_kek_states(url: str) -> None:
    """0017: a KEK that 0016 called retired (rotated away from, still in the token) is
    superseded now, and retired again on the way down."""
    db.upgrade(url, "0016")
    engine = create_engine(url)
    when = datetime(2026, 11, 1, tzinfo=UTC)
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO keks (kek_id, state, created_at, retired_at) VALUES "
                              "('kek-old', 'retired', :t, :t), ('kek-new', 'active', :t, NULL)"), {"t": when})
        db.upgrade(url)
        with engine.connect() as conn:
            rows = {r.kek_id: r for r in conn.execute(text("SELECT kek_id, state, superseded_at, retired_at "
                                                           "FROM keks"))}
            assert rows["kek-old"].state == "superseded" and rows["kek-old"].retired_at is None
            assert rows["kek-old"].superseded_at is not None
            assert rows["kek-new"].state == "active" and rows["kek-new"].superseded_at is None
        db.downgrade(url, "0016")
        with engine.connect() as conn:
            states = {r.kek_id: r.state for r in conn.execute(text("SELECT kek_id, state FROM keks"))}
            assert states == {"kek-old": "retired", "kek-new": "active"}
            assert conn.execute(text("SELECT retired_at FROM keks WHERE kek_id = 'kek-old'")).scalar() is not None
    finally:
        engine.dispose()


def test_postgresql_kek_states_0017() -> None:
    with scratch_database() as url:
        check_kek_states(url)


def test_sqlite_kek_states_0017(tmp_path: Path) -> None:
    check_kek_states(f"sqlite:///{tmp_path / 'm.db'}")


def check_rollup_backfill(url: str) -> None:
    """0018: the hourly counts are filled from the records chained before it, with the
    chainer's rule for reasons, through the ORM's view of the table."""
    db.upgrade(url, "0017")
    engine = create_engine(url)
    t1, t2 = datetime(2026, 11, 1, 10, 5, tzinfo=UTC), datetime(2026, 11, 1, 11, 59, tzinfo=UTC)
    rows = [(1, t1, "alice", "denied", '{"missing_permission": "keys:create"}'),
            (2, t1, "alice", "denied", '{"missing_permission": "keys:create"}'),
            (3, t2, "alice", "allowed", "{}"),
            (4, t2, "bob", "error", '{"refused": "hsm unavailable"}')]
    try:
        import sqlalchemy as sa

        events = sa.table("audit_events", *(sa.column(c) for c in ("seq", "actor", "actor_type", "action", "outcome",
                                                                      "prev_hash", "hash")),
                          sa.column("time", sa.DateTime(timezone=True)), sa.column("details", sa.JSON))
        with engine.begin() as conn:
            conn.execute(sa.insert(events), [
                {"seq": seq, "time": t, "actor": actor, "actor_type": "user", "action": "key.create",
                 "outcome": outcome, "details": json.loads(details), "prev_hash": "0" * 64, "hash": "0" * 64}
                for seq, t, actor, outcome, details in rows])
        db.upgrade(url)
        from sqlalchemy.orm import Session

        from keyserver.store.models import AuditHourly, AuditRefusalsHourly
        h10, h11 = t1.replace(minute=0), t2.replace(minute=0)
        with Session(engine) as s:
            hourly = {(r.hour, r.outcome): r.count for r in s.query(AuditHourly)}
            refused = {(r.hour, r.actor, r.reason): r.count for r in s.query(AuditRefusalsHourly)}
        assert hourly == {(h10, "denied"): 2, (h11, "allowed"): 1, (h11, "error"): 1}
        assert refused == {(h10, "alice", "missing keys:create"): 2, (h11, "bob", "refused"): 1}
    finally:
        engine.dispose()


def test_postgresql_rollup_backfill_0018() -> None:
    with scratch_database() as url:
        check_rollup_backfill(url)


def test_sqlite_rollup_backfill_0018(tmp_path: Path) -> None:
    check_rollup_backfill(f"sqlite:///{tmp_path / 'm.db'}")


def check_search_and_usage_backfill(url: str) -> None:
    """0019: records chained before it are searchable, with the chainer's words, on the
    store's own index; allowed key operations are counted per hour, key, actor, action."""
    import sqlalchemy as sa
    from sqlalchemy.orm import Session

    from keyserver.core.audit_search import matching
    from keyserver.store.models import AuditEvent, AuditUsageHourly

    db.upgrade(url, "0018")
    engine = create_engine(url)
    t = datetime(2026, 11, 1, 10, 5, tzinfo=UTC)
    key = "3f1c2a9e-0000-4000-8000-00000000000a"
    rows = [(1, "host:db-1", "datakey.generate", "key", key, "allowed", {"key_name": "payments-db"}),
            (2, "host:db-1", "datakey.generate", "key", key, "allowed", {"key_name": "payments-db"}),
            (3, "alice", "key.destroy", "key", key, "denied", {"missing_permission": "keys:destroy"}),
            (4, "bob", "user.create", "user", "carol", "allowed", {})]
    try:
        events = sa.table("audit_events", *(sa.column(c) for c in (
            "seq", "actor", "actor_type", "action", "object_type", "object_id", "outcome", "prev_hash", "hash")),
            sa.column("time", sa.DateTime(timezone=True)), sa.column("details", sa.JSON))
        with engine.begin() as conn:
            conn.execute(sa.insert(events), [
                {"seq": seq, "time": t, "actor": actor, "actor_type": "user", "action": action, "object_type": ot,
                 "object_id": oid, "outcome": outcome, "details": details, "prev_hash": "0" * 64, "hash": "0" * 64}
                for seq, actor, action, ot, oid, outcome, details in rows])
        db.upgrade(url)
        with Session(engine) as s:
            def found(q: str) -> list[int]:
                return list(s.execute(sa.select(AuditEvent.seq).where(matching(engine.dialect.name, q))
                                      .order_by(AuditEvent.seq)).scalars())
            assert found("payments") == [1, 2]
            assert found("pay*") == [1, 2]
            assert found("DB-1 generate") == [1, 2]
            assert found("destroy") == [3]
            assert found("keys:destroy") == [3]
            assert found(key) == [1, 2, 3]
            assert found("carol") == [4]
            assert found("nobody") == []
            used = {(r.key_id, r.hour, r.actor, r.action): r.count for r in s.query(AuditUsageHourly)}
        assert used == {(key, t.replace(minute=0), "host:db-1", "datakey.generate"): 2}
    finally:
        engine.dispose()


def test_postgresql_search_and_usage_backfill_0019() -> None:
    with scratch_database() as url:
        check_search_and_usage_backfill(url)


def test_sqlite_search_and_usage_backfill_0019(tmp_path: Path) -> None:
    check_search_and_usage_backfill(f"sqlite:///{tmp_path / 'm.db'}")


def test_replicas_starting_together_migrate_once(tmp_path: Path) -> None:
    """Three processes upgrading one fresh PostgreSQL database at once (replicas of a new
    release starting together): one migrates, the others wait for it and find nothing to
    do; none fails on a table another has just created."""
    import subprocess
    import sys

    with scratch_database() as url:
        script = "import sys; from keyserver.store import db; db.upgrade(sys.argv[1])"
        procs = [subprocess.Popen([sys.executable, "-c", script, url], stderr=subprocess.PIPE, text=True)
                 for _ in range(3)]
        results = [(p.wait(120), p.stderr.read() if p.stderr else "") for p in procs]
        assert all(rc == 0 for rc, _ in results), "\n".join(err for _, err in results)
        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                heads = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
                diff = compare_metadata(MigrationContext.configure(conn, opts={"include_object": mapped_here}),
                                        Base.metadata)
            assert len(heads) == 1 and diff == [], (heads, diff)
        finally:
            engine.dispose()


def check_kmip_tenancy(url: str) -> None:
    """0026: an object a KMIP client made lands in the client's group; one made over REST
    in `shared`, which every unrevoked client is granted all rights on; down and up again."""
    import uuid

    import sqlalchemy as sa

    db.upgrade(url, "0025")
    engine = create_engine(url)
    t = datetime(2026, 11, 1, tzinfo=UTC)
    clients = sa.table("kmip_clients", sa.column("id", sa.Uuid), sa.column("name"), sa.column("role"),
                       sa.column("serial"), sa.column("fingerprint_sha256"),
                       sa.column("not_after", sa.DateTime(timezone=True)),
                       sa.column("created_at", sa.DateTime(timezone=True)), sa.column("created_by"),
                       sa.column("revoked_at", sa.DateTime(timezone=True)), sa.column("key_export"))
    keys = sa.table("managed_keys", sa.column("id", sa.Uuid), sa.column("name"), sa.column("description"),
                    sa.column("owner"), sa.column("tags", sa.JSON), sa.column("algorithm"),
                    sa.column("length_bits"), sa.column("created_at", sa.DateTime(timezone=True)),
                    sa.column("updated_at", sa.DateTime(timezone=True)), sa.column("revision"),
                    sa.column("kmip_attributes", sa.JSON))
    by_client, by_rest, by_gone = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    try:
        with engine.begin() as conn:
            conn.execute(sa.insert(clients), [
                {"id": uuid.uuid4(), "name": name, "role": "kmip-client", "serial": f"s-{name}",
                 "fingerprint_sha256": "0" * 64, "not_after": t, "created_at": t, "created_by": "admin",
                 "revoked_at": revoked, "key_export": "plaintext"}
                for name, revoked in (("vcenter-a", None), ("nas", None), ("old", t))])
            conn.execute(sa.insert(keys), [
                {"id": kid, "name": f"k{i}", "description": "", "owner": owner, "tags": {}, "algorithm": "AES",
                 "length_bits": 256, "created_at": t, "updated_at": t, "revision": 1, "kmip_attributes": {}}
                for i, (kid, owner) in enumerate(((by_client, "kmip:vcenter-a"), (by_rest, "admin"),
                                                  (by_gone, "kmip:deleted-client")))])
        db.upgrade(url)
        with engine.connect() as conn:
            groups = {r.name: r.group for r in conn.execute(text('SELECT name, "group" FROM kmip_clients'))}
            assert groups == {"vcenter-a": "vcenter-a", "nas": "nas", "old": "old"}
            objects = {uuid.UUID(str(r.id)): r.kmip_group
                       for r in conn.execute(sa.select(keys.c.id, sa.column("kmip_group")).select_from(keys))}
            assert objects == {by_client: "vcenter-a", by_rest: "shared", by_gone: "shared"}
            grants = sorted((r.grantee, r.target_kind, r.target, tuple(json.loads(r.rights)
                                                                       if isinstance(r.rights, str) else r.rights))
                            for r in conn.execute(text("SELECT grantee, target_kind, target, rights "
                                                       "FROM kmip_grants")))
            everything = ("read", "use", "export", "destroy")
            assert grants == [("client:nas", "group", "shared", everything),
                              ("client:vcenter-a", "group", "shared", everything)]
        db.downgrade(url, "0025")
        assert "kmip_grants" not in inspect(engine).get_table_names()
        db.upgrade(url)
    finally:
        engine.dispose()


def test_postgresql_kmip_tenancy_0026() -> None:
    with scratch_database() as url:
        check_kmip_tenancy(url)


def test_sqlite_kmip_tenancy_0026(tmp_path: Path) -> None:
    check_kmip_tenancy(f"sqlite:///{tmp_path / 'm.db'}")
