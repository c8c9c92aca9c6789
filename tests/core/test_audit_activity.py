"""The audit chain's hourly counts (audit_hourly, audit_refusals_hourly) and the activity query built on them:
kept by the chainer in the same transaction as the records, equal to counting the records
themselves, and refused ranges that would not make a chart. On a store of its own (exact
counts), on the session's kind of store."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from hsm import HsmBackend
from keyserver.core.audit import rollup_reason
from keyserver.core.errors import InvalidInput
from keyserver.core.principal import system_context
from keyserver.services import Services
from keyserver.store.models import AuditEvent, AuditHourly, AuditRefusalsHourly
from tests.conftest import own_store, services_on

pytestmark = pytest.mark.store


@pytest.fixture
def svc(services: Services, tmp_path: Path, hsm_backend: HsmBackend) -> Iterator[Services]:
    with own_store() as url, services_on(url, tmp_path / "data", hsm_backend) as s:
        yield s


def test_counts_follow_the_chain_and_rank_the_refusals(svc: Services) -> None:
    mallory, bob = system_context("mallory"), system_context("bob")
    for _ in range(7):
        svc.audit.record_now(mallory, action="key.create", outcome="denied",
                             details={"missing_permission": "keys:create"})
    for _ in range(3):
        svc.audit.record_now(bob, action="datakey.decrypt", outcome="denied", details={"reason": "context_mismatch"})
    svc.audit.record_now(bob, action="key.rotate", outcome="error", details={"refused": "hsm unavailable"})
    for _ in range(5):
        svc.audit.record_now(bob, action="key.read", outcome="allowed")
    svc.audit.flush()

    with svc.db() as s:
        chained = Counter(s.execute(select(AuditEvent.outcome)).scalars())
        rolled = dict(s.execute(select(AuditHourly.outcome, func.sum(AuditHourly.count))
                                .group_by(AuditHourly.outcome)).all())
        refusals = s.execute(select(func.sum(AuditRefusalsHourly.count))).scalar_one()
    # The counts are the chain, counted: nothing missed, nothing twice.
    assert {k: int(v) for k, v in rolled.items()} == dict(chained)
    assert refusals == chained["denied"] + chained["error"]

    now = datetime.now(UTC)
    a = svc.audit.activity(since=now - timedelta(hours=3), until=now + timedelta(hours=1), bucket="hour")
    assert len(a["buckets"]) == 5 and a["buckets"][0]["start"] < a["buckets"][-1]["start"]
    assert a["totals"]["denied"] == 10 and a["totals"]["error"] == 1
    assert a["totals"]["allowed"] == chained["allowed"]
    assert a["top_refused_actors"][0] == {"name": "mallory", "count": 7}
    assert a["top_refused_actors"][1] == {"name": "bob", "count": 4}
    assert a["top_refusal_reasons"][:3] == [{"name": "missing keys:create", "count": 7},
                                            {"name": "context_mismatch", "count": 3},
                                            {"name": "refused", "count": 1}]
    assert a["top_refused_actions"][0] == {"name": "key.create", "count": 7}
    # Days: the same records, in today's bucket.
    d = svc.audit.activity(since=now - timedelta(days=6), until=now + timedelta(hours=1), bucket="day")
    assert len(d["buckets"]) in (7, 8) and d["totals"] == a["totals"]
    # A window before any record: every bucket there, all zero.
    month_ago = now.replace(minute=0, second=0, microsecond=0) - timedelta(days=30)
    empty = svc.audit.activity(since=month_ago, until=month_ago + timedelta(hours=24), bucket="hour")
    assert len(empty["buckets"]) == 24 and empty["totals"] == {"allowed": 0, "denied": 0, "error": 0}
    assert empty["top_refused_actors"] == []


def test_ranges_that_make_no_chart_are_refused(svc: Services) -> None:
    now = datetime.now(UTC)
    for since, until, bucket, said in [
        (now, now - timedelta(hours=1), "hour", "until must be after since"),
        (now - timedelta(days=30), now, "hour", "at most 400 buckets"),
        (now.replace(tzinfo=None), now, "hour", "time zone"),
    ]:
        with pytest.raises(InvalidInput) as e:
            svc.audit.activity(since=since, until=until, bucket=bucket)  # type: ignore[arg-type]
        assert said in e.value.message


def test_reasons_are_short_shared_words() -> None:
    assert rollup_reason("allowed", {"reason": "x"}) == ""
    assert rollup_reason("denied", {"reason": "own_request"}) == "own_request"
    assert rollup_reason("denied", {"missing_permission": "keys:destroy"}) == "missing keys:destroy"
    assert rollup_reason("error", {"refused": "a long sentence " * 20}) == "refused"
    assert rollup_reason("denied", {"reason": "r" * 300}) == "r" * 64
    assert rollup_reason("denied", None) == ""
