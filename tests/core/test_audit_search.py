"""Searching the audit log (keyserver.core.audit_search): the chainer indexes each
record's words in the transaction that chains it, and a search finds the same records on
PostgreSQL (GIN) and SQLite (FTS5); prefix filters on actor and object; usage counts per
key and actor equal counting the records. On a store of its own, on the session's kind
of store."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from hsm import HsmBackend
from keyserver.core.audit import AuditFilter
from keyserver.core.audit_search import parse_query, record_terms
from keyserver.core.errors import InvalidInput
from keyserver.core.principal import system_context
from keyserver.services import Services
from keyserver.store.models import AuditEvent, AuditSearch
from tests.conftest import own_store, services_on

pytestmark = pytest.mark.store

KEY = "0b6f3c1e-7d4a-4c2b-9e1f-5a8d2c3b4e6f"
OTHER = "9d2e4f6a-1b3c-4d5e-8f7a-0c1b2d3e4f5a"


@pytest.fixture
def svc(services: Services, tmp_path: Path, hsm_backend: HsmBackend) -> Iterator[Services]:
    with own_store() as url, services_on(url, tmp_path / "data", hsm_backend) as s:
        yield s


def seqs(svc: Services, **flt: str) -> list[int]:
    rows, total, exact = svc.audit.query(AuditFilter(**flt), limit=1000)
    assert exact and total == len(rows)
    return sorted(r.seq for r in rows)


def test_words_of_a_record() -> None:
    terms = record_terms({"actor": "host:db-1.example.com", "action": "datakey.generate", "object_type": "key",
                          "object_id": KEY, "outcome": "allowed", "request_id": "Req_42",
                          "details": {"key_name": "Payments-DB", "nested": {"ips": ["10.0.0.7"]}, "ok": True,
                                      "n": 3}})
    words = terms.split()
    assert len(words) == len(set(words))
    assert {"host", "db", "1", "example", "com", "datakey", "generate", "payments", "req", "42", "10", "7",
            "3"} <= set(words)
    assert "true" not in words  # booleans say nothing worth finding
    assert all(w == w.lower() for w in words)


def test_queries_are_words_all_of_which_must_match() -> None:
    assert parse_query("Pay* host:db-1") == [("pay", True), ("host", False), ("db", False), ("1", False)]
    for bad in ("", "  ", "*", "--", " ".join(f"w{i}" for i in range(9))):
        with pytest.raises(InvalidInput):
            parse_query(bad)


def test_search_finds_the_same_records_on_every_store(svc: Services) -> None:
    db1, db2, alice = system_context("host:db-1"), system_context("host:db-2"), system_context("alice")
    svc.audit.record_now(db1, action="datakey.generate", outcome="allowed", object_type="key", object_id=KEY,
                         details={"key_name": "payments-db"})
    svc.audit.record_now(db2, action="datakey.generate", outcome="allowed", object_type="key", object_id=OTHER,
                         details={"key_name": "hr-files"})
    svc.audit.record_now(alice, action="key.destroy", outcome="denied", object_type="key", object_id=KEY,
                         details={"missing_permission": "keys:destroy"})
    svc.audit.record_now(alice, action="user.create", outcome="allowed", object_type="user", object_id="Paymaster",
                         details={"role": "auditor"})
    svc.audit.flush()
    with svc.db() as s:
        first = s.execute(select(func.min(AuditEvent.seq)).where(AuditEvent.actor == "host:db-1")).scalar_one()
        # Every chained record has its words, made in the chainer's transaction.
        assert s.execute(select(func.count()).select_from(AuditSearch)).scalar_one() == \
            s.execute(select(func.count()).select_from(AuditEvent)).scalar_one()
    a, b, c, d = first, first + 1, first + 2, first + 3
    assert seqs(svc, q="payments") == [a]
    assert seqs(svc, q="PAY*") == [a, d]  # payments-db, and Paymaster: prefixes match any field
    assert seqs(svc, q="pay* generate") == [a]
    assert seqs(svc, q=KEY) == [a, c]  # a UUID is its five groups, all of which must match
    assert seqs(svc, q="destroy keys") == [c]
    assert seqs(svc, q="db-2") == [b]
    assert seqs(svc, q="nothing-like-this") == []
    # With the other filters: they narrow what the words found.
    assert seqs(svc, q=KEY, outcome="denied") == [c]
    # Prefixes of a field: found through the words, then compared exactly, in any store.
    assert seqs(svc, actor="host:db-*") == [a, b]
    assert seqs(svc, actor="host:db-1*") == [a]
    assert seqs(svc, actor="HOST:db-*") == []  # case-sensitive, as the exact filter is
    assert seqs(svc, object_id="Paym*") == [d]
    assert seqs(svc, object_id=KEY[:8] + "*") == [a, c]
    # Words and both prefixes in one search: each goes through the word index on its own.
    assert seqs(svc, q="generate", actor="host:db*", object_id=KEY[:4] + "*") == [a]
    with pytest.raises(InvalidInput):
        svc.audit.query(AuditFilter(actor="**"))


def test_a_search_counts_to_a_cap_and_pages_the_same_either_way(
        svc: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past SEARCH_COUNT_CAP matches the total is a lower bound and the page is found by
    walking the log from its head; below it, from the word index first. Both give the
    newest matches, and repeating a search (past psycopg's prepare threshold, where
    PostgreSQL may switch to a generic plan) gives the same answer."""
    import keyserver.core.audit.read as audit_module

    host = system_context("host:web-7")
    for i in range(12):
        svc.audit.record_now(host, action="datakey.generate", outcome="allowed", object_type="key",
                             object_id=KEY if i % 3 == 0 else OTHER, details={"key_name": f"shard-{i % 3}"})
    svc.audit.flush()
    with svc.db() as s:
        web = list(s.execute(select(AuditEvent.seq).where(AuditEvent.actor == "host:web-7")
                             .order_by(AuditEvent.seq.desc())).scalars())
    shard0 = [q for i, q in enumerate(reversed(web)) if i % 3 == 0][::-1]
    monkeypatch.setattr(audit_module, "SEARCH_COUNT_CAP", 5)
    for _ in range(7):
        rows, total, exact = svc.audit.query(AuditFilter(q="web 7"), limit=4)  # 12 matches: past the cap
        assert ([r.seq for r in rows], total, exact) == (web[:4], 5, False)
        rows, total, exact = svc.audit.query(AuditFilter(q="shard-0"), limit=3)  # 4 matches: below it
        assert ([r.seq for r in rows], total, exact) == (shard0[:3], 4, True)
        rows, total, exact = svc.audit.query(AuditFilter(actor="host:web*"), limit=50, before_seq=web[9])
        assert ([r.seq for r in rows], total, exact) == (web[10:], 5, False)
    # Filters that do not search count exactly, however many records match.
    _, total, exact = svc.audit.query(AuditFilter(actor="host:web-7"), limit=1)
    assert (total, exact) == (12, True)
    # An export of a search walks every match, however many.
    exported = "".join(svc.audit.export(AuditFilter(q="web"), fmt="jsonl")).splitlines()
    assert len(exported) == 12


