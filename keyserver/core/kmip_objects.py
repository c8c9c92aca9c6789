"""Managed keys seen as KMIP objects: one object per key version.

A KMIP Unique Identifier is a `KeyVersion.id`, so ReKey gives a new identifier linked
to the old one, and a REST key's current version is a KMIP object at once (and a key
created over KMIP is a REST key). Lifecycle changes go through `KeyService`; this
module adds only what KMIP needs beyond it: resolving identifiers, Locate, key export
(plain or wrapped) and registered RSA public keys. Every call asks the policy layer.
"""

from __future__ import annotations

import base64
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from sqlalchemy import Select, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, joinedload, sessionmaker

from hsm import HsmBackend, HsmError, HsmIntegrityError, HsmInvalidInput
from hsm.backend import AES_KWP
from keyserver.core.audit import AuditService, PendingRecord, utcnow
from keyserver.core.errors import Conflict, IntegrityFailure, InvalidInput, NotFound, hsm_failure
from keyserver.core.keys import UUID_RE, version_wrapped
from keyserver.core.policy import Permission, Policy
from keyserver.core.principal import RequestContext
from keyserver.core.states import DECRYPTABLE, KeyState
from keyserver.store.db import retry_on_disconnect
from keyserver.store.models import KeyVersion, KmipPublicKey, ManagedKey
from keyserver.store.notify import Notifier

MAX_LOCATE = 1000


@dataclass(frozen=True, slots=True)
class VersionObject:
    """A key version with what KMIP attributes need from its key."""

    key: ManagedKey
    version: KeyVersion

    @property
    def uid(self) -> str:
        return str(self.version.id)

    @property
    def replaced_uid(self) -> str | None:
        older = [v for v in self.key.versions if v.version == self.version.version - 1]
        return str(older[0].id) if older else None

    @property
    def replacement_uid(self) -> str | None:
        newer = [v for v in self.key.versions if v.version == self.version.version + 1]
        return str(newer[0].id) if newer else None

    @property
    def is_newest(self) -> bool:
        return self.key.versions[-1].id == self.version.id


@dataclass(frozen=True, slots=True)
class ExportedKey:
    obj: VersionObject
    material: bytes = field(repr=False)
    # None: plaintext; else the mechanism the material is wrapped with.
    wrapping_mechanism: str | None = None


@dataclass(frozen=True, slots=True)
class LocateQuery:
    name: str | None = None
    object_type: str | None = None  # "symmetric-key" | "public-key"
    state: KeyState | None = None
    algorithm: str | None = None
    length_bits: int | None = None
    maximum_items: int | None = None
    offset_items: int = 0


class _Slot:
    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None


class _GroupCommit:
    """Group commit of export records: a request's record is committed before its key
    leaves, but concurrent requests share one INSERT of all their records. The first
    request to arrive writes (its own and whatever queued meanwhile) while the others
    wait for it; no extra thread, so a lone client pays nothing for the grouping."""

    def __init__(self, write: Callable[[list[PendingRecord]], None]) -> None:
        self._write = write
        self._lock = threading.Lock()
        self._queue: list[tuple[PendingRecord, _Slot]] = []
        self._writing = False

    def submit(self, record: PendingRecord) -> None:
        slot = _Slot()
        with self._lock:
            self._queue.append((record, slot))
            lead = not self._writing
            self._writing = True
        if lead:
            self._drain()
        slot.done.wait()
        if slot.error is not None:
            raise slot.error

    def _drain(self) -> None:
        while True:
            with self._lock:
                batch, self._queue = self._queue, []
                if not batch:
                    self._writing = False
                    return
            error: BaseException | None = None
            try:
                self._write([record for record, _ in batch])
            except BaseException as exc:  # every waiter of the batch learns it failed
                error = exc
            for _, slot in batch:
                slot.error = error
                slot.done.set()


