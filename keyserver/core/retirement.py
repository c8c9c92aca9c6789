"""Retiring a key version (decision 0024 §2-3): a held action that records a running
retirement, drives its holders to the newest version (agents see `retiring_versions`;
with `contents` the server asks for a re-key of each guard point on the key), lets an
operator exclude what the server cannot see, and — once the inventory (inventory.py)
shows nothing in use and every host has walked since it began — writes the one
`key.version_retired` audit record whose statement is signed in the HSM with the
checkpoint key (audit/statements.py). Files a walk could not read under this key
(`unreadable`) do not hold the version and do not hold the retirement up; the statement
lists them per guard point and host.

Completion is checked by the scheduler every interval and on every inventory read;
the retirement's row lock makes sure one replica writes the statement, once.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from keyserver.core.approvals import ApprovalService
from keyserver.core.audit import AuditService, utcnow
from keyserver.core.audit.checkpoints import key_fingerprint
from keyserver.core.audit.statements import RETIRED_ACTION, STATEMENT_TYPE, canonical_statement
from keyserver.core.errors import Conflict, CoreError, InvalidInput, NotFound, ServiceUnavailable
from keyserver.core.guardpoints import GuardPointService
from keyserver.core.inventory import EXCLUDABLE, Inventory, compute, current_retirement
from keyserver.core.keys import key_filter
from keyserver.core.permissions import Permission
from keyserver.core.policy import Policy
from keyserver.core.principal import RequestContext, system_context
from keyserver.core.states import DESTROYED_STATES, KeyState
from keyserver.store.models import AuditEvent, AuditHead, GuardPoint, KeyVersion, ManagedKey
from keyserver.store.notify import Notifier, Topic
from keyserver.store.retirement import RETIREMENT_STATES, RetirementExclusion, VersionRetirement

log = logging.getLogger(__name__)
MAX_REASON = 1000


def retirement_dict(r: VersionRetirement, key_name: str | None = None) -> dict[str, Any]:
    return {"id": str(r.id), "key_id": str(r.key_id), "key": key_name, "version": r.version, "state": r.state,
            "reason": r.reason, "contents": r.contents, "requested_by": r.requested_by,
            "requested_at": r.requested_at, "completed_at": r.completed_at, "cancelled_at": r.cancelled_at,
            "cancelled_by": r.cancelled_by, "statement_seq": r.statement_seq, "initial": dict(r.initial or {}),
            "exclusions": [{"kind": x.kind, "holder": x.holder, "reason": x.reason, "excluded_by": x.excluded_by,
                            "excluded_at": x.excluded_at} for x in r.exclusions]}


class RetirementService:
    def __init__(self, session_factory: sessionmaker[Session], audit: AuditService, policy: Policy,
                 notifier: Notifier, guard_points: GuardPointService, *, approvals: ApprovalService | None = None,
                 now: Callable[[], datetime] = utcnow) -> None:
        self._db = session_factory
        self._audit = audit
        self._policy = policy
        self._notifier = notifier
        self._guard_points = guard_points
        self._approvals = approvals
        self._now = now

    # --- reading -------------------------------------------------------------
    def inventory(self, ctx: RequestContext, ref: str, version: int) -> dict[str, Any]:
        """The version's inventory now, with its retirement; a running retirement whose
        inventory reached zero completes here first."""
        self._policy.require(ctx, Permission.KEYS_READ, action="key.inventory", object_type="key", object_id=ref)
        self._chain_pending()
        with self._db() as s:
            key = self._key(s, ref)
            self._version(key, version)
            running = current_retirement(s, key.id, version)
        if running is not None and running.state == "running":
            self._try_complete(running.id)
        with self._db() as s:
            key = self._key(s, ref)
            retirement = current_retirement(s, key.id, version)
            inv = compute(s, key, version, retirement, self._now())
            out = inv.as_dict()
            out["retirement"] = retirement_dict(retirement, key.name) if retirement is not None else None
        return out

    def list(self, ctx: RequestContext, *, state: str | None = None) -> list[dict[str, Any]]:
        self._policy.require(ctx, Permission.KEYS_READ, action="key.retirement_list")
        if state is not None and state not in RETIREMENT_STATES:
            raise InvalidInput(f"state is one of {', '.join(RETIREMENT_STATES)}", code="invalid_state")
        stmt = select(VersionRetirement, ManagedKey.name).join(ManagedKey, ManagedKey.id == VersionRetirement.key_id)
        if state is not None:
            stmt = stmt.where(VersionRetirement.state == state)
        with self._db() as s:
            rows = s.execute(stmt.order_by(VersionRetirement.requested_at.desc()).limit(500)).all()
            return [retirement_dict(r, name) for r, name in rows]

    # --- retiring --------------------------------------------------------------
    def retire(self, ctx: RequestContext, ref: str, version: int, *, reason: str = "",
               contents: bool = False) -> dict[str, Any]:
        """Start retiring a version (held as `key.retire`). Refused for the newest version
        while Active, for a destroyed one, and while one runs or after one completed."""
        self._policy.require(ctx, Permission.KEYS_DESTROY, action="key.retire", object_type="key", object_id=ref)
        if len(reason) > MAX_REASON:
            self._refuse(ctx, "key.retire", ref, InvalidInput(f"the reason is longer than {MAX_REASON} characters",
                                                              code="invalid_input"))
        try:
            with self._db() as s:
                self._may_retire(s, ref, version)
        except (Conflict, NotFound) as exc:
            self._audit_refusal(ctx, "key.retire", ref, version, exc)  # after the read: one transaction a thread
            raise
        if self._approvals is not None:
            self._approvals.hold(ctx, action="key.retire", target=ref,
                                 params={"key": ref, "version": version, "reason": reason, "contents": contents})
        # The counts at the start go into the signed statement: a data key issued a moment
        # ago is counted once its record is chained (outside the transaction, decision 0010).
        self._chain_pending()
        now = self._now()
        with self._audit.transaction() as s:
            key = self._key(s, ref, lock=True)  # one retirement per version, whoever asks at once
            try:
                self._may_retire(s, ref, version, key=key)
            except CoreError as exc:
                self._audit.record_after(s, ctx, action="key.retire", outcome="denied", object_type="key",
                                         object_id=str(key.id), details={"version": version, "reason": exc.code})
                raise
            initial = compute(s, key, version, None, now).kinds
            row = VersionRetirement(id=uuid.uuid4(), key_id=key.id, version=version, state="running",
                                    reason=reason, contents=contents, requested_by=ctx.principal.name,
                                    requested_at=now, initial=initial)
            s.add(row)
            guard_points = list(s.execute(select(GuardPoint.id).where(GuardPoint.key_id == key.id)).scalars())
            self._notifier.publish(s, Topic.KEYS)  # agents list the key's retiring versions
            self._audit.add(s, ctx, action="key.retire", object_type="key", object_id=str(key.id),
                            details={"name": key.name, "version": version, "retirement": str(row.id),
                                     "reason": reason, "contents": contents, "initial": initial})
            retirement_id, name = row.id, key.name
        if contents:
            # The server's own request, on the retirement's behalf: new file keys under the
            # Active version, contents re-encrypted (the agents resume it across restarts).
            for gp_id in guard_points:
                self._guard_points.request_rekey(system_context("retirement"), gp_id)
        self._try_complete(retirement_id)
        with self._db() as s:
            fresh = s.get(VersionRetirement, retirement_id)
            assert fresh is not None
            return retirement_dict(fresh, name)

    def _may_retire(self, s: Session, ref: str, version: int, key: ManagedKey | None = None) -> None:
        """Why a retirement could not run (raised), checked before anything is held."""
        key = key or self._key(s, ref)
        v = self._version(key, version)
        if KeyState(v.state) in DESTROYED_STATES:
            raise Conflict(f"version {version} of '{key.name}' is destroyed already", code="version_destroyed")
        if v.state == KeyState.ACTIVE.value and v is key.versions[-1]:
            raise Conflict(f"version {version} of '{key.name}' is its Active version: rotate the key first, "
                           "then retire the old version", code="version_active")
        current = current_retirement(s, key.id, version)
        if current is not None and current.state == "running":
            raise Conflict(f"version {version} of '{key.name}' is being retired already (retirement "
                           f"{current.id})", code="retirement_running")
        if current is not None and current.state == "complete":
            raise Conflict(f"version {version} of '{key.name}' is retired (retirement {current.id}, "
                           f"statement at seq {current.statement_seq}); destroy it", code="version_retired")

    def exclude(self, ctx: RequestContext, ref: str, version: int, *, kind: str, holder: str,
                reason: str) -> dict[str, Any]:
        """Declare a holder clear of the version (held as `key.retire_exclude`): the
        statement lists it with the reason and who said so."""
        action = "key.retire_exclude"
        self._policy.require(ctx, Permission.KEYS_DESTROY, action=action, object_type="key", object_id=ref)
        if kind not in EXCLUDABLE:
            self._refuse(ctx, action, ref, InvalidInput(
                f"kind is one of {', '.join(sorted(EXCLUDABLE))}", code="invalid_kind"))
        if not reason.strip() or len(reason) > MAX_REASON:
            self._refuse(ctx, action, ref, InvalidInput(
                f"say why the holder holds nothing (1-{MAX_REASON} characters)", code="reason_required"))
        try:
            with self._db() as s:
                holder = self._excludable(s, ref, version, kind, holder)
        except (Conflict, NotFound) as exc:
            self._audit_refusal(ctx, action, ref, version, exc)
            raise
        if self._approvals is not None:
            self._approvals.hold(ctx, action=action, target=ref, params={
                "key": ref, "version": version, "kind": kind, "holder": holder, "reason": reason})
        with self._audit.transaction() as s:
            key = self._key(s, ref, lock=True)
            retirement = self._running(s, key, version)
            if retirement is None or any(x.kind == kind and x.holder == holder for x in retirement.exclusions):
                self._audit.record_after(s, ctx, action=action, outcome="denied", object_type="key",
                                         object_id=str(key.id), details={"version": version, "kind": kind,
                                                                          "holder": holder, "reason": "changed"})
                raise Conflict("the retirement ended or the holder was excluded meanwhile; look again",
                               code="retirement_changed")
            s.add(RetirementExclusion(id=uuid.uuid4(), retirement_id=retirement.id, kind=kind, holder=holder,
                                      reason=reason, excluded_by=ctx.principal.name, excluded_at=self._now()))
            self._audit.add(s, ctx, action=action, object_type="key", object_id=str(key.id),
                            details={"name": key.name, "version": version, "retirement": str(retirement.id),
                                     "kind": kind, "holder": holder, "reason": reason})
            retirement_id, name = retirement.id, key.name
        self._try_complete(retirement_id)
        with self._db() as s:
            fresh = s.get(VersionRetirement, retirement_id)
            assert fresh is not None
            return retirement_dict(fresh, name)

    def _excludable(self, s: Session, ref: str, version: int, kind: str, holder: str) -> str:
        """The holder as the exclusion names it (a host by its id), or why it cannot be excluded."""
        key = self._key(s, ref)
        self._version(key, version)
        retirement = self._running(s, key, version)
        if retirement is None:
            raise Conflict(f"version {version} of '{key.name}' is not being retired: retire it first",
                           code="retirement_not_running")
        inv = compute(s, key, version, retirement, self._now())
        if kind == "host":
            named = {h.host_id for h in inv.holders if h.host_id and holder in (h.host_id, h.host)}
            found = next(iter(named), None) if len(named) == 1 else None
        else:
            found = next((h.holder for h in inv.holders if h.kind == kind and h.holder == holder), None)
        if found is None:
            raise NotFound(f"no {kind} '{holder}' holds version {version} of '{key.name}'",
                           code="holder_not_found")
        if any(x.kind == kind and x.holder == found for x in retirement.exclusions):
            raise Conflict(f"{kind} '{holder}' is excluded already", code="holder_excluded")
        return found

    def cancel(self, ctx: RequestContext, ref: str, version: int) -> dict[str, Any]:
        """Stop a running retirement; nothing is undone (holders stay on the newest version)."""
        action = "key.retire_cancel"
        self._policy.require(ctx, Permission.KEYS_DESTROY, action=action, object_type="key", object_id=ref)
        with self._audit.transaction() as s:
            try:
                key = self._key(s, ref, lock=True)
                self._version(key, version)
            except NotFound as exc:
                self._audit.record_after(s, ctx, action=action, outcome="denied", object_type="key", object_id=ref,
                                         details={"version": version, "reason": exc.code})
                raise
            retirement = self._running(s, key, version)
            if retirement is None:
                self._audit.record_after(s, ctx, action=action, outcome="denied", object_type="key",
                                         object_id=str(key.id),
                                         details={"version": version, "reason": "retirement_not_running"})
                raise Conflict(f"version {version} of '{key.name}' has no running retirement to cancel",
                               code="retirement_not_running")
            retirement.state, retirement.cancelled_at, retirement.cancelled_by = (
                "cancelled", self._now(), ctx.principal.name)
            self._notifier.publish(s, Topic.KEYS)
            self._audit.add(s, ctx, action=action, object_type="key", object_id=str(key.id),
                            details={"name": key.name, "version": version, "retirement": str(retirement.id)})
            return retirement_dict(retirement, key.name)

    # --- completing ------------------------------------------------------------
    def run_due(self) -> int:
        """The scheduler's turn: complete every running retirement whose inventory is
        clear, and note the seq of statements chained since. Returns how many completed."""
        with self._db() as s:
            running = list(s.execute(select(VersionRetirement.id).where(
                VersionRetirement.state == "running")).scalars())
            unsequenced = list(s.execute(select(VersionRetirement.id).where(
                VersionRetirement.state == "complete", VersionRetirement.statement_seq.is_(None))).scalars())
        if not running and not unsequenced:
            return 0  # the common case: no chain flush, no head lock taken every interval
        self._chain_pending()
        done = 0
        for rid in running:
            try:
                done += self._try_complete(rid, chained=True)
            except CoreError as exc:
                log.warning("retirement %s not completed now: %s", rid, exc.message)
        for rid in unsequenced:
            self._note_seq(rid)
        return done

    def _try_complete(self, retirement_id: uuid.UUID, *, chained: bool = False) -> bool:
        if not chained:
            self._chain_pending()  # every allowed use so far counted before it is judged
        ctx = system_context("retirement")
        with self._db.begin() as s:
            r = s.execute(select(VersionRetirement).where(VersionRetirement.id == retirement_id)
                          .with_for_update()).scalar_one_or_none()
            if r is None or r.state != "running":
                return False
            key = self._key(s, str(r.key_id))
            now = self._now()
            inv = compute(s, key, r.version, r, now)
            if inv.blocking:
                return False
            statement = self._statement(s, r, key, inv, now)
            signature, fingerprint = self._audit.sign_statement(canonical_statement(statement))
            assert fingerprint == statement["signing_key"]
            r.state, r.completed_at = "complete", now
            self._notifier.publish(s, Topic.KEYS)  # agents stop walking for it
            self._audit.add(s, ctx, action=RETIRED_ACTION, object_type="key", object_id=str(key.id),
                            details={"version": r.version, "statement": statement, "signature": signature})
        self._note_seq(retirement_id)
        return True

    def _statement(self, s: Session, r: VersionRetirement, key: ManagedKey, inv: Inventory,
                   now: datetime) -> dict[str, Any]:
        head = s.get(AuditHead, 1)
        # The version's KMIP identifier: a wrap or unwrap under it names only that, so the
        # offline verifier must be told it to see such a use after the statement.
        uid = next((str(v.id) for v in key.versions if v.version == r.version), None)
        return {
            "type": STATEMENT_TYPE, "key_id": str(key.id), "key": key.name, "version": r.version,
            "kmip_uid": uid,
            "retirement": str(r.id), "requested_at": r.requested_at.isoformat(), "completed_at": now.isoformat(),
            "initial": dict(r.initial or {}), "counts": inv.kinds,
            "excluded": [{"kind": x.kind, "holder": x.holder, "reason": x.reason, "by": x.excluded_by}
                         for x in r.exclusions],
            "hosts": sorted({h.host for h in inv.holders if h.host and h.reported_at is not None
                             and h.state == "clear"}),
            # Files no version of the key decrypts hold none of this one and block nothing,
            # but the proof names where they are rather than passing over them.
            "unreadable": inv.unreadable,
            "chain": {"seq": head.seq if head else 0, "hash": head.hash if head else ""},
            "signing_key": key_fingerprint(self._audit.public_key_der()),
        }

    def _note_seq(self, retirement_id: uuid.UUID) -> None:
        """Put the statement's seq on its retirement once the record is chained (now, or
        at a later scheduler turn while the chain cannot move)."""
        if not self._chain_pending():
            return
        with self._db.begin() as s:
            r = s.get(VersionRetirement, retirement_id)
            if r is None or r.statement_seq is not None:
                return
            rows = s.execute(select(AuditEvent.seq, AuditEvent.details).where(
                AuditEvent.action == RETIRED_ACTION, AuditEvent.object_id == str(r.key_id))
                .order_by(AuditEvent.seq.desc())).all()
            r.statement_seq = next((seq for seq, d in rows
                                    if (d or {}).get("statement", {}).get("retirement") == str(r.id)), None)

    def _chain_pending(self) -> bool:
        try:
            self._audit.flush()
        except ServiceUnavailable as exc:
            log.warning("audit chain not flushed for a retirement: %s", exc.message)
            return False
        return True

    # --- helpers ---------------------------------------------------------------
    @staticmethod
    def _key(s: Session, ref: str, *, lock: bool = False) -> ManagedKey:
        stmt = select(ManagedKey).where(key_filter(ref))
        key = s.execute(stmt.with_for_update() if lock else stmt).scalar_one_or_none()
        if key is None:
            raise NotFound(f"no key named or with id '{ref}'", code="key_not_found")
        return key

    @staticmethod
    def _version(key: ManagedKey, version: int) -> KeyVersion:
        v = next((x for x in key.versions if x.version == version), None)
        if v is None:
            raise NotFound(f"key '{key.name}' has no version {version}", code="version_not_found")
        return v

    @staticmethod
    def _running(s: Session, key: ManagedKey, version: int) -> VersionRetirement | None:
        r = current_retirement(s, key.id, version)
        return r if r is not None and r.state == "running" else None

    def _audit_refusal(self, ctx: RequestContext, action: str, ref: str, version: int, exc: CoreError) -> None:
        self._audit.record_now(ctx, action=action, outcome="denied", object_type="key", object_id=ref,
                               details={"version": version, "reason": exc.code})

    def _refuse(self, ctx: RequestContext, action: str, ref: str, exc: CoreError) -> None:
        self._audit.record_now(ctx, action=action, outcome="denied", object_type="key", object_id=ref,
                               details={"reason": exc.code})
        raise exc
