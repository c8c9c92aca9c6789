"""Key-encryption keys: which HSM KEK is current, and KEK rotation.

Rotation creates a new KEK and then re-wraps every stored version in batches. Each
version row names the KEK that wrapped it, so during the re-wrap both KEKs serve
reads and no key is ever unreadable; the work is resumable after a restart because
the rows themselves say what is left.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from hsm import HsmBackend, HsmError, WrappedKey
from keyserver.core.approvals import ApprovalService
from keyserver.core.audit import AuditService, utcnow
from keyserver.core.errors import Conflict, NotFound, ServiceUnavailable, hsm_failure
from keyserver.core.policy import Permission, Policy
from keyserver.core.principal import RequestContext, system_context
from keyserver.store.models import Kek, KekRotation, KeyVersion
from keyserver.store.notify import Notifier, Topic

log = logging.getLogger(__name__)


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
            counts = dict(s.execute(
                select(KeyVersion.wrapping_key_id, func.count())
                .where(KeyVersion.wrapped_key.is_not(None)).group_by(KeyVersion.wrapping_key_id)
            ).all())
            latest = select(KekRotation).order_by(KekRotation.started_at.desc()).limit(1)
            rotation = s.execute(latest).scalar_one_or_none()
        return {
            "keks": [{"kek_id": k.kek_id, "state": k.state, "created_at": k.created_at,
                      "retired_at": k.retired_at, "wrapped_versions": counts.get(k.kek_id, 0)} for k in keks],
            "last_rotation": rotation,
        }

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
            total = s.execute(select(func.count()).select_from(KeyVersion).where(
                KeyVersion.wrapped_key.is_not(None), KeyVersion.wrapping_key_id != new_id)).scalar_one()
            rot = KekRotation(id=uuid.uuid4(), from_kek_id=old.kek_id, to_kek_id=new_id,
                              state="running", started_at=now, total=int(total), done=0,
                              requested_by=ctx.principal.name)
            s.add(rot)
            self._audit.add(s, ctx, action="kek.rotate", object_type="kek", object_id=new_id,
                            details={"from": old.kek_id, "to": new_id, "versions": int(total)})
        return rot

    def get_rotation(self, ctx: RequestContext, rotation_id: uuid.UUID) -> KekRotation:
        self._policy.require(ctx, Permission.SYSTEM_READ, action="kek.status")
        with self._db() as s:
            rot = s.get(KekRotation, rotation_id)
        if rot is None:
            raise NotFound(f"no KEK rotation {rotation_id}", code="rotation_not_found")
        return rot

    def resume_rotations(self) -> int:
        """Re-wrap whatever is left of running rotations; returns versions re-wrapped."""
        if not self._worker_lock.acquire(blocking=False):
            return 0
        try:
            with self._db() as s:
                running = list(s.execute(select(KekRotation.id).where(KekRotation.state == "running")).scalars())
            return sum(self._work(rid) for rid in running)
        finally:
            self._worker_lock.release()

    def _work(self, rotation_id: uuid.UUID) -> int:
        done = 0
        while True:
            with self._db.begin() as s:
                rot = s.get(KekRotation, rotation_id)
                assert rot is not None
                stmt = (select(KeyVersion).where(KeyVersion.wrapped_key.is_not(None),
                                                 KeyVersion.wrapping_key_id != rot.to_kek_id)
                        .limit(self._batch))
                if s.get_bind().dialect.name == "postgresql":
                    stmt = stmt.with_for_update(skip_locked=True)
                batch = list(s.execute(stmt).scalars())
                if not batch:
                    rot.state, rot.finished_at = "completed", self._now()
                    for kek in s.execute(select(Kek).where(Kek.state == "retiring")).scalars():
                        kek.state, kek.retired_at = "retired", self._now()
                    self._audit.add(s, system_context("kek-rotation"), action="kek.rotation_completed",
                                    object_type="kek", object_id=rot.to_kek_id,
                                    details={"rewrapped": rot.done})
                    return done
                old: list[WrappedKey] = []
                try:
                    for v in batch:
                        assert v.wrapped_key is not None and v.wrapping_key_id and v.wrapping_mechanism
                        before = WrappedKey(v.wrapping_key_id, v.wrapping_mechanism, v.wrapped_key)
                        after = self._hsm.rewrap_under_kek(before, kek_id=rot.to_kek_id)
                        v.wrapped_key, v.wrapping_key_id, v.wrapping_mechanism = (
                            after.ciphertext, after.wrapping_key_id, after.mechanism)
                        old.append(before)
                except HsmError as exc:
                    # Nothing of this batch is committed; the rotation resumes later.
                    log.warning("KEK rotation %s paused: %s", rotation_id, exc)
                    raise hsm_failure("re-wrap for the KEK rotation (paused; it resumes by itself)", exc) from exc
                rot.done += len(batch)
                done += len(batch)
                self._notifier.publish(s, Topic.KEYS)
            for w in old:
                self._hsm.forget(w)
