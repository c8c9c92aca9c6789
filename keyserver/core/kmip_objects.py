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
from datetime import UTC, datetime
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from sqlalchemy import Select, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, joinedload, sessionmaker

from hsm import HsmBackend, HsmError, HsmIntegrityError, HsmInvalidInput, WrappedKey
from hsm.backend import AES_KWP
from keyserver.core.approvals import ApprovalService
from keyserver.core.audit import AuditService, PendingRecord, utcnow
from keyserver.core.errors import (
    Conflict,
    IntegrityFailure,
    InvalidInput,
    NotFound,
    ServiceUnavailable,
    hsm_failure,
)
from keyserver.core.keys import (
    COMPROMISE_REASONS,
    PROTECT_STOP_DATE,
    REVOCATION_REASONS,
    key_filter,
    validate_tags,
    version_wrapped,
)
from keyserver.core.kmip_sealed import UnsealError, seal, unseal
from keyserver.core.names import UUID_RE, check_name
from keyserver.core.permissions import Permission
from keyserver.core.policy import Policy
from keyserver.core.principal import RequestContext
from keyserver.core.states import DESTROYED_STATES, RETRIEVABLE, KeyState, check_transition
from keyserver.core.usage import Usage, uses_of
from keyserver.store.models import KeyVersion, KmipPublicKey, KmipSealedObject, ManagedKey
from keyserver.store.notify import Notifier, Topic

MAX_LOCATE = 1000
SCAN_LIMIT = 20_000  # candidates per kind of object when Locate filters on stored attributes
# Standard attributes a client may set, as kept in `kmip_attributes` (KMIP names).
CONTACT_INFORMATION, OBJECT_GROUP = "Contact Information", "Object Group"
APPLICATION_SPECIFIC_INFORMATION = "Application Specific Information"
NAME = "Name"
# Attributes a client may add, modify and delete (besides custom "x-" ones); the others
# are the server's. Multi-instance ones hold a list (KMIP 1.4 §3: Object Group and
# Application Specific Information may appear several times).
CLIENT_ATTRIBUTES = frozenset({NAME, CONTACT_INFORMATION, OBJECT_GROUP, APPLICATION_SPECIFIC_INFORMATION})
MULTI_INSTANCE = frozenset({OBJECT_GROUP, APPLICATION_SPECIFIC_INFORMATION})
# Server-kept attributes in `kmip_attributes` a client sets only when it creates or
# registers the object: a symmetric key's Process Start and Protect Stop Dates, per
# version ({"<version>": epoch seconds}: a ReKey's replacement starts without them), and
# the Cryptographic Parameters each use takes by default (a list of instances).
PROCESS_START_DATE = "Process Start Date"
CRYPTOGRAPHIC_PARAMETERS = "Cryptographic Parameters"
SERVER_KEPT = frozenset({PROCESS_START_DATE, PROTECT_STOP_DATE, CRYPTOGRAPHIC_PARAMETERS})
# Uses that apply protection, and those that process protected data (KMIP 1.4 §3.25-3.26).
PROTECT_USES = frozenset({"encrypt", "sign", "mac", "wrap"})
PROCESS_USES = frozenset({"decrypt", "verify", "mac_verify", "unwrap"})
MAX_INSTANCES = 32
MAX_TEXT = 1024
PRIVATE_KEY, SECRET_DATA, CERTIFICATE, OPAQUE = "private-key", "secret-data", "certificate", "opaque-object"
SEALED_TYPES = frozenset({PRIVATE_KEY, SECRET_DATA, CERTIFICATE, OPAQUE})
RSA_PAIR_BITS = frozenset({2048, 3072, 4096})
EC_PAIR_CURVES = {256: "P-256", 384: "P-384"}  # Cryptographic Length → curve (EC pairs)
PAIR_GENERATIONS = 2  # RSA key pairs generated at once per replica
MAX_SECRET_BYTES = 64 * 1024
# Objects with a lifecycle of their own (not a managed key's version).
StandaloneObject = KmipPublicKey | KmipSealedObject


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
class VersionRef:
    """Which managed key version a KMIP identifier names: all that an operation which
    then changes it under the key's lock (Activate, Revoke, Destroy) needs to know."""

    key_id: uuid.UUID
    version: int


@dataclass(frozen=True, slots=True)
class ExportedKey:
    obj: VersionObject
    material: bytes = field(repr=False)
    # None: plaintext; else the mechanism the material is wrapped with.
    wrapping_mechanism: str | None = None


@dataclass(frozen=True, slots=True)
class CreatedPair:
    private: KmipSealedObject
    public: KmipPublicKey


