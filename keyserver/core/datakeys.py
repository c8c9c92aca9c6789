"""Envelope encryption like a cloud KMS: data keys sealed by a managed key version.

Blob format v1 (all integers big-endian), documented in docs/api.md:

    magic "SRDK" | format 0x01 | key id (16, UUID) | key version (u32) | mechanism (u8)
    | sealed: IV (12) || ciphertext || tag (16)

mechanism 1 = AES-256-GCM performed inside the HSM. The associated data is the 26
header bytes followed by SHA-256 of the canonical JSON of the caller's encryption
context, so a blob cannot be moved to another key, version or context unseen.
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine, select
from sqlalchemy.orm import Session, sessionmaker

from hsm import HsmBackend, HsmError, HsmIntegrityError, WrappedKey
from keyserver.core.audit import AuditService, PendingRecord, utcnow
from keyserver.core.errors import Conflict, IntegrityFailure, InvalidInput, NotFound, hsm_failure
from keyserver.core.gcm import GcmBudget
from keyserver.core.keys import key_filter, protection_ends, version_wrapped
from keyserver.core.permissions import Permission
from keyserver.core.policy import Policy
from keyserver.core.principal import RequestContext
from keyserver.core.states import DECRYPTABLE, KeyState
from keyserver.store.db import retry_on_disconnect
from keyserver.store.models import KeyVersion, ManagedKey
from keyserver.store.notify import Notifier, Topic

MAGIC = b"SRDK"
FORMAT_V1 = 1
MECH_AES_256_GCM_HSM = 1
HEADER = struct.Struct(">4sB16sIB")
MIN_SEALED = 12 + 16 + 1
MAX_CONTEXT_BYTES = 4096


@dataclass(frozen=True, slots=True)
class DataKey:
    key_id: uuid.UUID
    key_name: str
    key_version: int
    blob: bytes
    plaintext: bytes | None


def context_digest(context: dict[str, str] | None) -> bytes:
    doc = json.dumps(context or {}, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    if len(doc) > MAX_CONTEXT_BYTES:
        raise InvalidInput(f"the encryption context is larger than {MAX_CONTEXT_BYTES} bytes")
    return hashlib.sha256(doc).digest()


def parse_blob(blob: bytes) -> tuple[bytes, uuid.UUID, int, bytes]:
    if len(blob) < HEADER.size + MIN_SEALED:
        raise InvalidInput("not a data-key blob: too short", code="invalid_blob")
    magic, fmt, kid, version, mech = HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise InvalidInput("not a data-key blob: bad magic", code="invalid_blob")
    if fmt != FORMAT_V1:
        raise InvalidInput(f"unsupported data-key blob format {fmt}", code="invalid_blob")
    if mech != MECH_AES_256_GCM_HSM:
        raise InvalidInput(f"unsupported data-key mechanism {mech}", code="invalid_blob")
    return blob[:HEADER.size], uuid.UUID(bytes=kid), version, blob[HEADER.size:]


@dataclass(frozen=True, slots=True)
class _Active:
    key_id: uuid.UUID
    name: str
    version: int
    wrapped: WrappedKey
    cached_at: float
    protect_until: datetime | None = None  # its Deactivation or Protect Stop Date (keys.protection_ends)


DATA_KEY_SIZES = frozenset({16, 24, 32, 48, 64})


def _stopped(active: _Active) -> bool:
    return active.protect_until is not None and active.protect_until <= utcnow()


def _generate_action(include_plaintext: bool) -> str:
    return "datakey.generate" if include_plaintext else "datakey.generate_without_plaintext"


class DataKeyService:
    def __init__(
        self, session_factory: sessionmaker[Session], hsm: HsmBackend, audit: AuditService, policy: Policy,
        notifier: Notifier, *, autocommit_engine: Engine, gcm: GcmBudget, cache_seconds: float = 30.0,
    ) -> None:
        self._db = session_factory
        self._gcm = gcm
        # Data-key records are single statements: autocommit saves BEGIN and COMMIT.
        self._autocommit = autocommit_engine
        self._hsm = hsm
        self._audit = audit
        self._policy = policy
        # Each key's Active version, per replica. Every state change publishes a
        # notification in its own transaction and all replicas drop the cache, so a
        # cached entry is never staler than a read that raced the change's commit.
        self._notifier = notifier
        self._cache_seconds = cache_seconds
        self._active: dict[str, _Active] = {}
        notifier.subscribe(Topic.KEYS, self._active.clear)

    def _cached_active(self, ref: str) -> _Active | None:
        hit = self._active.get(ref)
        if hit is not None and self._notifier.healthy and time.monotonic() - hit.cached_at < self._cache_seconds:
            return hit
        return None

    def _active_version(self, ref: str) -> _Active:
        return self._cached_active(ref) or retry_on_disconnect(lambda: self._look_up_active(ref))

    def _look_up_active(self, ref: str) -> _Active:
        started = time.monotonic()
        # begin(): a no-op transaction on PostgreSQL's autocommit pool, a real one on SQLite.
        with self._autocommit.begin() as conn:
            row = conn.execute(
                select(ManagedKey.id, ManagedKey.name, KeyVersion.version, KeyVersion.wrapping_key_id,
                       KeyVersion.wrapping_mechanism, KeyVersion.wrapped_key, KeyVersion.deactivation_date,
                       ManagedKey.kmip_attributes)
                .join(KeyVersion, KeyVersion.key_id == ManagedKey.id)
                # HMAC keys cannot encrypt: to data keys they do not exist (404 with advice below)
                .where(key_filter(ref), KeyVersion.state == KeyState.ACTIVE.value, ManagedKey.algorithm == "AES")
            ).first()
            if row is None:
                raise self._no_active(conn, ref)
        key_id, name, version_no, kek_id, mechanism, ciphertext, deactivation, kmip_attributes = row
        assert kek_id and mechanism and ciphertext, "an Active version always has material"
        active = _Active(key_id, name, version_no, WrappedKey(kek_id, mechanism, ciphertext), started,
                         protection_ends(kmip_attributes, version_no, deactivation))
        if len(self._active) > 10_000:
            self._active.clear()
        self._active[ref] = active
        return active

    def generate(
        self, ctx: RequestContext, ref: str, *, number_of_bytes: int = 32,
        context: dict[str, str] | None = None, include_plaintext: bool = True,
    ) -> DataKey:
        action = _generate_action(include_plaintext)
        self._policy.require(ctx, Permission.DATAKEYS_GENERATE, action=action, object_type="key", object_id=ref)
        if number_of_bytes not in DATA_KEY_SIZES:
            raise InvalidInput("number_of_bytes must be one of 16, 24, 32, 48, 64")
        try:
            active = self._active_version(ref)
            if _stopped(active):
                raise Conflict(f"key '{active.name}' no longer protects new data: its Deactivation or Protect Stop "
                               f"Date ({active.protect_until}) has passed; rotate it", code="illegal_state")
            self._gcm.spend(active.key_id, active.version, name=active.name)
        except (NotFound, Conflict) as exc:
            # Recorded once the lookup's transaction has ended (decision 0010).
            self._audit.record_now(ctx, action=action, outcome="error", object_type="key", object_id=ref,
                                   details={"reason": exc.code})
            raise
        dk, record = self._seal(ctx, active, action, number_of_bytes, context, include_plaintext)
        # Committed before the key is returned: no data key leaves without its record. The
        # commit is shared with concurrent requests (group commit): at 200 clients one
        # commit per data key was most of what the store did.
        self._audit.commit(record)
        return dk

    def seal_cached(
        self, ctx: RequestContext, ref: str, *, number_of_bytes: int, context: dict[str, str],
        include_plaintext: bool,
    ) -> tuple[DataKey, PendingRecord] | None:
        """`generate` without blocking on the store: the data key and the record that must
        be committed before it is handed out (`AuditService.commit_async`), or None when
        this needs the store or would be refused (not permitted, the key's Active version
        not cached, this process's GCM block spent) — then call `generate`, which looks,
        refuses and audits. For the REST hot path, which runs on the event loop."""
        if number_of_bytes not in DATA_KEY_SIZES or not self._policy.permits(ctx, Permission.DATAKEYS_GENERATE):
            return None
        active = self._cached_active(ref)
        if active is None or _stopped(active) or not self._gcm.try_spend(active.key_id, active.version):
            return None
        return self._seal(ctx, active, _generate_action(include_plaintext), number_of_bytes, context,
                          include_plaintext)

    def _seal(self, ctx: RequestContext, active: _Active, action: str, number_of_bytes: int,
              context: dict[str, str] | None, include_plaintext: bool) -> tuple[DataKey, PendingRecord]:
        header = HEADER.pack(MAGIC, FORMAT_V1, active.key_id.bytes, active.version, MECH_AES_256_GCM_HSM)
        try:
            plaintext = self._hsm.random(number_of_bytes)
            sealed = self._hsm.encrypt_with(active.wrapped, plaintext, aad=header + context_digest(context))
        except HsmError as exc:
            raise hsm_failure("seal the data key", exc) from exc
        record = PendingRecord(ctx=ctx, action=action, object_type="key", object_id=str(active.key_id),
                               details={"name": active.name, "version": active.version, "bytes": number_of_bytes})
        return (DataKey(active.key_id, active.name, active.version, header + sealed,
                        plaintext if include_plaintext else None), record)

    @staticmethod
    def _no_active(conn: Connection, ref: str) -> NotFound | Conflict:
        # On the caller's connection: a second one would wait on its lock (decision 0010).
        row = conn.execute(
            select(ManagedKey.name, KeyVersion.state, ManagedKey.algorithm)
            .join(KeyVersion, KeyVersion.key_id == ManagedKey.id)
            .where(key_filter(ref)).order_by(KeyVersion.version.desc()).limit(1)
        ).first()
        if row is None:
            return NotFound(f"no key named or with id '{ref}'", code="key_not_found")
        name, state, algorithm = row
        if algorithm != "AES":
            return Conflict(f"key '{name}' is an {algorithm} key; data keys are made under AES keys",
                            code="wrong_key_algorithm")
        return Conflict(f"key '{name}' has no active version (it is {state}); "
                       "activate or rotate it to make new data keys", code="illegal_state")

    def decrypt(self, ctx: RequestContext, blob: bytes, *, context: dict[str, str] | None = None) -> DataKey:
        header, key_id, version_no, sealed = parse_blob(blob)
        self._policy.require(ctx, Permission.DATAKEYS_DECRYPT, action="datakey.decrypt",
                             object_type="key", object_id=str(key_id))
        with self._audit.transaction() as s:
            key_name, version = self._usable_version(s, ctx, key_id, version_no, "datakey.decrypt")
            plaintext = self._open(s, ctx, version, sealed, header + context_digest(context),
                                   key_id, "datakey.decrypt")
            self._audit.add(s, ctx, action="datakey.decrypt", object_type="key", object_id=str(key_id),
                            details={"name": key_name, "version": version_no})
        return DataKey(key_id, key_name, version_no, blob, plaintext)

    def reencrypt(self, ctx: RequestContext, blob: bytes, *, context: dict[str, str] | None = None) -> DataKey:
        """Re-seal a data key under the key's newest Active version, for rotation."""
        header, key_id, version_no, sealed = parse_blob(blob)
        self._policy.require(ctx, Permission.DATAKEYS_DECRYPT, action="datakey.reencrypt",
                             object_type="key", object_id=str(key_id))
        self._policy.require(ctx, Permission.DATAKEYS_GENERATE, action="datakey.reencrypt",
                             object_type="key", object_id=str(key_id))
        digest = context_digest(context)
        with self._audit.transaction() as s:
            key_name, old = self._usable_version(s, ctx, key_id, version_no, "datakey.reencrypt")
            plaintext = self._open(s, ctx, old, sealed, header + digest, key_id, "datakey.reencrypt")
            new = s.execute(select(KeyVersion).where(
                KeyVersion.key_id == key_id, KeyVersion.state == KeyState.ACTIVE.value)).scalar_one_or_none()
            if new is None:
                raise Conflict(f"key '{key_name}' has no active version to re-encrypt under",
                               code="illegal_state")
            new_header = HEADER.pack(MAGIC, FORMAT_V1, key_id.bytes, new.version, MECH_AES_256_GCM_HSM)
            self._gcm.spend(key_id, new.version, name=key_name, conn=s.connection())
            try:
                resealed = self._hsm.encrypt_with(version_wrapped(new), plaintext, aad=new_header + digest)
            except HsmError as exc:
                raise hsm_failure("seal the data key", exc) from exc
            self._audit.add(s, ctx, action="datakey.reencrypt", object_type="key", object_id=str(key_id),
                            details={"name": key_name, "from_version": version_no, "to_version": new.version,
                                     # The old blob, by its IV: the version's inventory counts it once.
                                     "from_iv": sealed[:12].hex()})
        return DataKey(key_id, key_name, new.version, new_header + resealed, None)

    def _usable_version(
        self, s: Session, ctx: RequestContext, key_id: uuid.UUID, version_no: int, action: str,
    ) -> tuple[str, KeyVersion]:
        row = s.execute(
            select(ManagedKey.name, KeyVersion).join(KeyVersion, KeyVersion.key_id == ManagedKey.id)
            .where(ManagedKey.id == key_id, KeyVersion.version == version_no)
        ).first()
        if row is None:
            raise NotFound(f"the blob names key {key_id} version {version_no}, which does not exist",
                           code="key_not_found")
        name, version = row
        if KeyState(version.state) not in DECRYPTABLE:
            self._audit.record_after(s, ctx, action=action, outcome="denied", object_type="key",
                                     object_id=str(key_id), details={"version": version_no, "state": version.state})
            raise Conflict(f"version {version_no} of key '{name}' is {version.state} and cannot decrypt",
                           code="illegal_state")
        return name, version

    def _open(
        self, s: Session, ctx: RequestContext, version: KeyVersion, sealed: bytes, aad: bytes,
        key_id: uuid.UUID, action: str,
    ) -> bytes:
        try:
            return self._hsm.decrypt_with(version_wrapped(version), sealed, aad=aad)
        except HsmIntegrityError:
            self._audit.record_after(s, ctx, action=action, outcome="error", object_type="key",
                                     object_id=str(key_id), details={"version": version.version,
                                                                     "error": "integrity"})
            raise IntegrityFailure() from None
        except HsmError as exc:
            raise hsm_failure("open the data key", exc) from exc