class KmipObjectService:
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
        now: Callable[[], datetime] = utcnow,
    ) -> None:
        self._db = session_factory
        # Reads in autocommit: no BEGIN/ROLLBACK round trips around each lookup.
        self._read = session_factory if autocommit_engine is None else sessionmaker(
            autocommit_engine, expire_on_commit=False)
        # Export records are single statements: autocommit saves BEGIN and COMMIT round trips.
        self._autocommit = autocommit_engine
        self._hsm = hsm
        self._audit = audit
        self._policy = policy
        self._now = now
        # Objects as Get needs them (state, wrapped material, length), per replica, the
        # way DataKeyService caches active versions (decision 0004): every change to a
        # version's state or material publishes a notification and all replicas drop the
        # cache. Only metadata and ciphertext are cached, never unwrapped material; tags
        # (which change without a notification) are never read from here.
        self._notifier = notifier
        self._cache_seconds = cache_seconds
        self._cache: dict[str, tuple[VersionObject | KmipPublicKey, float]] = {}
        self._cache_lock = threading.Lock()
        self._generation = 0  # see KmipClientService: a lookup older than a clear is not cached
        self._export_records = _GroupCommit(self._write_records)
        if notifier is not None:
            notifier.subscribe(self._clear_cache)

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

    def resolve(self, ctx: RequestContext, uid: str) -> VersionObject | KmipPublicKey:
        self._policy.require(ctx, Permission.KEYS_READ, action="kmip.read", object_type="kmip_object",
                             object_id=uid)
        with self._read() as s:
            found = self._version(s, uid) or self._public_key(s, uid)
        if found is None:
            raise NotFound(f"no KMIP object with unique identifier '{uid}'", code="object_not_found")
        return found

    def resolve_for_export(self, ctx: RequestContext, uid: str) -> VersionObject | KmipPublicKey:
        """`resolve` for Get: state, material and lengths only, from the cache when the
        notification listener guarantees it is current."""
        notifier = self._notifier
        # PostgreSQL only: on SQLite another process (the CLI) could change a key unheard.
        if notifier is None or not notifier.distributed or not notifier.healthy:
            return self.resolve(ctx, uid)
        self._policy.require(ctx, Permission.KEYS_READ, action="kmip.read", object_type="kmip_object",
                             object_id=uid)
        hit = self._cache.get(uid)
        if hit is not None and time.monotonic() - hit[1] < self._cache_seconds:
            return hit[0]
        started, generation = time.monotonic(), self._generation
        with self._read() as s:
            found = self._version(s, uid) or self._public_key(s, uid)
        if found is None:
            raise NotFound(f"no KMIP object with unique identifier '{uid}'", code="object_not_found")
        with self._cache_lock:
            if generation == self._generation:
                if len(self._cache) > 10_000:
                    self._cache.clear()
                self._cache[uid] = (found, started)
        return found

    def version_object(self, ctx: RequestContext, uid: str) -> VersionObject:
        found = self.resolve(ctx, uid)
        if not isinstance(found, VersionObject):
            raise Conflict("the object is a public key; this operation needs a symmetric key",
                           code="wrong_object_type")
        return found

    # --- Locate --------------------------------------------------------------------
    def locate(self, ctx: RequestContext, q: LocateQuery) -> list[str]:
        """Unique identifiers matching every given criterion: symmetric keys newest
        version first within a key, keys by name, then public keys."""
        self._policy.require(ctx, Permission.KEYS_READ, action="kmip.locate")
        if (q.maximum_items is not None and q.maximum_items < 0) or q.offset_items < 0:
            raise InvalidInput("MaximumItems and OffsetItems must not be negative")
        uids: list[str] = []
        with self._read() as s:
            if q.object_type in (None, "symmetric-key") and (q.algorithm in (None, "AES")):
                stmt: Select[Any] = select(KeyVersion).join(ManagedKey)
                if q.name is not None:
                    stmt = stmt.where(ManagedKey.name == q.name)
                if q.state is not None:
                    stmt = stmt.where(KeyVersion.state == q.state.value)
                if q.length_bits is not None:
                    stmt = stmt.where(ManagedKey.length_bits == q.length_bits)
                stmt = stmt.order_by(ManagedKey.name, KeyVersion.version.desc())
                limit = q.offset_items + (q.maximum_items if q.maximum_items else MAX_LOCATE)
                uids.extend(str(v.id) for v in s.execute(stmt.limit(limit)).scalars())
            if q.object_type in (None, "public-key") and q.algorithm in (None, "RSA") and q.state in (
                    None, KeyState.ACTIVE):
                pstmt = select(KmipPublicKey.id).order_by(KmipPublicKey.created_at)
                if q.name is not None:
                    pstmt = pstmt.where(KmipPublicKey.name == q.name)
                if q.length_bits is not None:
                    pstmt = pstmt.where(KmipPublicKey.length_bits == q.length_bits)
                uids.extend(str(i) for i in s.execute(pstmt.limit(MAX_LOCATE)).scalars())
        end = q.offset_items + (q.maximum_items if q.maximum_items else MAX_LOCATE)
        return uids[q.offset_items:end]

    # --- key material out ----------------------------------------------------------
    def export(self, ctx: RequestContext, obj: VersionObject, *, wrap_under: str | None = None) -> ExportedKey:
        """A key version's material (`obj` from `resolve`), in plaintext or wrapped
        (inside the HSM) under a registered RSA public key. Always audited."""
        self._policy.require(ctx, Permission.KEYS_EXPORT, action="key.export", object_type="kmip_object",
                             object_id=obj.uid)
        state = KeyState(obj.version.state)
        if state not in DECRYPTABLE:
            raise Conflict(f"version {obj.version.version} of '{obj.key.name}' is {state.value}; "
                           "only active or deactivated material can be exported", code="illegal_state")
        wrapped = version_wrapped(obj.version)
        details: dict[str, object] = {"name": obj.key.name, "version": obj.version.version}
        try:
            if wrap_under is None:
                material, mechanism = self._hsm.unwrap_key(wrapped), None
            else:
                target = self.resolve_for_export(ctx, wrap_under)
                if isinstance(target, VersionObject):
                    # AES key wrap inside the token, under an Active AES key version.
                    if KeyState(target.version.state) is not KeyState.ACTIVE:
                        raise Conflict("the wrapping key must be active", code="illegal_state")
                    material = self._hsm.wrap_with_key(wrapped, wrapping=version_wrapped(target.version))
                    mechanism = AES_KWP
                else:
                    rewrapped = self._hsm.rewrap_for_public_key(wrapped, public_key_der=target.der)
                    material, mechanism = rewrapped.ciphertext, rewrapped.mechanism
                details.update(wrapped_under=wrap_under, mechanism=mechanism)
        except HsmIntegrityError:
            raise IntegrityFailure() from None
        except HsmInvalidInput as exc:
            raise InvalidInput(str(exc)) from exc
        except HsmError as exc:
            raise hsm_failure("export the key", exc) from exc
        details["plaintext"] = mechanism is None
        # Committed before the material is returned: no key leaves without its record.
        self._export_records.submit(PendingRecord(ctx=ctx, action="key.export", object_type="key",
                                                  object_id=str(obj.key.id), details=details))
        return ExportedKey(obj=obj, material=material, wrapping_mechanism=mechanism)

    def _write_records(self, records: list[PendingRecord]) -> None:
        if self._autocommit is None:
            with self._db.begin() as s:
                self._audit.add_many(s, records)
            return
        autocommit = self._autocommit

        def write() -> None:
            # begin(): a no-op transaction in autocommit (PostgreSQL), a real one on SQLite;
            # one multi-row INSERT is atomic either way.
            with autocommit.begin() as conn:
                self._audit.add_many(conn, records)

        retry_on_disconnect(write)

    # --- registered public keys -----------------------------------------------------
    def register_public_key(self, ctx: RequestContext, der: bytes, *, name: str | None) -> KmipPublicKey:
        self._policy.require(ctx, Permission.KEYS_CREATE, action="kmip.register", object_type="public_key",
                             object_id=name)
        try:
            key = _load_public_der(der)
        except ValueError:
            raise InvalidInput("the public key must be DER (SubjectPublicKeyInfo or PKCS#1)") from None
        if not isinstance(key, rsa.RSAPublicKey) or key.key_size < 2048:
            raise InvalidInput("only RSA public keys of at least 2048 bits can be registered")
        spki = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        row = KmipPublicKey(id=uuid.uuid4(), name=name, owner=ctx.principal.name, der=spki,
                            length_bits=key.key_size, state=KeyState.ACTIVE.value, created_at=self._now())
        with self._db.begin() as s:
            s.add(row)
            self._audit.add(s, ctx, action="kmip.register", object_type="public_key", object_id=str(row.id),
                            details={"name": name, "bits": key.key_size})
        return row


def _load_public_der(der: bytes) -> object:
    """SubjectPublicKeyInfo, or KMIP's PKCS#1 RSAPublicKey (via its PEM armour)."""
    try:
        return serialization.load_der_public_key(der)
    except ValueError:
        pem = b"-----BEGIN RSA PUBLIC KEY-----\n" + base64.encodebytes(der) + b"-----END RSA PUBLIC KEY-----\n"
        return serialization.load_pem_public_key(pem)