@dataclass(frozen=True, slots=True)
class LocateQuery:
    name: str | None = None
    object_type: str | None = None  # "symmetric-key" | "public-key" | one of SEALED_TYPES
    state: KeyState | None = None  # None: every state but the destroyed ones
    algorithm: str | None = None  # "AES", "RSA", "HMAC-SHA256", ...
    length_bits: int | None = None
    object_group: str | None = None
    contact_information: str | None = None
    certificate_type: str | None = None  # "x509"
    maximum_items: int | None = None
    offset_items: int = 0

    def criteria(self) -> dict[str, object]:
        """What was asked, for the audit record."""
        out = {"name": self.name, "object_type": self.object_type,
               "state": self.state.value if self.state else None, "algorithm": self.algorithm,
               "length_bits": self.length_bits, "object_group": self.object_group,
               "contact_information": self.contact_information, "certificate_type": self.certificate_type}
        return {k: v for k, v in out.items() if v is not None}


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
                permission: Permission = Permission.KEYS_READ) -> VersionObject | StandaloneObject:
        """The object behind `uid`, once `ctx` may `permission` on it (a refusal is audited
        under the object's one identity: audit_identity)."""
        with self._read() as s:
            found = self._find(s, uid)
        self._require(ctx, permission, action, found, uid)
        if found is None:
            raise NotFound(f"no KMIP object with unique identifier '{uid}'", code="object_not_found")
        return found

    def version_ref(self, ctx: RequestContext, uid: str) -> VersionRef | None:
        """The key version `uid` names, by one indexed lookup, for a caller allowed to
        read keys; None otherwise (not a key version, unknown, or a caller `resolve`
        must refuse and audit), and the caller then goes through `resolve`. Cheaper than
        `resolve` (which loads the key and all its versions) for operations that load
        them again anyway, under the key's lock."""
        if Permission.KEYS_READ not in ctx.principal.permissions or not UUID_RE.match(uid):
            return None
        stmt = select(KeyVersion.key_id, KeyVersion.version).where(KeyVersion.id == uuid.UUID(uid))
        with self._read() as s:
            row = s.execute(stmt).first()
        return None if row is None else VersionRef(key_id=row[0], version=row[1])

    def _require(self, ctx: RequestContext, permission: Permission, action: str,
                 found: VersionObject | StandaloneObject | None, uid: str) -> None:
        object_type, object_id = audit_identity(found) if found is not None else ("kmip_object", uid)
        self._policy.require(ctx, permission, action=action, object_type=object_type, object_id=object_id)

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
                           permission: Permission = Permission.KEYS_READ) -> VersionObject | StandaloneObject:
        """`resolve` for Get: state, material and lengths only, from the cache when the
        notification listener guarantees it is current."""
        notifier = self._notifier
        if notifier is None or not notifier.healthy:
            return self.resolve(ctx, uid, action=action, permission=permission)
        hit = self._cache.get(uid)
        if hit is not None and time.monotonic() - hit[1] < self._cache_seconds:
            self._require(ctx, permission, action, hit[0], uid)
            return hit[0]
        started, generation = time.monotonic(), self._generation
        with self._read() as s:
            found = self._find(s, uid)
        self._require(ctx, permission, action, found, uid)
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
            raise Conflict(f"the object is a {object_type_of(found)}; this operation needs a symmetric key",
                           code="wrong_object_type")
        return found

    # --- Locate --------------------------------------------------------------------
    def locate(self, ctx: RequestContext, q: LocateQuery, *, nothing: bool = False) -> list[str]:
        """Unique identifiers matching every given criterion: symmetric keys newest
        version first within a key, keys by name, then public keys, then the others.
        Destroyed objects only when the query asks for a destroyed state (a client's
        "locate everything, revoke, destroy" loop must not meet what it destroyed)."""
        self._policy.require(ctx, Permission.KEYS_READ, action="kmip.locate")
        if (q.maximum_items is not None and q.maximum_items < 0) or q.offset_items < 0:
            raise InvalidInput("MaximumItems and OffsetItems must not be negative")
        end = q.offset_items + (q.maximum_items if q.maximum_items else MAX_LOCATE)
        hidden = [st.value for st in DESTROYED_STATES]
        by_attributes = q.object_group is not None or q.contact_information is not None

        def wanted(attrs: dict[str, Any] | None) -> bool:
            attrs = attrs or {}
            groups = attrs.get(OBJECT_GROUP) or []
            return ((q.object_group is None or q.object_group in groups)
                    and (q.contact_information is None or attrs.get(CONTACT_INFORMATION) == q.contact_information))

        # Attribute filters are applied here, over at most SCAN_LIMIT candidates per kind
        # (JSON containment differs between PostgreSQL and SQLite).
        limit = SCAN_LIMIT if by_attributes else end
        uids: list[str] = []
        with self._read() as s:
            if nothing:  # a criterion no object can meet (an unknown object type or algorithm)
                pass
            elif q.object_type in (None, "symmetric-key") and q.certificate_type is None and q.algorithm != "RSA":
                stmt: Select[Any] = select(KeyVersion.id, ManagedKey.kmip_attributes).join(ManagedKey)
                if q.name is not None:
                    stmt = stmt.where(ManagedKey.name == q.name)
                stmt = stmt.where(KeyVersion.state == q.state.value) if q.state is not None else \
                    stmt.where(KeyVersion.state.not_in(hidden))
                if q.algorithm is not None:
                    stmt = stmt.where(ManagedKey.algorithm == q.algorithm)
                if q.length_bits is not None:
                    stmt = stmt.where(ManagedKey.length_bits == q.length_bits)
                stmt = stmt.order_by(ManagedKey.name, ManagedKey.created_at, KeyVersion.version.desc())
                uids.extend(str(i) for i, attrs in s.execute(stmt.limit(limit)) if wanted(attrs))
            if not nothing and q.object_type in (None, "public-key") and q.certificate_type is None \
                    and q.algorithm in (None, "RSA", "EC"):
                pstmt: Select[Any] = select(KmipPublicKey.id, KmipPublicKey.kmip_attributes).order_by(
                    KmipPublicKey.created_at)
                pstmt = pstmt.where(KmipPublicKey.state == q.state.value) if q.state is not None else \
                    pstmt.where(KmipPublicKey.state.not_in(hidden))
                if q.name is not None:
                    pstmt = pstmt.where(KmipPublicKey.name == q.name)
                if q.length_bits is not None:
                    pstmt = pstmt.where(KmipPublicKey.length_bits == q.length_bits)
                if q.algorithm is not None:  # no algorithm column: RSA keys are >= 2048 bits, EC ones 256/384
                    pstmt = pstmt.where(KmipPublicKey.length_bits < 1024 if q.algorithm == "EC"
                                        else KmipPublicKey.length_bits >= 1024)
                uids.extend(str(i) for i, attrs in s.execute(pstmt.limit(limit)) if wanted(attrs))
            if not nothing and (q.object_type is None or q.object_type in SEALED_TYPES):
                sstmt: Select[Any] = select(KmipSealedObject.id, KmipSealedObject.kmip_attributes).order_by(
                    KmipSealedObject.created_at)
                if q.object_type is not None:
                    sstmt = sstmt.where(KmipSealedObject.object_type == q.object_type)
                if q.certificate_type is not None:
                    sstmt = sstmt.where(KmipSealedObject.object_type == CERTIFICATE,
                                        KmipSealedObject.data_type == q.certificate_type)
                if q.name is not None:
                    sstmt = sstmt.where(KmipSealedObject.name == q.name)
                sstmt = sstmt.where(KmipSealedObject.state == q.state.value) if q.state is not None else \
                    sstmt.where(KmipSealedObject.state.not_in(hidden))
                if q.algorithm is not None:
                    sstmt = sstmt.where(KmipSealedObject.algorithm == q.algorithm)
                if q.length_bits is not None:
                    sstmt = sstmt.where(KmipSealedObject.length_bits == q.length_bits)
                uids.extend(str(i) for i, attrs in s.execute(sstmt.limit(limit)) if wanted(attrs))
        found = uids[q.offset_items:end]
        self._audit.commit(PendingRecord(ctx=ctx, action="kmip.locate", details={
            "criteria": q.criteria(), "found": len(found)}))
        return found

    # --- key material out ----------------------------------------------------------
    def export(self, ctx: RequestContext, obj: VersionObject, *, wrap_under: str | None = None) -> ExportedKey:
        """A key version's material (`obj` from `resolve`), in plaintext or wrapped
        (inside the HSM) under a registered RSA public key. Always audited."""
        self._require(ctx, Permission.KEYS_EXPORT if wrap_under is None else Permission.KEYS_EXPORT_WRAPPED,
                      "key.export", obj, obj.uid)
        if wrap_under is None and not obj.key.exportable:
            self._policy.deny(ctx, action="key.export", object_type="key", object_id=str(obj.key.id),
                              details={"reason": "not_exportable", "version": obj.version.version},
                              message=f"key '{obj.key.name}' is not exportable in plaintext (its policy); Get it "
                                      "wrapped under another key (a Key Wrapping Specification), or have a key "
                                      "officer change the policy")
        if wrap_under is None and self._approvals is not None and self._approvals.holds("key.export") and \
                not self._approvals.take_grant(ctx, action="key.export", target=str(obj.key.id)):
            self._approvals.hold(ctx, action="key.export", target=str(obj.key.id),
                                 params={"key": str(obj.key.id), "name": obj.key.name, "version": obj.version.version})
        state = KeyState(obj.version.state)
        if state not in RETRIEVABLE:
            raise Conflict(f"version {obj.version.version} of '{obj.key.name}' is {state.value}: "
                           "its material is erased", code="key_destroyed")
        wrapped = version_wrapped(obj.version)
        details: dict[str, object] = {**audit_details(obj), "state": state.value}
        try:
            hmac = obj.key.algorithm != "AES"
            if wrap_under is None:
                material = (self._hsm.unwrap_secret if hmac else self._hsm.unwrap_key)(wrapped)
                mechanism = None
            elif hmac:
                raise InvalidInput("HMAC keys are delivered in plaintext (with keys:export) only, not wrapped")
            else:
                target = self.resolve_for_export(ctx, wrap_under)
                if isinstance(target, VersionObject) and target.key.algorithm != "AES":
                    raise Conflict("an HMAC key cannot wrap keys", code="wrong_object_type")
                refusal = use_refusal(target, "wrap", self._now())
                if refusal is not None:
                    raise Conflict(refusal, code="illegal_state")
                if isinstance(target, VersionObject):
                    # AES key wrap inside the token, under an Active AES key version.
                    if KeyState(target.version.state) is not KeyState.ACTIVE:
                        raise Conflict("the wrapping key must be active", code="illegal_state")
                    material = self._hsm.wrap_with_key(wrapped, wrapping=version_wrapped(target.version))
                    mechanism = AES_KWP
                elif isinstance(target, KmipPublicKey):
                    if public_key_algorithm(target) != "RSA":
                        raise Conflict("an EC public key cannot wrap keys (ECDSA only); use an RSA public key or "
                                       "an AES key", code="wrong_object_type")
                    if KeyState(target.state) is not KeyState.ACTIVE:
                        raise Conflict("the wrapping key must be active", code="illegal_state")
                    rewrapped = self._hsm.rewrap_for_public_key(wrapped, public_key_der=target.der)
                    material, mechanism = rewrapped.ciphertext, rewrapped.mechanism
                else:
                    raise Conflict(f"a {object_type_of(target)} cannot wrap keys", code="wrong_object_type")
                details.update(wrapped_under=wrap_under, mechanism=mechanism)
        except HsmIntegrityError:
            raise IntegrityFailure() from None
        except HsmInvalidInput as exc:
            raise InvalidInput(str(exc)) from exc
        except HsmError as exc:
            raise hsm_failure("export the key", exc) from exc
        details["plaintext"] = mechanism is None
        # Committed before the material is returned: no key leaves without its record.
        self._audit.commit(PendingRecord(ctx=ctx, action="key.export", object_type="key",
                                                  object_id=str(obj.key.id), details=details))
        return ExportedKey(obj=obj, material=material, wrapping_mechanism=mechanism)

    # --- registered public keys -----------------------------------------------------
    def register_public_key(self, ctx: RequestContext, der: bytes, *, name: str | None,
                            attributes: dict[str, Any] | None = None,
                            activation_date: datetime | None = None,
                            deactivation_date: datetime | None = None) -> KmipPublicKey:
        """An RSA public key (for wrapped delivery and signature verification) or an EC
        one on P-256/P-384 (verification only). Pre-Active unless `activation_date` is
        not in the future, like every registered object (KMIP 1.4 §4.3)."""
        self._policy.require(ctx, Permission.KEYS_CREATE, action="kmip.register", object_type="public_key",
                             object_id=name)
        self._check_name(name)
        try:
            key = _load_public_der(der)
        except ValueError:
            raise InvalidInput("the public key must be DER (SubjectPublicKeyInfo or PKCS#1)") from None
        public: rsa.RSAPublicKey | ec.EllipticCurvePublicKey
        if ((isinstance(key, rsa.RSAPublicKey) and key.key_size >= 2048)
                or (isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name in ("secp256r1", "secp384r1"))):
            public = key
        else:
            raise InvalidInput("public keys are RSA of at least 2048 bits or EC on P-256 or P-384")
        spki = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        now = self._now()
        state, activated = self._initial_state(now, activation_date, deactivation_date)
        row = KmipPublicKey(id=uuid.uuid4(), name=name, owner=ctx.principal.name, der=spki,
                            length_bits=_public_bits(public), state=state.value, created_at=now,
                            activation_date=activated, deactivation_date=deactivation_date,
                            kmip_attributes=dict(attributes or {}))
        with self._db.begin() as s:
            s.add(row)
            self._audit.add(s, ctx, action="kmip.register", object_type="public_key", object_id=str(row.id),
                            details={"name": name, "algorithm": "EC" if isinstance(public, ec.EllipticCurvePublicKey)
                                     else "RSA", "bits": _public_bits(public), "state": state.value})
        return row


    # --- key pairs, secret data, certificates ---------------------------------------
    def _kek(self) -> str:
        if self._current_kek is None:
            raise ServiceUnavailable("this server was built without a KEK source")
        return self._current_kek()

    def create_key_pair(
        self, ctx: RequestContext, *, bits: int, private_name: str | None, public_name: str | None,
        activation_date: datetime | None, private_attributes: dict[str, Any] | None = None,
        public_attributes: dict[str, Any] | None = None, algorithm: str = "RSA",
        deactivation_date: datetime | None = None,
    ) -> CreatedPair:
        """An RSA key pair (or `algorithm` "EC": `bits` 256 or 384, curve P-256 or P-384)
        generated in the HSM; the private key leaves it only sealed.
        Both halves are Pre-Active unless `activation_date` is not in the future."""
        self._policy.require(ctx, Permission.KEYS_CREATE, action="kmip.create_key_pair",
                             object_type="private_key", object_id=private_name)
        if algorithm == "EC" and bits not in EC_PAIR_CURVES:
            raise InvalidInput("EC key pairs are 256 (P-256) or 384 (P-384) bits long")
        if algorithm == "RSA" and bits not in RSA_PAIR_BITS:
            raise InvalidInput(f"RSA key pairs are {', '.join(map(str, sorted(RSA_PAIR_BITS)))} bits long")
        if algorithm not in ("RSA", "EC"):
            raise InvalidInput("key pairs are RSA or EC")
        self._check_name(private_name)
        self._check_name(public_name)
        try:
            with self._pair_slots:
                pair = (self._hsm.generate_wrapped_ec_pair(kek_id=self._kek(), curve=EC_PAIR_CURVES[bits])
                        if algorithm == "EC" else self._hsm.generate_wrapped_rsa_pair(kek_id=self._kek(), bits=bits))
        except HsmError as exc:
            raise hsm_failure("generate a key pair", exc) from exc
        now = self._now()
        state, activated = self._initial_state(now, activation_date, deactivation_date)
        private_id, public_id = uuid.uuid4(), uuid.uuid4()
        private = KmipSealedObject(
            id=private_id, object_type=PRIVATE_KEY, name=private_name, owner=ctx.principal.name, algorithm=algorithm,
            length_bits=bits, data_type="pkcs8", state=state.value, public_key_id=public_id,
            dek_wrapping_key_id=pair.dek.wrapping_key_id, dek_mechanism=pair.dek.mechanism,
            dek_ciphertext=pair.dek.ciphertext, mechanism=pair.mechanism, material=pair.private_key,
            created_at=now, updated_at=now, activation_date=activated, deactivation_date=deactivation_date,
            kmip_attributes=dict(private_attributes or {}))
        public = KmipPublicKey(id=public_id, name=public_name, owner=ctx.principal.name, der=pair.public_key_der,
                               length_bits=bits, state=state.value, created_at=now, private_key_id=private_id,
                               activation_date=activated, deactivation_date=deactivation_date,
                               kmip_attributes=dict(public_attributes or {}))
        with self._db.begin() as s:
            s.add_all([private, public])
            self._audit.add(s, ctx, action="kmip.create_key_pair", object_type="private_key",
                            object_id=str(private_id),
                            details={"public_key": str(public_id), "algorithm": algorithm, "bits": bits,
                                     "state": state.value,
                                     "private_name": private_name, "public_name": public_name})
        return CreatedPair(private=private, public=public)

    def register_object(
        self, ctx: RequestContext, *, object_type: str, material: bytes, name: str | None,
        data_type: str | None = None, algorithm: str | None = None, length_bits: int | None = None,
        activation_date: datetime | None = None, attributes: dict[str, Any] | None = None,
        deactivation_date: datetime | None = None,
    ) -> KmipSealedObject:
        """Register a private key (PKCS#8 DER), secret data, or a certificate (DER).
        Secret material is sealed at once; the caller validated its format."""
        self._policy.require(ctx, Permission.KEYS_CREATE, action="kmip.register",
                             object_type=object_type.replace("-", "_"), object_id=name)
        if object_type not in SEALED_TYPES:
            raise InvalidInput(f"cannot register a {object_type}")
        if not 1 <= len(material) <= MAX_SECRET_BYTES:
            raise InvalidInput(f"the object must be 1 to {MAX_SECRET_BYTES} bytes long")
        self._check_name(name)
        now = self._now()
        state, activated = self._initial_state(now, activation_date, deactivation_date)
        row = KmipSealedObject(id=uuid.uuid4(), object_type=object_type, name=name, owner=ctx.principal.name,
                               algorithm=algorithm, length_bits=length_bits, data_type=data_type,
                               state=state.value, created_at=now, updated_at=now, activation_date=activated,
                               deactivation_date=deactivation_date, kmip_attributes=dict(attributes or {}))
        if object_type == CERTIFICATE:
            row.material, row.mechanism = material, None  # public: kept as it is
        else:
            try:
                sealed = seal(self._hsm, material, kek_id=self._kek())
            except HsmError as exc:
                raise hsm_failure("seal the object", exc) from exc
            row.dek_wrapping_key_id, row.dek_mechanism = sealed.dek.wrapping_key_id, sealed.dek.mechanism
            row.dek_ciphertext, row.mechanism, row.material = sealed.dek.ciphertext, sealed.mechanism, sealed.material
        with self._db.begin() as s:
            s.add(row)
            self._audit.add(s, ctx, action="kmip.register", object_type=object_type.replace("-", "_"),
                            object_id=str(row.id),
                            details={"name": name, "bytes": len(material), "state": state.value,
                                     **({"type": data_type} if data_type else {})})
        return row

    def export_object(self, ctx: RequestContext, obj: KmipSealedObject) -> bytes:
        """A sealed object's plaintext (private key: PKCS#8 DER), or a certificate's DER.
        Secret material needs keys:export and is always audited, like key export."""
        audit_type = obj.object_type.replace("-", "_")
        if obj.object_type != CERTIFICATE:
            self._require(ctx, Permission.KEYS_EXPORT, "key.export", obj, str(obj.id))
        state = KeyState(obj.state)
        if state not in RETRIEVABLE:
            raise Conflict(f"the {obj.object_type} is {state.value}: its material is erased", code="key_destroyed")
        if obj.material is None:
            raise Conflict(f"the {obj.object_type} has no material (destroyed)", code="key_destroyed")
        if obj.object_type == CERTIFICATE:
            return obj.material
        assert obj.dek_wrapping_key_id and obj.dek_mechanism and obj.dek_ciphertext and obj.mechanism
        dek = WrappedKey(wrapping_key_id=obj.dek_wrapping_key_id, mechanism=obj.dek_mechanism,
                         ciphertext=obj.dek_ciphertext)
        try:
            plain = unseal(self._hsm, dek, obj.material, mechanism=obj.mechanism,
                           der=obj.object_type == PRIVATE_KEY)
        except (HsmIntegrityError, UnsealError):
            raise IntegrityFailure() from None
        except HsmError as exc:
            raise hsm_failure("open the object", exc) from exc
        self._audit.commit(PendingRecord(
            ctx=ctx, action="key.export", object_type=audit_type, object_id=str(obj.id),
            details={**audit_details(obj), "state": state.value, "plaintext": True}))
        return plain

    def transition(
        self, ctx: RequestContext, uid: str, *, operation: str, reason: str | None = None, message: str = "",
        compromise_date: datetime | None = None,
    ) -> StandaloneObject:
        """Activate, revoke or destroy a public key, private key, secret data or certificate.
        Each object has its own lifecycle (as in KMIP): revoking a private key does not
        revoke its public key. Revoke with a compromise reason → Compromised, otherwise
        Deactivated; Destroy needs a revoked (or never activated) object and erases sealed
        material."""
        permission = {"activate": Permission.KEYS_ACTIVATE, "revoke": Permission.KEYS_REVOKE,
                      "destroy": Permission.KEYS_DESTROY}[operation]
        with self._read() as s:
            subject = self._find(s, uid)
        # outside the read: a refusal is written in a transaction of its own (decision 0010)
        self._require(ctx, permission, f"kmip.{operation}", subject, uid)
        if operation == "revoke" and reason not in REVOCATION_REASONS:
            raise InvalidInput(f"reason must be one of: {', '.join(sorted(REVOCATION_REASONS))}")
        now = self._now()
        with self._db.begin() as s:
            obj: StandaloneObject | None = None
            if UUID_RE.match(uid):
                wanted = uuid.UUID(uid)
                obj = (s.get(KmipPublicKey, wanted, with_for_update=True)
                       or s.get(KmipSealedObject, wanted, with_for_update=True))
            if obj is None:
                raise NotFound(f"no KMIP object with unique identifier '{uid}'", code="object_not_found")
            current = KeyState(obj.state)
            what = f"{object_type_of(obj)} {uid}"
            if operation == "activate":
                target = KeyState.ACTIVE
            elif operation == "revoke":
                if reason in COMPROMISE_REASONS:
                    target = (KeyState.DESTROYED_COMPROMISED if current in DESTROYED_STATES
                              else KeyState.COMPROMISED)
                else:
                    target = KeyState.DEACTIVATED
            else:
                target = KeyState.DESTROYED_COMPROMISED if current is KeyState.COMPROMISED else KeyState.DESTROYED
            if operation == "revoke" and (current is target or (
                    target is KeyState.DEACTIVATED and current is KeyState.COMPROMISED)):
                # Revoked already (a compromise outranks any other reason): the request's
                # outcome holds, so it succeeds unchanged, and a client's "revoke, then
                # destroy" loop runs through every object it located.
                self._audit.add(s, ctx, action="kmip.revoke", object_type=object_type_of(obj).replace("-", "_"),
                                object_id=uid, details={"state": current.value, "unchanged": True,
                                                        "reason": reason})
                return obj
            check_transition(current, target, what=what)
            obj.state = target.value
            if target is KeyState.ACTIVE:
                obj.activation_date = now
            elif target is KeyState.DEACTIVATED:
                obj.deactivation_date = now
            elif target in (KeyState.COMPROMISED, KeyState.DESTROYED_COMPROMISED) and operation == "revoke":
                obj.compromise_date = compromise_date or now
            else:
                obj.destroy_date = now
                if isinstance(obj, KmipSealedObject) and obj.object_type != CERTIFICATE:
                    obj.material = obj.dek_ciphertext = None
            if operation == "revoke":
                obj.revocation_reason = reason
            if isinstance(obj, KmipSealedObject):
                obj.updated_at = now
            if self._notifier is not None:
                self._notifier.publish(s, Topic.KEYS)  # replicas drop what Get cached of it
            self._audit.add(s, ctx, action=f"kmip.{operation}", object_type=object_type_of(obj).replace("-", "_"),
                            object_id=uid, details={"state": target.value, "from": current.value,
                                                    **({"reason": reason, "message": message[:200]}
                                                       if operation == "revoke" else {})})
        return obj

    # --- attributes clients set -------------------------------------------------------
    def change_attribute(
        self, ctx: RequestContext, uid: str, *, operation: str, name: str, value: Any = None, index: int = 0,
    ) -> Any:
        """Add, modify or delete one instance of an attribute clients own: Name, Contact
        Information, Object Group, Application Specific Information, or a custom `x-`
        one (a symmetric key's custom attributes are its REST tags). Returns the value
        added or set, or the one deleted. Values: text, or for Application Specific
        Information a dict with `namespace` and `data`."""
        if operation not in ("add", "modify", "delete"):
            raise InvalidInput(f"unknown attribute operation '{operation}'")
        action = f"kmip.{operation}_attribute"
        with self._read() as s:
            found = self._find(s, uid)
        self._require(ctx, Permission.KEYS_UPDATE, action, found, uid)
        if found is None:
            raise NotFound(f"no KMIP object with unique identifier '{uid}'", code="object_not_found")
        if name not in CLIENT_ATTRIBUTES and not name.startswith("x-"):
            raise InvalidInput(f"'{name}' cannot be changed by a client")
        if operation != "delete":
            value = _checked_value(name, value)
        now = self._now()
        row: ManagedKey | KmipPublicKey | KmipSealedObject | None
        with self._db.begin() as s:
            if isinstance(found, VersionObject):
                row = s.get(ManagedKey, found.key.id, with_for_update=True)
            elif isinstance(found, KmipPublicKey):
                row = s.get(KmipPublicKey, found.id, with_for_update=True)
            else:
                row = s.get(KmipSealedObject, found.id, with_for_update=True)
            if row is None:
                raise NotFound(f"no KMIP object with unique identifier '{uid}'", code="object_not_found")
            result = _apply_attribute(row, operation, name, value, index)
            if isinstance(row, ManagedKey):
                row.updated_at, row.revision = now, row.revision + 1
            elif isinstance(row, KmipSealedObject):
                row.updated_at = now
            if self._notifier is not None:
                self._notifier.publish(s, Topic.KEYS)  # replicas drop what Get cached of it
            object_type, object_id = audit_identity(found)
            self._audit.add(s, ctx, action=action, object_type=object_type, object_id=object_id,
                            details={**audit_details(found), "attribute": name, "index": index})
        return result

    def _initial_state(self, now: datetime, activation_date: datetime | None,
                       deactivation_date: datetime | None = None) -> tuple[KeyState, datetime | None]:
        """State and Activation Date of a new object from its template's dates: a
        Deactivation Date already past makes it Deactivated at once (it may process,
        never protect), as the scheduler would have a moment later."""
        if activation_date is not None and deactivation_date is not None and deactivation_date <= activation_date:
            raise InvalidInput("the Deactivation Date must be after the Activation Date")
        if deactivation_date is not None and deactivation_date <= now:
            return KeyState.DEACTIVATED, activation_date
        if activation_date is not None and activation_date <= now:
            return KeyState.ACTIVE, now
        return KeyState.PRE_ACTIVE, activation_date

    @staticmethod
    def _check_name(name: str | None) -> None:
        if name is not None:
            check_name(name)


