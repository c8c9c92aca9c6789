"""Verifying the chain, and naming the first thing that does not fit.

A database writer without the HSM can delete or edit rows, but cannot forge the hashes;
a copy kept outside the server (a sink's file, the SIEM) also shows the tail cut off,
the log wiped, or the chain re-MACed by someone holding the token (docs/audit.md).
"""

from __future__ import annotations

import hmac
import json
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from keyserver.core.audit.checkpoints import (
    SIGNED_FIELDS,
    ZERO_DIGEST,
    Checkpoints,
    checkpoint_dict,
    checkpoint_digest,
    checkpoint_problem,
    key_fingerprint,
)
from keyserver.core.audit.record import (
    EXPORT_COLUMNS,
    GENESIS_HASH,
    MAC_COLUMNS,
    ChainMac,
    canonical_record,
    event_dict,
)
from keyserver.core.audit.statements import RETIRED_ACTION, Retired, UseWatch, statement_problem
from keyserver.store.models import AuditCheckpoint, AuditEvent, AuditHead, AuditVerified, KeyVersion


@dataclass(frozen=True, slots=True)
class VerifyResult:
    ok: bool
    checked: int
    head_seq: int
    first_broken_seq: int | None
    reason: str | None
    # Where this run started (0: the whole chain) and the last checkpoint it confirmed.
    from_seq: int = 0
    checkpoint: int | None = None
    outside_checked: int = 0  # checkpoints from an outside copy compared
    outside_records: int = 0  # records from an outside copy compared, one by one
    outside_seq: int = 0  # the newest record the outside copy holds
    # Why an incremental run walked every record instead (its stored state did not verify).
    note: str | None = None
    statements: int = 0  # zero-use statements checked (all of the chain's, whatever the range walked)
    # Each statement that does not verify and each later use of a stated version, as
    # (seq, what); the first is also `first_broken_seq` and `reason`.
    problems: tuple[tuple[int, str], ...] = ()