def test_usage_per_key_and_per_actor_counts_the_records(svc: Services) -> None:
    db1, db2 = system_context("host:db-1"), system_context("host:db-2")
    for _ in range(5):
        svc.audit.record_now(db1, action="datakey.generate", outcome="allowed", object_type="key", object_id=KEY)
    for _ in range(2):
        svc.audit.record_now(db1, action="datakey.decrypt", outcome="allowed", object_type="key", object_id=KEY)
    for _ in range(3):
        svc.audit.record_now(db2, action="datakey.generate", outcome="allowed", object_type="key", object_id=KEY)
    svc.audit.record_now(db2, action="datakey.generate", outcome="allowed", object_type="key", object_id=OTHER)
    svc.audit.record_now(db2, action="datakey.generate", outcome="denied", object_type="key", object_id=KEY)
    svc.audit.record_now(db2, action="user.read", outcome="allowed", object_type="user", object_id="x")
    svc.audit.flush()
    with svc.db() as s:
        chained = Counter(s.execute(select(AuditEvent.action).where(
            AuditEvent.object_id == KEY, AuditEvent.outcome == "allowed")).scalars())
    now = datetime.now(UTC)
    hour = now.replace(minute=0, second=0, microsecond=0)
    u = svc.audit.usage(since=hour - timedelta(hours=2), until=hour + timedelta(hours=1), bucket="hour", key_id=KEY)
    assert len(u["buckets"]) == 3 and u["total"] == 10
    assert {a["name"]: a["count"] for a in u["actions"]} == dict(chained)
    assert u["top"] == [{"name": "host:db-1", "count": 7}, {"name": "host:db-2", "count": 3}]
    assert sum(sum(b["counts"].values()) for b in u["buckets"]) == 10
    by_host = svc.audit.usage(since=now - timedelta(days=1), until=now + timedelta(days=1), bucket="day",
                              actor="host:db-2")
    assert by_host["top"] == [{"name": KEY, "count": 3}, {"name": OTHER, "count": 1}]
    assert by_host["actions"] == [{"name": "datakey.generate", "count": 4}]
    for bad in ({}, {"key_id": KEY, "actor": "host:db-1"}):
        with pytest.raises(InvalidInput):
            svc.audit.usage(since=now - timedelta(hours=1), until=now, bucket="hour", **bad)