def _checked_value(name: str, value: Any) -> Any:
    if name == NAME:
        return check_name(value)
    if name == APPLICATION_SPECIFIC_INFORMATION:
        if (not isinstance(value, dict) or not isinstance(value.get("namespace"), str)
                or not isinstance(value.get("data"), str) or not 1 <= len(value["namespace"]) <= 256
                or len(value["data"]) > MAX_TEXT):
            raise InvalidInput("Application Specific Information is a namespace (1-256 characters) and "
                               f"data (at most {MAX_TEXT} characters)")
        return {"namespace": value["namespace"], "data": value["data"]}
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_TEXT:
        raise InvalidInput(f"'{name}' takes a text value of 1 to {MAX_TEXT} characters")
    return value


def _apply_attribute(row: ManagedKey | KmipPublicKey | KmipSealedObject, operation: str, name: str,
                     value: Any, index: int) -> Any:
    """Change `row` in place; the value added/set or deleted. Conflict when adding a
    second instance of a single-instance attribute, NotFound for a missing instance."""
    missing = NotFound(f"the object has no attribute '{name}' at index {index}", code="attribute_not_found")
    if name == NAME:
        if index != 0:
            raise missing
        current = row.name
        if operation == "add" and current is not None:
            raise Conflict(f"the object has a {NAME} already; use ModifyAttribute to change it",
                           code="attribute_exists")
        if operation != "add" and current is None:
            raise missing
        if operation == "delete":
            if isinstance(row, ManagedKey):
                raise Conflict("a managed key always has a name: modify it instead", code="illegal_state")
            row.name = None
            return current
        row.name = value
        return value
    if isinstance(row, ManagedKey) and name.startswith("x-"):
        tags = dict(row.tags)
        store: dict[str, Any] = {f"x-{k}": v for k, v in tags.items()}
    else:
        store = dict(row.kmip_attributes or {})
    if name in MULTI_INSTANCE:
        instances = list(store.get(name) or [])
        if operation == "add":
            if len(instances) >= MAX_INSTANCES:
                raise InvalidInput(f"at most {MAX_INSTANCES} instances of '{name}'")
            instances.append(value)
            result = value
        else:
            if not 0 <= index < len(instances):
                raise missing
            result = instances[index] if operation == "delete" else value
            if operation == "delete":
                del instances[index]
            else:
                instances[index] = value
        store[name] = instances
        if not instances:
            del store[name]
    else:
        if index != 0:
            raise missing
        if operation == "add" and name in store:
            raise Conflict(f"the object has the attribute '{name}' already; use ModifyAttribute to change it",
                           code="attribute_exists")
        if operation != "add" and name not in store:
            raise missing
        result = store.pop(name) if operation == "delete" else value
        if operation != "delete":
            store[name] = value
    if isinstance(row, ManagedKey) and name.startswith("x-"):
        row.tags = validate_tags({k[2:]: v for k, v in store.items()})
    else:
        row.kmip_attributes = store
    return result


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def use_window(obj: VersionObject | StandaloneObject) -> tuple[datetime | None, datetime | None]:
    """(Process Start Date, Protect Stop Date) of a symmetric key version, if it has them."""
    if not isinstance(obj, VersionObject):
        return None, None
    stored = obj.key.kmip_attributes or {}
    out: list[datetime | None] = []
    for name in (PROCESS_START_DATE, PROTECT_STOP_DATE):
        at = (stored.get(name) or {}).get(str(obj.version.version))
        out.append(datetime.fromtimestamp(int(at), UTC) if at is not None else None)
    return out[0], out[1]


