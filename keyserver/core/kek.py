"""Key-encryption keys: which HSM KEK is current, KEK rotation and KEK retirement.

Rotation creates a new KEK and then re-wraps everything wrapped under the others, kind
by kind (`KINDS`: key versions, KMIP sealed objects' DEKs, the internal CA's DEK, TOTP
secrets' DEKs), in batches. Each stored blob names the KEK that wrapped it, so during
the re-wrap every KEK still in the token serves reads and nothing is ever unreadable;
the work is resumable after a crash because the rows themselves say what is left.

A batch is read, re-wrapped in the HSM with no transaction open, then written back
only where the row still holds the blob that was re-wrapped (a row destroyed or
re-wrapped meanwhile is left as it is now), so the write transaction is short and a
second replica working on the same rotation can only waste a little HSM time.

Retirement removes a superseded KEK from the token, refused (with the list) while
anything still names it, while it is the active one, or while a rotation runs.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Select, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import InstrumentedAttribute, Session, sessionmaker

from hsm import HsmBackend, HsmError, HsmKeyNotFound, WrappedKey
from keyserver.core.approvals import ApprovalService
from keyserver.core.audit import AuditService, utcnow
from keyserver.core.errors import Conflict, NotFound, ServiceUnavailable, hsm_failure
from keyserver.core.identity import totp_dek, with_totp_dek
from keyserver.core.permissions import Permission
from keyserver.core.policy import Policy
from keyserver.core.principal import RequestContext, system_context
from keyserver.store.models import Kek, KekRotation, KeyVersion, KmipCa, KmipSealedObject, User
from keyserver.store.notify import Notifier, Topic
from keyserver.store.xks import XksStore

log = logging.getLogger(__name__)

# How many ids a refusal lists per kind (the count is always complete).
FIRST_IDS = 5


@dataclass(frozen=True, slots=True)
class Wrapped:
    """One row's blob as read: its id (for people), its primary key, the blob."""

    label: str
    pk: Any
    blob: WrappedKey


class Kind(Protocol):
    """One kind of thing stored wrapped under a KEK."""

    @property
    def name(self) -> str: ...

    @property
    def title(self) -> str: ...

    def pending(self, s: Session, *, target: str, limit: int) -> list[Wrapped]:
        """Up to `limit` rows whose blob is not under `target`."""

    def count(self, s: Session, *, not_under: str | None = None, under: str | None = None) -> int: ...

    def under(self, s: Session, kek_id: str, *, limit: int) -> list[str]:
        """The labels of the first rows wrapped under `kek_id`."""

    def store(self, s: Session, row: Wrapped, after: WrappedKey) -> bool:
        """Write `after` where the row still holds `row.blob`; whether it did."""


@dataclass(frozen=True)
class ColumnKind:
    """A kind whose blob is three columns of its rows (KEK id, mechanism, ciphertext)."""

    name: str
    title: str
    model: type[Any]
    kek: InstrumentedAttribute[Any]
    mechanism: InstrumentedAttribute[Any]
    ciphertext: InstrumentedAttribute[Any]
    label: Callable[[Any], str]

    def _rows(self, *conditions: Any) -> Select[Any]:
        return select(self.model).where(self.ciphertext.is_not(None), *conditions)

    def pending(self, s: Session, *, target: str, limit: int) -> list[Wrapped]:
        (pk,) = self.model.__mapper__.primary_key
        rows = s.execute(self._rows(self.kek != target).order_by(pk).limit(limit)).scalars()
        return [Wrapped(self.label(r), getattr(r, pk.key),
                        WrappedKey(getattr(r, self.kek.key), getattr(r, self.mechanism.key),
                                   getattr(r, self.ciphertext.key))) for r in rows]

    def count(self, s: Session, *, not_under: str | None = None, under: str | None = None) -> int:
        stmt = select(func.count()).select_from(self.model).where(self.ciphertext.is_not(None))
        if not_under is not None:
            stmt = stmt.where(self.kek != not_under)
        if under is not None:
            stmt = stmt.where(self.kek == under)
        return int(s.execute(stmt).scalar_one())

    def under(self, s: Session, kek_id: str, *, limit: int) -> list[str]:
        (pk,) = self.model.__mapper__.primary_key
        rows = s.execute(self._rows(self.kek == kek_id).order_by(pk).limit(limit)).scalars()
        return [self.label(r) for r in rows]

    def store(self, s: Session, row: Wrapped, after: WrappedKey) -> bool:
        (pk,) = self.model.__mapper__.primary_key
        result = s.execute(
            update(self.model)
            .where(pk == row.pk, self.kek == row.blob.wrapping_key_id, self.ciphertext == row.blob.ciphertext)
            .values({self.kek.key: after.wrapping_key_id, self.mechanism.key: after.mechanism,
                     self.ciphertext.key: after.ciphertext})
            .execution_options(synchronize_session=False))
        return bool(result.rowcount)  # type: ignore[attr-defined]


