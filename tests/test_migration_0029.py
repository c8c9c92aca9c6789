"""Migration 0029 backfills who used which version of a key (audit_version_usage) from
the audit chain already written, on both stores: an upgraded server's inventory names
the same AWS key stores and KMIP clients, in the same states, as the scan of the records
it replaces did, and the backfill counts what the chainer counts for the same records."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import create_engine, exists, or_, select
from sqlalchemy.orm import Session

from keyserver.core.audit.chain import count_chained
from keyserver.core.audit.statements import USE_ACTIONS
from keyserver.core.inventory import _audited_users
from keyserver.store import db
from keyserver.store.models import AuditEvent, AuditUsageHourly
from keyserver.store.retirement import AuditVersionUsage
from tests.pg import scratch_database

T0 = datetime(2026, 11, 20, 9, 15, tzinfo=UTC)
KEY, OTHER, ODD = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()

# (actor, key, action, outcome, details, minutes after T0)
RECORDS: list[tuple[str, uuid.UUID, str, str, dict[str, Any], int]] = [
    ("kmip:alice", KEY, "key.encrypt", "allowed", {"version": 1}, 0),
    ("kmip:alice", KEY, "key.encrypt", "allowed", {"version": 1}, 90),
    ("kmip:alice", KEY, "key.decrypt", "allowed", {"version": 2}, 30),
    ("xks:store-1", KEY, "key.encrypt", "allowed", {"version": 2, "aws": {"kms_operation": "Encrypt"}}, 5),
    ("xks:store-1", KEY, "key.encrypt", "denied", {"version": 1}, 6),  # refused: no use
    ("kmip:bob", KEY, "key.activate", "allowed", {}, 7),  # used the key, no version of it
    ("kmip:carol", KEY, "key.export", "allowed", {"version": 3}, 8),
    ("alice", KEY, "key.encrypt", "allowed", {"version": 1}, 9),  # a person: not an inventory holder
    ("kmip:alice", OTHER, "key.sign", "allowed", {"version": 1}, 10),
]
# What names no version by the statements' rule (and is left out of the comparison with
# the old scan, whose JSON casts differed per store), and a re-encryption naming two.
ODD_RECORDS: list[tuple[str, uuid.UUID, str, str, dict[str, Any], int]] = [
    ("kmip:odd", ODD, "key.encrypt", "allowed", {"version": True}, 0),
    ("kmip:odd", ODD, "key.encrypt", "allowed", {"version": "1"}, 1),
    ("kmip:odd", ODD, "key.encrypt", "allowed", {"version": 1.5}, 2),
    ("kmip:odd", ODD, "key.encrypt", "allowed", {"version": -1}, 3),
    ("kmip:odd", ODD, "key.encrypt", "allowed", {"version": 2**40}, 4),
    ("kmip:odd", ODD, "key.encrypt", "allowed", {}, 5),
    ("user", ODD, "datakey.reencrypt", "allowed", {"from_version": 1, "to_version": 2}, 6),
]


def _events() -> list[dict[str, Any]]:
    return [{"seq": seq, "time": T0 + timedelta(minutes=m), "actor": actor, "actor_type": "user", "action": action,
             "object_type": "key", "object_id": str(key), "outcome": outcome, "source_ip": None,
             "request_id": None, "details": details, "prev_hash": "0" * 64, "hash": "0" * 64}
            for seq, (actor, key, action, outcome, details, m) in enumerate(RECORDS + ODD_RECORDS, 1)]


def _old_audited_users(s: Session, key_id: uuid.UUID, version: int) -> list[tuple[str, str, str]]:
    """The inventory's AWS key stores and KMIP clients as 0028 found them: a scan of the
    records per actor that used the key."""
    actors = set(s.execute(select(AuditUsageHourly.actor).where(
        AuditUsageHourly.key_id == str(key_id),
        or_(AuditUsageHourly.actor.startswith("xks:"), AuditUsageHourly.actor.startswith("kmip:"))).distinct())
        .scalars())
    out = []
    for actor in sorted(actors):
        used = bool(s.execute(select(exists().where(
            AuditEvent.object_id == str(key_id), AuditEvent.actor == actor, AuditEvent.outcome == "allowed",
            AuditEvent.action.in_(USE_ACTIONS), AuditEvent.details["version"].as_integer() == version))).scalar())
        kind, _, name = actor.partition(":")
        out.append(("xks_store" if kind == "xks" else "kmip_client", name, "in_use" if used else "clear"))
    return out


def _new_audited_users(s: Session, key_id: uuid.UUID, version: int) -> list[tuple[str, str, str]]:
    return [(h.kind, h.holder, h.state) for h in _audited_users(s, key_id, version)]


def _usage(engine: sa.Engine) -> dict[tuple[uuid.UUID, int, str], tuple[datetime, datetime, int]]:
    with Session(engine) as s:
        return {(r.key_id, r.version, r.actor): (r.first_used, r.last_used, r.count)
                for r in s.execute(select(AuditVersionUsage)).scalars()}


def check_backfill(url: str, chained_url: str) -> None:
    db.upgrade(url, "0028")
    engine = create_engine(url)
    try:
        events = _events()
        # The records as the chainer of 0028 left them: chained, and counted per hour.
        hourly: dict[tuple[str, datetime, str, str], int] = {}
        for e in events:
            if e["outcome"] == "allowed":
                k = (e["object_id"], e["time"].replace(minute=0), e["actor"], e["action"])
                hourly[k] = hourly.get(k, 0) + 1
        with engine.begin() as conn:
            conn.execute(sa.insert(AuditEvent), events[:len(RECORDS)])
            conn.execute(sa.insert(AuditUsageHourly), [{"key_id": k, "hour": h, "actor": a, "action": act,
                                                        "count": n} for (k, h, a, act), n in hourly.items()])
        cases = [(key, v) for key in (KEY, OTHER) for v in (1, 2, 3)]
        with Session(engine) as s:
            before = {c: _old_audited_users(s, *c) for c in cases}
        # After the old scan: PostgreSQL's cast of a version `true` or 1.5 was an error.
        with engine.begin() as conn:
            conn.execute(sa.insert(AuditEvent), events[len(RECORDS):])
        db.upgrade(url)
        with Session(engine) as s:
            after = {c: _new_audited_users(s, *c) for c in cases}
        assert after == before
        assert after[(KEY, 1)] == [("kmip_client", "alice", "in_use"), ("kmip_client", "bob", "clear"),
                                   ("kmip_client", "carol", "clear"), ("xks_store", "store-1", "clear")]
        assert after[(KEY, 2)] == [("kmip_client", "alice", "in_use"), ("kmip_client", "bob", "clear"),
                                   ("kmip_client", "carol", "clear"), ("xks_store", "store-1", "in_use")]
        usage = _usage(engine)
        assert usage[(KEY, 1, "kmip:alice")] == (T0, T0 + timedelta(minutes=90), 2)
        assert {k: n for k, (_, _, n) in usage.items() if k[0] == ODD} == {(ODD, 1, "user"): 1, (ODD, 2, "user"): 1}
        # The chainer, given the same records on a new server, counts the same.
        db.upgrade(chained_url)
        chained = create_engine(chained_url)
        try:
            with chained.begin() as conn:
                count_chained(conn, events)
            assert _usage(chained) == usage
        finally:
            chained.dispose()
    finally:
        engine.dispose()


@contextlib.contextmanager
def _two_postgresql() -> Iterator[tuple[str, str]]:
    with scratch_database() as a, scratch_database() as b:
        yield a, b


def test_backfill_on_postgresql() -> None:
    with _two_postgresql() as (url, chained_url):
        check_backfill(url, chained_url)


def test_backfill_on_sqlite(tmp_path: Path) -> None:
    check_backfill(f"sqlite:///{tmp_path / 'm.db'}", f"sqlite:///{tmp_path / 'c.db'}")