def use_refusal(obj: VersionObject | StandaloneObject, use: str, now: datetime) -> str | None:
    """Why the object's dates forbid `use` now, or None. Enforced at the moment of use, not
    only when the scheduler next changes the state: a Deactivation Date that has passed
    stops protection at once, as do a passed Protect Stop Date and a Process Start Date
    still to come for processing (KMIP 1.4 §3.24-3.26)."""
    what = object_type_of(obj)
    deactivation = obj.version.deactivation_date if isinstance(obj, VersionObject) else obj.deactivation_date
    if use in PROTECT_USES and deactivation is not None and _aware(deactivation) <= now:
        return (f"the {what}'s Deactivation Date ({_aware(deactivation).isoformat()}) has passed: it no longer "
                f"may {use}; it may still process (decrypt, verify)")
    process_start, protect_stop = use_window(obj)
    if use in PROTECT_USES and protect_stop is not None and protect_stop <= now:
        return (f"the {what}'s Protect Stop Date ({protect_stop.isoformat()}) has passed: it no longer may {use}; "
                "it may still decrypt until it is deactivated")
    if use in PROCESS_USES and process_start is not None and process_start > now:
        return (f"the {what}'s Process Start Date ({process_start.isoformat()}) is still to come: it may not "
                f"{use.replace('_', ' ')} before then")
    return None