class TotpKind:
    """TOTP secrets: sealed under a DEK kept in the user's `totp` JSON (core/identity.py).
    JSON is not portably queryable, and accounts are few: filtered here."""

    name = "totp_secrets"
    title = "TOTP secrets"

    @staticmethod
    def _all(s: Session) -> list[tuple[uuid.UUID, str, dict[str, Any]]]:
        rows = s.execute(select(User.id, User.username, User.totp).order_by(User.username)).all()
        return [(uid, name, totp) for uid, name, totp in rows if totp and "dek" in totp]

    def pending(self, s: Session, *, target: str, limit: int) -> list[Wrapped]:
        return [Wrapped(name, uid, totp_dek(totp)) for uid, name, totp in self._all(s)
                if totp["dek_kek"] != target][:limit]

    def count(self, s: Session, *, not_under: str | None = None, under: str | None = None) -> int:
        return sum(1 for _, _, t in self._all(s)
                   if (not_under is None or t["dek_kek"] != not_under) and (under is None or t["dek_kek"] == under))

    def under(self, s: Session, kek_id: str, *, limit: int) -> list[str]:
        return [name for _, name, totp in self._all(s) if totp["dek_kek"] == kek_id][:limit]

    def store(self, s: Session, row: Wrapped, after: WrappedKey) -> bool:
        # Under the row lock, merged into what is there now: a sign-in may have moved
        # last_step meanwhile, and must not lose it (nor put the old DEK back).
        user = s.get(User, row.pk, with_for_update=True)
        if user is None or not user.totp or "dek" not in user.totp or totp_dek(user.totp) != row.blob:
            return False
        user.totp = with_totp_dek(user.totp, after)
        return True


KINDS: Sequence[Kind] = (
    ColumnKind("key_versions", "key versions", KeyVersion, KeyVersion.wrapping_key_id,
               KeyVersion.wrapping_mechanism, KeyVersion.wrapped_key, lambda v: f"{v.key_id}/v{v.version}"),
    ColumnKind("kmip_objects", "KMIP private keys, secret data and opaque objects", KmipSealedObject,
               KmipSealedObject.dek_wrapping_key_id, KmipSealedObject.dek_mechanism,
               KmipSealedObject.dek_ciphertext, lambda o: str(o.id)),
    ColumnKind("ca", "the internal CA's key", KmipCa, KmipCa.dek_wrapping_key_id, KmipCa.dek_mechanism,
               KmipCa.dek_wrapped, lambda _: "kmip-ca"),
    TotpKind(),
    ColumnKind("xks_credentials", "AWS XKS proxy credentials (sealed SigV4 secrets)", XksStore,
               XksStore.secret_dek_wrapping_key_id, XksStore.secret_dek_mechanism, XksStore.secret_dek,
               lambda r: f"xks:{r.name}"),
    ColumnKind("xks_previous_credentials", "AWS XKS proxy credentials being rotated out", XksStore,
               XksStore.previous_dek_wrapping_key_id, XksStore.previous_dek_mechanism, XksStore.previous_dek,
               lambda r: f"xks:{r.name}:previous"),
)


