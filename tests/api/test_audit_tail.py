"""The audit chain's tail and the verifier's own state, attacked (issue 25).

Records after the last signed checkpoint used to be protected by nothing but the chain:
cut them, or edit one and re-MAC it with the token, and `verify --checkpoints` with the
sink's copy at hand still said intact. The incremental verify trusted a database row.
Each test here is the attack; each failed on the code before the fix. Every one runs on
a store of its own, on the session's kind of store, with the session's SoftHSM2 token."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import delete, select, text, update

from hsm import HsmBackend
from keyserver.core.audit import AuditFilter, PendingRecord, canonical_record
from keyserver.core.audit_sinks import SinkCopy, read_copy
from keyserver.core.errors import InvalidInput
from keyserver.core.principal import RequestContext, system_context
from keyserver.services import Services
from keyserver.store.models import AuditCheckpoint, AuditEvent, AuditHead, AuditSearch, AuditVerified
from tests.api.test_audit_sinks import _rsyslog
from tests.api.test_health_and_faults import serve
from tests.conftest import own_services

EVERY = 5  # records per checkpoint: the tail after the last one is EVERY - 1 records at most
FIELDS = ("seq", "time", "actor", "actor_type", "action", "object_type", "object_id", "outcome", "source_ip",
          "request_id", "details", "prev_hash")


@pytest.fixture
def sink_file(tmp_path: Path) -> Path:
    return tmp_path / "sink" / "audit.jsonl"


@pytest.fixture
def store(services: Services, hsm_backend: HsmBackend, tmp_path: Path, sink_file: Path) -> Iterator[Services]:
    """`services` selects the session's kind of store; this one is the test's own, with a
    file sink and a checkpoint every EVERY records (none by time)."""
    with own_services(tmp_path / "data", hsm_backend, audit_checkpoint_records=EVERY,
                      audit_checkpoint_seconds=3600,
                      audit_sinks=[{"name": "local", "type": "file", "path": str(sink_file)}]) as svc:
        yield svc


def _records(svc: Services, n: int) -> None:
    for i in range(n):
        svc.audit.record_now(system_context("tests"), action="test.event", outcome="allowed", details={"i": i})
        svc.audit.flush()


def _tail(svc: Services) -> tuple[int, int]:
    """(the last checkpoint's record, the head): records in between are the unanchored tail."""
    status = svc.audit.status()
    return status["last_checkpoint"]["seq"], status["head_seq"]


def _with_a_tail(svc: Services) -> tuple[int, int]:
    _records(svc, 2 * EVERY + 3)
    svc.sinks.flush()
    covered, head = _tail(svc)
    assert head - covered == 3  # three records that no checkpoint covers, all in the sink's copy
    return covered, head


def _remac(svc: Services, s: Any, rows: list[AuditEvent], prev: str) -> str:
    """What someone holding the token (its PINs sit in the data directory) does."""
    for r in rows:
        r.prev_hash = prev
        r.hash = prev = svc.hsm.hmac_sha256(canonical_record(**{c: getattr(r, c) for c in FIELDS}),
                                            key_id=svc.settings.audit_hmac_key_id).hex()
    s.flush()
    s.execute(update(AuditHead).where(AuditHead.id == 1).values(hash=prev))
    return prev


def test_a_tail_cut_after_the_last_checkpoint_is_caught_by_the_sink_copy(store: Services, sink_file: Path) -> None:
    covered, head = _with_a_tail(store)
    with store.db.begin() as s:
        kept = s.execute(select(AuditEvent.hash).where(AuditEvent.seq == covered)).scalar_one()
        s.execute(delete(AuditEvent).where(AuditEvent.seq > covered))
        s.execute(update(AuditHead).where(AuditHead.id == 1).values(seq=covered, hash=kept))
    assert store.audit.verify(full=True).ok  # the database agrees with itself: nothing to see there
    copy = read_copy(sink_file)
    assert store.audit.verify(outside=[c for c in copy if c["type"] == "checkpoint"]).ok  # what the issue found
    r = store.audit.verify(outside=copy)
    assert not r.ok and r.first_broken_seq == covered + 1, r
    assert f"up to {head}" in (r.reason or "") and "tail was cut off" in (r.reason or "")


def test_over_rest_the_copy_s_tail_records_are_compared_too(store: Services, sink_file: Path) -> None:
    """POST /audit/verify took the copy's checkpoints only: the same cut passed there. The
    tail after the last checkpoint (a few records, well inside the body limit) now goes
    with them and is compared record by record."""
    who = _auditor(store)  # its own records first: the tail below is the test's
    _records(store, 2 * EVERY + 3)
    store.sinks.flush()
    covered, head = _tail(store)
    assert head > covered
    copy = list(read_copy(sink_file))
    tail = [c for c in copy if c["type"] == "checkpoint" or c["seq"] > covered]
    with serve(store) as url, httpx.Client(base_url=url, headers={"Authorization": f"Bearer {who}"}) as c:
        clean = c.post("/api/v1/audit/verify", json={"outside": tail}).json()
        assert clean["ok"] and clean["outside_records"] == head - covered and clean["outside_seq"] == head, clean
        store.audit.flush()  # the clean run's own record chained: the cut takes it too, search words and all
        with store.db.begin() as s:
            kept = s.execute(select(AuditEvent.hash).where(AuditEvent.seq == covered)).scalar_one()
            s.execute(delete(AuditEvent).where(AuditEvent.seq > covered))
            s.execute(delete(AuditSearch).where(AuditSearch.seq > covered))
            s.execute(update(AuditHead).where(AuditHead.id == 1).values(seq=covered, hash=kept))
        only_checkpoints = [c for c in tail if c["type"] == "checkpoint"]
        found = c.post("/api/v1/audit/verify", json={"outside": only_checkpoints}).json()
        assert found["ok"], found  # the finding
        # (that run's own record now stands where the cut records stood)
        r = c.post("/api/v1/audit/verify", json={"outside": tail}).json()
        assert not r["ok"] and r["first_broken_seq"] == covered + 1, r
        bad = c.post("/api/v1/audit/verify", json={"outside": [{**tail[-1], "surprise": 1}]})
        assert bad.status_code == 422, bad.text  # a record is taken as sent or refused, never trimmed


def _auditor(svc: Services) -> str:
    """An API token of an auditor (audit:verify is an auditor's)."""
    ctx = system_context("tests")
    name = f"auditor{time.monotonic_ns()}"
    svc.identity.create_user(ctx, username=name, role="auditor", password="a long enough passphrase 1")
    user = RequestContext(svc.identity.login(name, "a long enough passphrase 1", source_ip=None,
                                             request_id=None).principal)
    return svc.identity.create_token(user, name="verify", scopes=None, expires_in_days=1).secret


def test_a_tail_record_edited_and_re_maced_is_caught_by_the_sink_copy(store: Services, sink_file: Path) -> None:
    covered, _ = _with_a_tail(store)
    with store.db.begin() as s:
        rows = list(s.execute(select(AuditEvent).where(AuditEvent.seq > covered).order_by(AuditEvent.seq)).scalars())
        rows[1].actor = "nobody"
        _remac(store, s, rows, rows[0].prev_hash)
    assert store.audit.verify(full=True).ok
    r = store.audit.verify(outside=read_copy(sink_file))
    assert not r.ok and r.first_broken_seq == covered + 2, r
    assert "differs from the outside copy (actor" in (r.reason or "") and '"nobody" here' in (r.reason or "")


def test_the_copy_itself_must_chain_and_a_clean_copy_states_the_residual_window(
        store: Services, sink_file: Path) -> None:
    covered, head = _with_a_tail(store)
    ok = store.audit.verify(outside=read_copy(sink_file))
    assert ok.ok and ok.outside_records == head and ok.outside_seq == head, ok
    _records(store, 2)  # chained, not delivered yet: the window the copy cannot speak for
    ok = store.audit.verify(outside=read_copy(sink_file))
    assert ok.ok and ok.outside_seq == head < ok.head_seq
    # Delivered twice (at-least-once) is fine; a record missing from the middle is not.
    lines = sink_file.read_text().splitlines()
    doubled = sink_file.with_name("doubled.jsonl")
    middle = len(lines) // 2  # a batch sent again (a crash after the sink took it), then delivery goes on
    doubled.write_text("\n".join(lines[:middle] + lines[middle - 4:middle] + lines[middle:] + lines[-3:]) + "\n")
    assert store.audit.verify(outside=SinkCopy(doubled)).ok
    edited = sink_file.with_name("edited.jsonl")
    again = next(line for line in reversed(lines[:middle]) if json.loads(line)["type"] == "record")
    edited.write_text("\n".join([*lines[:middle], again.replace('"tests"', '"other"'), *lines[middle:]]) + "\n")
    r = store.audit.verify(outside=SinkCopy(edited))
    assert not r.ok and "differs from the outside copy (actor" in (r.reason or ""), r
    holed = sink_file.with_name("holed.jsonl")
    holed.write_text("\n".join(line for line in lines if json.loads(line).get("seq") != covered + 1
                               or json.loads(line)["type"] != "record") + "\n")
    r = store.audit.verify(outside=read_copy(holed))
    assert not r.ok and f"skips from record {covered} to record {covered + 2}" in (r.reason or "")


def test_a_syslog_receivers_copy_catches_the_cut_tail(services: Services, hsm_backend: HsmBackend,
                                                      tmp_path: Path) -> None:
    (tmp_path / "rsyslog").mkdir()
    with _rsyslog(tmp_path / "rsyslog") as (port, ca, received):
        sink = {"name": "siem", "type": "syslog", "host": "127.0.0.1", "port": port, "ca_file": str(ca),
                "server_name": "localhost"}
        with own_services(tmp_path / "data", hsm_backend, audit_checkpoint_records=EVERY,
                          audit_checkpoint_seconds=3600, audit_sinks=[sink]) as svc:
            _, head = _with_a_tail(svc)
            copy: list[dict[str, Any]] = []
            for _ in range(100):
                copy = read_copy(received) if received.exists() else []
                if [c for c in copy if c["type"] == "record" and c["seq"] == head]:
                    break
                time.sleep(0.2)
            assert svc.audit.verify(outside=copy).ok
            with svc.db.begin() as s:
                s.execute(delete(AuditEvent).where(AuditEvent.seq == head))
                kept = s.execute(select(AuditEvent.hash).where(AuditEvent.seq == head - 1)).scalar_one()
                s.execute(update(AuditHead).where(AuditHead.id == 1).values(seq=head - 1, hash=kept))
            assert svc.audit.verify(full=True).ok
            r = svc.audit.verify(outside=copy)
            assert not r.ok and "tail was cut off" in (r.reason or "") and r.first_broken_seq == head


def test_a_forged_verification_state_does_not_hide_an_edit(store: Services) -> None:
    _records(store, EVERY)
    assert store.audit.verify().ok
    _records(store, 2 * EVERY)
    # A database writer without the HSM: edit record 2, then move the incremental start
    # past it by copying the newest checkpoint into audit_verified.
    with store.db.begin() as s:
        s.execute(update(AuditEvent).where(AuditEvent.seq == 2).values(actor="someone-else"))
        last = s.execute(select(AuditCheckpoint).order_by(AuditCheckpoint.id.desc()).limit(1)).scalar_one()
        s.execute(update(AuditVerified).where(AuditVerified.id == 1).values(
            checkpoint=last.id, seq=last.seq, hash=last.hash))
    # Neither the console's audit page nor the system health page shows it as verified.
    assert store.audit.status()["verified"] is None and store.audit.chain_state()["verified"] is None
    r = store.audit.verify()
    assert not r.ok and r.first_broken_seq == 2 and "altered" in (r.reason or ""), r
    assert r.from_seq == 0


def test_an_unvouched_verification_state_forces_a_full_walk_and_says_so(store: Services) -> None:
    _records(store, 2 * EVERY)
    assert store.audit.verify().ok
    assert store.audit.status()["verified"] is not None
    with store.db.begin() as s:
        s.execute(update(AuditVerified).where(AuditVerified.id == 1).values(mac=None))  # as an older version left it
    r = store.audit.verify()
    assert r.ok and r.from_seq == 0 and r.checked == r.head_seq and "forged" in (r.note or "")
    again = store.audit.verify()  # the full walk wrote a state the HSM vouches for
    assert again.ok and again.from_seq > 0 and again.note is None


def test_export_refuses_an_invalid_search_before_streaming_and_reports_a_failure_in_the_stream(
        store: Services) -> None:
    with pytest.raises(InvalidInput):
        store.audit.export(AuditFilter(q=":"), fmt="jsonl")
    _records(store, 3)
    # 1,000 records a page: make a second page, fail the store under the stream after the
    # first, and the stream says so instead of ending as if complete.
    with store.db.begin() as s:
        store.audit.add_many(s, [PendingRecord(system_context("tests"), "test.bulk") for _ in range(1200)])
    store.audit.flush()
    for fmt in ("jsonl", "csv"):
        pages = store.audit.export(AuditFilter(), fmt=fmt)  # type: ignore[arg-type]
        first = next(pages) + (next(pages) if fmt == "csv" else "")
        with store.db.begin() as s:
            s.execute(text("ALTER TABLE audit_events RENAME TO audit_events_away"))
        try:
            rest = "".join(pages)
        finally:
            with store.db.begin() as s:
                s.execute(text("ALTER TABLE audit_events_away RENAME TO audit_events"))
        last = rest.splitlines()[-1]
        if fmt == "jsonl":
            assert json.loads(first.splitlines()[-1])["seq"] == 1000
            err = json.loads(last)
            assert err["type"] == "error" and err["code"] == "export_failed" and err["after_seq"] == 1000
        else:
            assert last.startswith("#error,export_failed,1000,")


@pytest.mark.parametrize("query", [{"q": ":"}, {"q": "a b c d e f g h i"}, {"actor": "-*"}])
def test_export_answers_a_problem_for_an_invalid_search_before_streaming(admin: httpx.Client, services: Services,
                                                                         query: dict[str, str]) -> None:
    for fmt in ("jsonl", "csv"):
        r = admin.get("/api/v1/audit/export", params={"format": fmt, **query})
        assert r.status_code == 400, (r.status_code, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["code"] == "invalid_search"
    services.audit.flush()
    refused, _, _ = services.audit.query(AuditFilter(action="audit.export", outcome="denied"), limit=1)
    assert refused and refused[0].details["reason"] == "invalid_search"