def stored_parameters(obj: VersionObject | StandaloneObject) -> list[dict[str, Any]]:
    """The Cryptographic Parameters instances set when the object was made: each use's defaults."""
    stored = (obj.key.kmip_attributes if isinstance(obj, VersionObject) else obj.kmip_attributes) or {}
    return [dict(p) for p in stored.get(CRYPTOGRAPHIC_PARAMETERS) or []]


def usage_of(obj: VersionObject | StandaloneObject) -> Usage:
    """What the object may be used for (keyserver/core/usage.py): every operation that
    uses a key checks it."""
    if isinstance(obj, VersionObject):
        return uses_of("symmetric-key", obj.key.algorithm, obj.key.kmip_attributes)
    algorithm = obj.algorithm if isinstance(obj, KmipSealedObject) else public_key_algorithm(obj)
    return uses_of(object_type_of(obj), algorithm, obj.kmip_attributes)


_EC_PUBLIC_KEY_OID = bytes.fromhex("06072a8648ce3d0201")  # id-ecPublicKey, as DER


def _public_bits(key: rsa.RSAPublicKey | ec.EllipticCurvePublicKey) -> int:
    return key.key_size if isinstance(key, rsa.RSAPublicKey) else key.curve.key_size


def public_key_algorithm(pk: KmipPublicKey) -> str:
    """"RSA" or "EC". The table keeps no algorithm: the SubjectPublicKeyInfo's
    AlgorithmIdentifier (in its first bytes) says it. (PKCS#1 public keys are RSA.)"""
    return "EC" if _EC_PUBLIC_KEY_OID in pk.der[:24] else "RSA"