class KekService:
    def __init__(
        self,
        session_factory: sessionmaker[Session],
        hsm: HsmBackend,
        audit: AuditService,
        policy: Policy,
        notifier: Notifier,
        *,
        batch: int = 200,
        approvals: ApprovalService | None = None,
        now: Callable[[], datetime] = utcnow,
    ) -> None:
        self._approvals = approvals
        self._db = session_factory
        self._hsm = hsm
        self._audit = audit
        self._policy = policy
        self._notifier = notifier
        self._batch = batch
        self._now = now
        self._worker_lock = threading.Lock()

    def ensure_initialized(self) -> str:
        """Create the first KEK if there is none (idempotent; safe in several replicas)."""
        with self._db() as s:
            current = s.execute(select(Kek.kek_id).where(Kek.state == "active")).scalar_one_or_none()
        if current is not None:
            return current
        kek_id = self._new_kek()
        try:
            with self._db.begin() as s:
                if s.execute(select(Kek.kek_id).where(Kek.state == "active")).first():
                    raise IntegrityError("race", None, Exception())
                s.add(Kek(kek_id=kek_id, state="active", created_at=self._now()))
                self._audit.add(s, system_context(), action="kek.create", object_type="kek",
                                object_id=kek_id)
        except IntegrityError:
            pass  # another replica won; the HSM key we made stays unused
        return self.current()

    def _new_kek(self) -> str:
        kek_id = f"kek-{self._now():%Y%m%d}-{uuid.uuid4().hex[:8]}"
        try:
            self._hsm.create_kek(kek_id)
        except HsmError as exc:
            raise hsm_failure("create a KEK", exc) from exc
        return kek_id

    def current(self) -> str:
        with self._db() as s:
            kek_id = s.execute(select(Kek.kek_id).where(Kek.state == "active")).scalar_one_or_none()
        if kek_id is None:
            raise ServiceUnavailable("no key-encryption key: run `keyserver init`")
        return kek_id

    def status(self, ctx: RequestContext) -> dict[str, object]:
        self._policy.require(ctx, Permission.SYSTEM_READ, action="kek.status")
        with self._db() as s:
            keks = list(s.execute(select(Kek).order_by(Kek.created_at)).scalars())
            wrapped = {k.kek_id: {kind.name: kind.count(s, under=k.kek_id) for kind in KINDS}
                       for k in keks if k.state != "retired"}
            latest = select(KekRotation).order_by(KekRotation.started_at.desc()).limit(1)
            rotation = s.execute(latest).scalar_one_or_none()
        return {
            "keks": [{"kek_id": k.kek_id, "state": k.state, "created_at": k.created_at,
                      "superseded_at": k.superseded_at, "retired_at": k.retired_at, "retired_by": k.retired_by,
                      "wrapped": wrapped.get(k.kek_id, {}),
                      "wrapped_versions": wrapped.get(k.kek_id, {}).get("key_versions", 0)} for k in keks],
            "last_rotation": rotation,
        }

    # --- rotation ----------------------------------------------------------------
    def start_rotation(self, ctx: RequestContext) -> KekRotation:
        self._policy.require(ctx, Permission.SYSTEM_KEK, action="kek.rotate", object_type="kek")
        if self._approvals is not None:
            self._approvals.hold(ctx, action="kek.rotate", target="kek", params={})
        with self._db() as s:
            if s.execute(select(KekRotation.id).where(KekRotation.state == "running")).first():
                raise Conflict("a KEK rotation is already running; wait for it to finish",
                               code="rotation_running")
        new_id = self._new_kek()
        now = self._now()
        with self._db.begin() as s:
            old = s.execute(select(Kek).where(Kek.state == "active").with_for_update()).scalar_one()
            old.state = "retiring"
            s.add(Kek(kek_id=new_id, state="active", created_at=now))
            progress = {kind.name: {"done": 0, "total": kind.count(s, not_under=new_id)} for kind in KINDS}
            total = sum(p["total"] for p in progress.values())
            rot = KekRotation(id=uuid.uuid4(), from_kek_id=old.kek_id, to_kek_id=new_id,
                              state="running", started_at=now, total=total, done=0, progress=progress,
                              requested_by=ctx.principal.name)
            s.add(rot)
            self._audit.add(s, ctx, action="kek.rotate", object_type="kek", object_id=new_id,
                            details={"from": old.kek_id, "to": new_id,
                                     **{name: p["total"] for name, p in progress.items()}})
        return rot

    def get_rotation(self, ctx: RequestContext, rotation_id: uuid.UUID) -> KekRotation:
        self._policy.require(ctx, Permission.SYSTEM_READ, action="kek.status")
        with self._db() as s:
            rot = s.get(KekRotation, rotation_id)
        if rot is None:
            raise NotFound(f"no KEK rotation {rotation_id}", code="rotation_not_found")
        return rot

    def resume_rotations(self, *, max_batches: int | None = None) -> int:
        """Re-wrap what is left of running rotations, at most `max_batches` batches
        (None: to the end); returns how many blobs were re-wrapped."""
        if not self._worker_lock.acquire(blocking=False):
            return 0
        try:
            with self._db() as s:
                running = list(s.execute(select(KekRotation.id).where(KekRotation.state == "running")).scalars())
            return sum(self._work(rid, max_batches) for rid in running)
        finally:
            self._worker_lock.release()

    def _work(self, rotation_id: uuid.UUID, max_batches: int | None) -> int:
        done, batches = 0, 0
        while max_batches is None or batches < max_batches:
            with self._db() as s:
                target = s.execute(select(KekRotation.to_kek_id).where(
                    KekRotation.id == rotation_id, KekRotation.state == "running")).scalar_one_or_none()
                if target is None:
                    return done
                kind, rows = next(((k, r) for k in KINDS if (r := k.pending(s, target=target, limit=self._batch))),
                                  (None, []))
            if kind is None:
                self._complete(rotation_id)
                return done
            try:
                moved = [(row, self._hsm.rewrap_under_kek(row.blob, kek_id=target)) for row in rows]
            except HsmError as exc:
                # Nothing of this batch is written; the rotation resumes later.
                log.warning("KEK rotation %s paused: %s", rotation_id, exc)
                raise hsm_failure("re-wrap for the KEK rotation (paused; it resumes by itself)", exc) from exc
            with self._db.begin() as s:
                written = [row for row, after in moved if kind.store(s, row, after)]
                rot = s.get(KekRotation, rotation_id, with_for_update=True)
                assert rot is not None
                entry = dict(rot.progress.get(kind.name, {"done": 0, "total": 0}))
                entry["done"] += len(written)
                # Rows written under the old KEK after the rotation began count too.
                entry["total"] = max(entry["total"], entry["done"])
                rot.progress = {**rot.progress, kind.name: entry}
                rot.done = sum(p["done"] for p in rot.progress.values())
                rot.total = sum(p["total"] for p in rot.progress.values())
                self._notifier.publish(s, Topic.KEYS)  # replicas drop cached rows holding the old blobs
            for row in written:
                self._hsm.forget(row.blob)
            done += len(written)
            batches += 1
        return done

    def _complete(self, rotation_id: uuid.UUID) -> None:
        now = self._now()
        with self._db.begin() as s:
            rot = s.get(KekRotation, rotation_id, with_for_update=True)
            if rot is None or rot.state != "running":
                return
            rot.state, rot.finished_at = "completed", now
            for kek in s.execute(select(Kek).where(Kek.state == "retiring")).scalars():
                kek.state, kek.superseded_at = "superseded", now
            self._notifier.publish(s, Topic.KEYS)
            self._audit.add(s, system_context("kek-rotation"), action="kek.rotation_completed",
                            object_type="kek", object_id=rot.to_kek_id,
                            details={"rewrapped": rot.done, **{n: p["done"] for n, p in rot.progress.items()}})

    # --- retirement --------------------------------------------------------------
    def retire(self, ctx: RequestContext, kek_id: str) -> Kek:
        """Remove a superseded KEK from the token for good, once nothing names it."""
        self._policy.require(ctx, Permission.SYSTEM_KEK, action="kek.retire", object_type="kek", object_id=kek_id)
        with self._db() as s:
            kek = s.get(Kek, kek_id)
            running = s.execute(select(KekRotation).where(KekRotation.state == "running")).scalars().first()
            references = [{"kind": kind.name, "count": n, "first": kind.under(s, kek_id, limit=FIRST_IDS)}
                          for kind in KINDS if (n := kind.count(s, under=kek_id))]
        refusal = self._refusal(kek_id, kek, running, references)
        if refusal is not None:
            self._audit.record_now(ctx, action="kek.retire", outcome="error", object_type="kek", object_id=kek_id,
                                   details={"reason": refusal.code, "references": references})
            raise refusal
        # Held after the checks, so nobody is asked to approve what cannot run; checked
        # again when it runs, approved.
        if self._approvals is not None:
            self._approvals.hold(ctx, action="kek.retire", target=kek_id, params={"kek_id": kek_id})
        try:
            self._hsm.destroy_kek(kek_id)
            absent = False
        except HsmKeyNotFound:
            absent = True  # gone already (an earlier retirement stopped before writing it down)
        except HsmError as exc:
            self._audit.record_now(ctx, action="kek.retire", outcome="error", object_type="kek", object_id=kek_id,
                                   details={"reason": "hsm_unavailable"})
            raise hsm_failure(f"remove KEK {kek_id} from the token", exc) from exc
        now = self._now()
        with self._db.begin() as s:
            row = s.get(Kek, kek_id, with_for_update=True)
            assert row is not None
            row.state, row.retired_at, row.retired_by = "retired", now, ctx.principal.name
            self._notifier.publish(s, Topic.KEYS)
            self._audit.add(s, ctx, action="kek.retire", object_type="kek", object_id=kek_id,
                            details={"already_absent_from_token": absent} if absent else None)
        log.warning("KEK %s retired by %s: removed from the token", kek_id, ctx.principal.name)
        return row

    @staticmethod
    def _refusal(kek_id: str, kek: Kek | None, running: KekRotation | None,
                 references: list[dict[str, Any]]) -> Conflict | NotFound | None:
        if kek is None:
            return NotFound(f"no KEK {kek_id}: GET /api/v1/system/kek lists them", code="kek_not_found")
        if kek.state == "retired":
            return Conflict(f"KEK {kek_id} was retired at {kek.retired_at:%Y-%m-%d %H:%M} UTC by {kek.retired_by}",
                            code="kek_retired")
        if kek.state == "active":
            return Conflict(f"KEK {kek_id} is the active KEK: rotate to a new one first (`keyserver rotate-kek`), "
                            "then retire this one", code="kek_active")
        if references:
            titles = {kind.name: kind.title for kind in KINDS}
            listed = "; ".join(f"{titles[r['kind']]}: {r['count']} ({', '.join(r['first'])}"
                               f"{', ...' if r['count'] > len(r['first']) else ''})" for r in references)
            then = (f"Rotation {running.id} is re-wrapping them ({running.done} of {running.total} done): retire "
                    "this KEK once it has finished" if running is not None else
                    "Rotate the KEK again (`keyserver rotate-kek`) to re-wrap them under a new one, then retire "
                    "this one")
            return Conflict(f"KEK {kek_id} still wraps {listed}. {then}", code="kek_in_use", errors=references)
        if running is not None:
            return Conflict(f"KEK rotation {running.id} is still running ({running.done} of {running.total} "
                            "re-wrapped): retire once it has finished", code="rotation_running")
        return None