class Verifier:
    def __init__(self, session_factory: sessionmaker[Session], mac: ChainMac, checkpoints: Checkpoints, *,
                 flush: Callable[[], int], now: Callable[[], datetime]) -> None:
        self._db = session_factory
        self._mac = mac
        self._checkpoints = checkpoints
        self._flush = flush
        self._now = now

    def verify(self, *, full: bool = False, outside: Iterable[dict[str, Any]] | None = None) -> VerifyResult:
        """Check the chain and name the first thing that does not fit.

        Every checkpoint's signature and link is checked; records are walked from the
        last checkpoint an earlier run verified (from the start with `full`), each
        record's link and MAC, and each checkpoint against the record it names.
        `outside`: a copy kept off the server (a sink's file, a syslog receiver's copy,
        the SIEM): its checkpoints must verify under this server's key and be present,
        unchanged, in the database — which catches a cut tail, a wipe and a re-MACed
        chain — and its records must chain among themselves and each be, unchanged, the
        database's record of the same sequence number, so that nothing the copy holds,
        after the last checkpoint too, can be cut or rewritten unseen. `outside` is read
        twice (checkpoints, then records, streamed: a copy of millions of records is
        never held in memory) — a list, or `audit_sinks.read_copy(path)`."""
        self._flush()
        public = serialization.load_der_public_key(self._checkpoints.public_key_der())
        assert isinstance(public, ec.EllipticCurvePublicKey)
        fingerprint = key_fingerprint(self._checkpoints.public_key_der())
        outside_cps = [c for c in outside or () if c.get("type", "checkpoint") == "checkpoint"]
        with self._db() as s:
            head = s.get(AuditHead, 1)
            head_seq, head_hash = (head.seq, head.hash) if head else (0, GENESIS_HASH)
            stored = [checkpoint_dict(c) for c in
                      s.execute(select(AuditCheckpoint).order_by(AuditCheckpoint.id)).scalars()]
            verified = None if full else s.get(AuditVerified, 1)

        def broken(seq: int | None, reason: str, checked: int = 0, start: int = 0) -> VerifyResult:
            return VerifyResult(False, checked, head_seq, seq, reason, from_seq=start)

        # 1. The checkpoints themselves: signed by this key, linked, increasing.
        prev_digest, prev_seq = ZERO_DIGEST, 0
        for n, c in enumerate(stored, start=1):
            problem = checkpoint_problem(c, public, fingerprint)
            if c["checkpoint"] != n:
                problem = f"checkpoint {n} is missing"
            elif c["prev"] != prev_digest:
                problem = f"checkpoint {n} does not link to checkpoint {n - 1}"
            elif c["seq"] <= prev_seq:
                problem = f"checkpoint {n} goes backwards (record {c['seq']} after {prev_seq})"
            if problem:
                return broken(c["seq"], problem)
            prev_digest, prev_seq = checkpoint_digest(c), c["seq"]
        if stored and stored[-1]["seq"] > head_seq:
            return broken(head_seq + 1, f"checkpoint {stored[-1]['checkpoint']} covers {stored[-1]['seq']} records "
                                        f"but the chain holds {head_seq}: records were removed")
        # 2. Checkpoints from outside: each must be valid and present, unchanged, here.
        by_number = {c["checkpoint"]: c for c in stored}
        for c in outside_cps:
            problem = checkpoint_problem(c, public, fingerprint)
            if problem:
                return broken(c.get("seq"), f"outside copy: {problem}")
            mine = by_number.get(c["checkpoint"])
            if mine is None:
                what = ("the audit log was wiped" if not stored else
                        "the chain's tail was cut off" if c["seq"] > head_seq else "checkpoints were removed")
                return broken(c["seq"], f"checkpoint {c['checkpoint']} (record {c['seq']}) from the outside copy "
                                        f"is not in the database: {what}")
            if any(mine[f] != c[f] for f in SIGNED_FIELDS):
                return broken(c["seq"], f"checkpoint {c['checkpoint']} differs from the outside copy: the chain "
                                        f"up to record {c['seq']} was rewritten (re-MACed and re-signed)")
        # 3. Records from outside, every one: checkpoints leave the newest records (up to
        # N or T of them) unanchored, and only the copy itself can show them cut or edited.
        problem_at, outside_records, outside_seq = self._compare_outside_records(outside or (), head_seq)
        if problem_at is not None:
            return broken(problem_at[0], problem_at[1])
        # 4. The records, from where the last run left off — if the HSM vouches for that.
        start, prev, note = 0, GENESIS_HASH, None
        if verified is not None:
            if not hmac.compare_digest(verified.mac or "", self._mac.of_verified(verified.checkpoint, verified.seq,
                                                                              verified.hash)):
                note = ("the stored verification state (audit_verified) does not carry this server's MAC: "
                        "it was forged or written by an older version, so every record was verified")
            elif any(c["checkpoint"] == verified.checkpoint and c["seq"] == verified.seq
                     and c["hash"] == verified.hash for c in stored):
                start, prev = verified.seq, verified.hash
        at_seq = {c["seq"]: c for c in stored}
        expected_seq, checked, last_cp = start + 1, 0, None
        # Statements before the walked range still forbid uses inside it.
        watch = UseWatch()
        with self._db() as s:
            for r in s.execute(select(AuditEvent).where(AuditEvent.action == RETIRED_ACTION,
                                                        AuditEvent.seq <= start).order_by(AuditEvent.seq)).scalars():
                watch.see(event_dict(r))
        with self._db() as s:
            stmt = (select(AuditEvent).where(AuditEvent.seq > start).order_by(AuditEvent.seq)
                    .execution_options(yield_per=1000))
            for r in s.execute(stmt).scalars():
                if r.seq != expected_seq:
                    return broken(expected_seq, f"record {expected_seq} is missing (next present: {r.seq})",
                                  checked, start)
                if r.prev_hash != prev:
                    return broken(r.seq, f"record {r.seq} does not link to record {r.seq - 1}", checked, start)
                fields = {c: getattr(r, c) for c in MAC_COLUMNS}
                if not hmac.compare_digest(self._mac(canonical_record(**fields)), r.hash):
                    return broken(r.seq, f"record {r.seq} was altered (its MAC does not match)", checked, start)
                cp = at_seq.get(r.seq)
                if cp is not None:
                    if cp["hash"] != r.hash:
                        return broken(r.seq, f"record {r.seq} is not the one checkpoint {cp['checkpoint']} signed",
                                      checked, start)
                    last_cp = cp
                if watch.wants(r.action, r.outcome, r.object_id):
                    watch.see(event_dict(r))
                prev, expected_seq, checked = r.hash, expected_seq + 1, checked + 1
        if head_seq != start + checked or head_hash != prev:
            return broken(start + checked + 1, f"the chain head says {head_seq} records; "
                                               f"records after {start + checked} were removed", checked, start)
        problems = self._statement_problems(watch, public, fingerprint)
        if problems:
            # Not recorded as verified: the next run walks these records again and says so again.
            return VerifyResult(False, checked, head_seq, problems[0][0], problems[0][1], from_seq=start,
                                statements=len(watch.statements), problems=tuple(problems), note=note)
        if last_cp is not None:
            with self._db.begin() as s:
                row = s.get(AuditVerified, 1)
                if row is None:
                    row = AuditVerified(id=1)
                    s.add(row)
                row.checkpoint, row.seq, row.hash, row.verified_at = (
                    last_cp["checkpoint"], last_cp["seq"], last_cp["hash"], self._now())
                row.mac = self._mac.of_verified(last_cp["checkpoint"], last_cp["seq"], last_cp["hash"])
        return VerifyResult(True, checked, head_seq, None, None, from_seq=start,
                            checkpoint=(last_cp or (stored[-1] if stored else {})).get("checkpoint"),
                            outside_checked=len(outside_cps), outside_records=outside_records,
                            outside_seq=outside_seq, note=note, statements=len(watch.statements))

    def _statement_problems(self, watch: UseWatch, public: ec.EllipticCurvePublicKey,
                            fingerprint: str) -> list[tuple[int, str]]:
        """Each zero-use statement's signature and its anchor in the chain (the record it
        names as the last before it), then every later use of a stated version."""
        problems: list[tuple[int, str]] = []
        with self._db() as s:
            for st in watch.statements:
                problem = statement_problem(st.details, public, fingerprint)
                if problem is None:
                    chain = st.details["statement"].get("chain")
                    try:
                        seq, hash = int(chain["seq"]), str(chain["hash"])
                    except (KeyError, TypeError, ValueError):
                        seq, hash = -1, ""
                    # Record 0: the chain was empty (retirement.py names it with an empty hash).
                    found = hash if seq == 0 and hash in ("", GENESIS_HASH) else s.execute(
                        select(AuditEvent.hash).where(AuditEvent.seq == seq)).scalar_one_or_none()
                    if not 0 <= seq < st.seq or found != hash:
                        problem = (f"the statement's chain position (record {seq}) is not a record before it "
                                   "with that hash: it was moved or the chain rewritten")
                if problem is not None:
                    problems.append((st.seq, f"zero-use statement in record {st.seq}: {problem}"))

            def kmip_uid(st: Retired) -> str | None:
                named = st.details["statement"].get("kmip_uid")
                if isinstance(named, str):
                    return named
                # The version's KMIP identifier is its row's id; a destroyed version keeps its row.
                try:
                    key_id = uuid.UUID(str(st.key_id))
                except ValueError:
                    return None
                found = s.execute(select(KeyVersion.id).where(KeyVersion.key_id == key_id,
                                                              KeyVersion.version == st.version)).scalar_one_or_none()
                return None if found is None else str(found)

            problems += watch.finish(kmip_uid)
        return sorted(problems)

    def _compare_outside_records(self, items: Iterable[dict[str, Any]],
                                 head_seq: int) -> tuple[tuple[int | None, str] | None, int, int]:
        """(the first problem as (seq, reason) or None, how many records the copy holds,
        the newest of them). Streamed in the copy's order, the database read a page at a
        time. The copy may repeat records (delivery is at-least-once: a batch sent again
        restarts at an earlier record) and may start after record 1 (rotated files
        dropped); it may not disagree with itself or with the database, skip a record,
        or reach past the database's end."""
        count, last_seq, last_hash = 0, 0, ""
        cut: int | None = None  # the first record the copy holds beyond the database's end
        with self._db() as s:
            page: dict[int, dict[str, Any]] = {}

            def stored(seq: int) -> dict[str, Any] | None:
                nonlocal page
                if seq not in page:
                    rows = s.execute(select(AuditEvent).where(AuditEvent.seq >= seq, AuditEvent.seq < seq + 1000))
                    page = {r.seq: event_dict(r) for r in rows.scalars()}
                return page.get(seq)

            for item in items:
                if item.get("type") != "record":
                    continue
                try:
                    seq = int(item["seq"])
                    theirs = {c: item[c] for c in EXPORT_COLUMNS}
                except (KeyError, TypeError, ValueError):
                    return (None, f"the outside copy's record after record {last_seq} is malformed"), count, last_seq
                count += 1
                if cut is not None:  # only how far the copy reaches is still of interest
                    last_seq = max(last_seq, seq)
                    continue
                if last_seq and seq > last_seq + 1:
                    return ((last_seq + 1, f"the outside copy skips from record {last_seq} to record {seq}: it is "
                                           "incomplete or was edited"), count, seq)
                if last_seq and seq == last_seq + 1 and theirs["prev_hash"] != last_hash:
                    return ((seq, f"in the outside copy, record {seq} does not link to record {last_seq}: the copy "
                                  "was edited"), count, seq)
                if seq > head_seq:
                    cut, last_seq = seq, seq
                    continue
                mine = stored(seq)
                if mine is None:
                    return ((seq, f"record {seq} from the outside copy is not in the database: records were "
                                  "removed"), count, max(seq, last_seq))
                differ = [c for c in EXPORT_COLUMNS if mine[c] != theirs[c]]
                if differ:
                    what = ([c for c in differ if c not in ("hash", "prev_hash")] or differ)[0]
                    return ((seq, f"record {seq} differs from the outside copy ({what}: {_short(mine[what])} here, "
                                  f"{_short(theirs[what])} outside): it was rewritten after it left the server"),
                            count, max(seq, last_seq))
                if seq > last_seq:
                    last_seq, last_hash = seq, theirs["hash"]
        if cut is not None:
            return ((cut, f"the outside copy holds records up to {last_seq} but the database ends at record "
                          f"{head_seq}: the chain's tail was cut off"), count, last_seq)
        return None, count, last_seq


def _short(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    return text if len(text) <= 40 else text[:39] + "…"