def audit_identity(obj: VersionObject | StandaloneObject) -> tuple[str, str]:
    """(object type, object id) an object is audited under, whatever the operation: a
    symmetric key version under its managed key (as REST records it), with the version
    and KMIP identifier in the details; other objects under their KMIP identifier."""
    if isinstance(obj, VersionObject):
        return "key", str(obj.key.id)
    return object_type_of(obj).replace("-", "_"), str(obj.id)


def audit_details(obj: VersionObject | StandaloneObject) -> dict[str, object]:
    if isinstance(obj, VersionObject):
        return {"name": obj.key.name, "version": obj.version.version, "kmip_uid": obj.uid}
    return {"name": obj.name}


def object_type_of(obj: VersionObject | StandaloneObject) -> str:
    if isinstance(obj, VersionObject):
        return "symmetric-key"
    if isinstance(obj, KmipPublicKey):
        return "public-key"
    return obj.object_type


def _load_public_der(der: bytes) -> object:
    """SubjectPublicKeyInfo, or KMIP's PKCS#1 RSAPublicKey (via its PEM armour)."""
    try:
        return serialization.load_der_public_key(der)
    except ValueError:
        pem = b"-----BEGIN RSA PUBLIC KEY-----\n" + base64.encodebytes(der) + b"-----END RSA PUBLIC KEY-----\n"
        return serialization.load_pem_public_key(pem)
