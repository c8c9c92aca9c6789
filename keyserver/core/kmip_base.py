"""The KMIP object service's state and how it finds an object: by unique identifier
(a key version, a registered public key or a sealed object), the Get cache kept
current by notifications, and the policy check every lookup makes."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, joinedload, sessionmaker

from hsm import HsmBackend
from keyserver.core.approvals import ApprovalService
from keyserver.core.audit import AuditService, PendingRecord, utcnow
from keyserver.core.errors import (
    Conflict,
    NotFound,
)
from keyserver.core.keys import (
    key_filter,
)
from keyserver.core.kmip_model import (
    PAIR_GENERATIONS,
    StandaloneObject,
    VersionObject,
    VersionRef,
    audit_details,
    audit_identity,
    object_type_of,
)
from keyserver.core.kmip_tenancy import NOT_VISIBLE, KmipTenancy, Target, owns, right_for, scoped, target_of
from keyserver.core.names import UUID_RE
from keyserver.core.permissions import Permission
from keyserver.core.policy import Policy
from keyserver.core.principal import RequestContext
from keyserver.store.models import KeyVersion, KmipPublicKey, KmipSealedObject, ManagedKey
from keyserver.store.notify import Notifier, Topic


class KmipObjectBase:
    def __init__(
        self,
        session_factory: sessionmaker[Session],
        hsm: HsmBackend,
        audit: AuditService,
        policy: Policy,
        *,
        autocommit_engine: Engine | None = None,
        notifier: Notifier | None = None,
        cache_seconds: float = 30.0,
        current_kek: Callable[[], str] | None = None,
        approvals: ApprovalService | None = None,
        now: Callable[[], datetime] = utcnow,
    ) -> None:
        self._db = session_factory
        self._current_kek = current_kek
        self._approvals = approvals
        # Reads in autocommit: no BEGIN/ROLLBACK round trips around each lookup.
        self._read = session_factory if autocommit_engine is None else sessionmaker(
            autocommit_engine, expire_on_commit=False)
        self._hsm = hsm
        self._audit = audit
        self._policy = policy
        self._tenancy = KmipTenancy(self._read)
        self._now = now
        # Objects as Get needs them (state, wrapped material, length), per replica, the
        # way DataKeyService caches active versions (decision 0004): every change to a
        # version's state or material publishes a notification and all replicas drop the
        # cache. Only metadata and ciphertext are cached, never unwrapped material; tags
        # (which change without a notification) are never read from here.
        self._notifier = notifier
        self._cache_seconds = cache_seconds
        self._cache: dict[str, tuple[VersionObject | StandaloneObject, float]] = {}
        self._cache_lock = threading.Lock()
        self._generation = 0  # see KmipClientService: a lookup older than a clear is not cached
        # RSA key generation holds a pooled HSM session for up to seconds (4096 bits):
        # a burst of CreateKeyPair must not take every session from Get and Create.
        self._pair_slots = threading.BoundedSemaphore(PAIR_GENERATIONS)
        if notifier is not None:
            notifier.subscribe(Topic.KEYS, self._clear_cache)

    def _clear_cache(self) -> None:
        with self._cache_lock:
            self._generation += 1
            self._cache.clear()

    @property
    def rsa_wrap_mechanism(self) -> str:
        """The RSA-OAEP variant this token wraps with (SHA-1 on SoftHSM2, decision 0001)."""
        return self._hsm.capabilities.rsa_wrap_mechanism

    # --- resolving ---------------------------------------------------------------
    def _version(self, s: Session, uid: str) -> VersionObject | None:
        if not UUID_RE.match(uid):
            return None
        wanted = uuid.UUID(uid)
        # The key with all its versions in one statement: links need the siblings.
        key = s.execute(select(ManagedKey).options(joinedload(ManagedKey.versions))
                        .where(ManagedKey.id == select(KeyVersion.key_id).where(KeyVersion.id == wanted)
                               .scalar_subquery())).unique().scalar_one_or_none()
        if key is None:
            return None
        return VersionObject(key=key, version=next(v for v in key.versions if v.id == wanted))

    def _public_key(self, s: Session, uid: str) -> KmipPublicKey | None:
        if not UUID_RE.match(uid):
            return None
        return s.get(KmipPublicKey, uuid.UUID(uid))

    def _sealed(self, s: Session, uid: str) -> KmipSealedObject | None:
        if not UUID_RE.match(uid):
            return None
        return s.get(KmipSealedObject, uuid.UUID(uid))

    def _find(self, s: Session, uid: str) -> VersionObject | StandaloneObject | None:
        return self._version(s, uid) or self._public_key(s, uid) or self._sealed(s, uid)

    def resolve(self, ctx: RequestContext, uid: str, *, action: str = "kmip.read",
                permission: Permission = Permission.KEYS_READ, right: str | None = None,
                ) -> VersionObject | StandaloneObject:
        """The object behind `uid`, once `ctx` may `permission` on it and has the tenancy
        `right` (by default the permission's: kmip_tenancy.right_for) on it (a refusal is
        audited under the object's one identity: audit_identity)."""
        with self._read() as s:
            found = self._find(s, uid)
        self._require(ctx, permission, action, found, uid, right)
        if found is None:
            raise NotFound(f"no KMIP object with unique identifier '{uid}'", code="object_not_found")
        return found

    def version_ref(self, ctx: RequestContext, uid: str) -> VersionRef | None:
        """The key version `uid` names, by one indexed lookup, for a caller allowed to
        read keys; None otherwise (not a key version, unknown, or a caller `resolve`
        must refuse and audit), and the caller then goes through `resolve`. Cheaper than
        `resolve` (which loads the key and all its versions) for operations that load
        them again anyway, under the key's lock. A KMIP client gets it only for a key of its
        own (tenancy: any other goes through `resolve`, which looks up grants)."""
        if Permission.KEYS_READ not in ctx.principal.permissions or not UUID_RE.match(uid):
            return None
        stmt = select(KeyVersion.key_id, KeyVersion.version, ManagedKey.kmip_group, ManagedKey.owner).join(
            ManagedKey).where(KeyVersion.id == uuid.UUID(uid))
        with self._read() as s:
            row = s.execute(stmt).first()
        if row is None or (scoped(ctx.principal) and not owns(ctx.principal, Target("key", "", row[2], row[3]))):
            return None
        return VersionRef(key_id=row[0], version=row[1])

    def _require(self, ctx: RequestContext, permission: Permission, action: str,
                 found: VersionObject | StandaloneObject | None, uid: str, right: str | None = None) -> None:
        object_type, object_id = audit_identity(found) if found is not None else ("kmip_object", uid)
        self._policy.require(ctx, permission, action=action, object_type=object_type, object_id=object_id)
        if found is None or not scoped(ctx.principal):
            return
        target = target_of(found)
        if owns(ctx.principal, target):  # the hot path: no grant lookup
            return
        wanted = right or right_for(permission)
        granted = self._tenancy.rights(ctx.principal, found)
        if wanted in granted:
            return
        details: dict[str, object] = {"reason": NOT_VISIBLE, "right": wanted, "group": target.group}
        if not granted:
            self._policy.hide(ctx, action=action, object_type=object_type, object_id=object_id, details=details,
                              message=f"no KMIP object with unique identifier '{uid}'", code="object_not_found")
        details["reason"], details["granted"] = f"the client's grants do not include '{wanted}'", sorted(granted)
        self._policy.deny(ctx, action=action, object_type=object_type, object_id=object_id, details=details,
                          message=(f"this client may {', '.join(sorted(granted))} the object, not {wanted}: "
                                   "ask an administrator for a KMIP grant with that right" if wanted != "manage"
                                   else "only clients of the object's own group change its lifecycle or "
                                        "attributes; ask an administrator to assign it to this client's group"),
                          code="kmip_right_missing")

    def uid_of(self, ref: str, version: int | None = None) -> str:
        """The object a REST caller names: a KMIP object's identifier as it is, or a
        managed key (UUID or name) meaning its newest version (or `version`)."""
        with self._read() as s:
            if version is None and UUID_RE.match(ref) and (self._public_key(s, ref) or self._sealed(s, ref)):
                return ref
            stmt = select(KeyVersion.id).join(ManagedKey).where(key_filter(ref))
            stmt = (stmt.where(KeyVersion.version == version) if version is not None
                    else stmt.order_by(KeyVersion.version.desc()).limit(1))
            found = s.execute(stmt).scalar()
        if found is None:
            raise NotFound(f"no key named or with id '{ref}'" + (f" with a version {version}" if version else ""),
                           code="key_not_found")
        return str(found)

    def record(self, record: PendingRecord) -> None:
        """Audit one use (group commit, committed before the caller answers)."""
        self._audit.commit(record)

    def require(self, ctx: RequestContext, permission: Permission, *, action: str) -> None:
        self._policy.require(ctx, permission, action=action)

    def read(self, ctx: RequestContext, uid: str, *, action: str) -> VersionObject | StandaloneObject:
        """`resolve` for an operation that only reads (GetAttributes, GetAttributeList):
        audited like every operation, with the group commit exports use."""
        found = self.resolve(ctx, uid, action=action)
        object_type, object_id = audit_identity(found)
        self._audit.commit(PendingRecord(ctx=ctx, action=action, object_type=object_type, object_id=object_id,
                                           details=audit_details(found)))
        return found

    def resolve_for_export(self, ctx: RequestContext, uid: str, *, action: str = "kmip.read",
                           permission: Permission = Permission.KEYS_READ,
                           right: str | None = None) -> VersionObject | StandaloneObject:
        """`resolve` for Get: state, material and lengths only, from the cache when the
        notification listener guarantees it is current. The cache holds objects, not
        decisions: tenancy (grants included) is decided on every call."""
        notifier = self._notifier
        if notifier is None or not notifier.healthy:
            return self.resolve(ctx, uid, action=action, permission=permission, right=right)
        hit = self._cache.get(uid)
        if hit is not None and time.monotonic() - hit[1] < self._cache_seconds:
            self._require(ctx, permission, action, hit[0], uid, right)
            return hit[0]
        started, generation = time.monotonic(), self._generation
        with self._read() as s:
            found = self._find(s, uid)
        self._require(ctx, permission, action, found, uid, right)
        if found is None:
            raise NotFound(f"no KMIP object with unique identifier '{uid}'", code="object_not_found")
        with self._cache_lock:
            if generation == self._generation:
                if len(self._cache) > 10_000:
                    self._cache.clear()
                self._cache[uid] = (found, started)
        return found

    def version_object(self, ctx: RequestContext, uid: str, *, right: str | None = None) -> VersionObject:
        found = self.resolve(ctx, uid, right=right)
        if not isinstance(found, VersionObject):
            raise Conflict(f"the object is a {object_type_of(found)}; this operation needs a symmetric key",
                           code="wrong_object_type")
        return found

    # --- Locate --------------------------------------------------------------------
