"""AWS KMS external key stores (XKS, issue 28; docs/integrations.md, decision 0020).

AWS KMS keeps the keys of an *external key store* outside AWS and calls a proxy for each
use: GetKeyMetadata, Encrypt, Decrypt and GetHealthStatus (the XKS Proxy API, v1). Each
key store here has a name (its URI path prefix is `/xks/<name>`), an AWS region and a
SigV4 credential issued here: an access key id and a secret access key shown once. SigV4
verification needs the secret itself (an HMAC key), so it is kept sealed under the KEK
(core/kmip_sealed.py), never in plaintext in the database; once unsealed it is kept only
as the day's derived signing key, in memory, per credential.

Keys: an external key id names a managed AES-256 key granted to the store. Encrypt uses
the key's newest version through core/crypto.py (AES-GCM in the HSM, the token's 12-byte
IV), with the version carried in `ciphertextMetadata` (`SRX1` + the version, 4 bytes
big-endian), which is authenticated: the AAD given to the HSM is the API's own construction,
2-byte length of the request's AAD || AAD || 1-byte length of the metadata || metadata
(the encryption context arrives inside the request's AAD). Decrypt uses the version
the metadata names. A key whose newest version is not Active (revoked, deactivated,
destroyed) is DISABLED: Encrypt and Decrypt are refused (InvalidStateException).

Every call is audited with the key store as the actor (`xks:<name>`) and the AWS request
metadata (principal ARN, KMS operation, request id, key ARN), never with the data.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import re
import secrets
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NoReturn

from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session, sessionmaker

from hsm import AES_GCM, AES_KWP, HsmBackend, HsmError, WrappedKey
from keyserver.core import sigv4
from keyserver.core.audit import AuditService, PendingRecord, utcnow
from keyserver.core.crypto import CryptoService
from keyserver.core.errors import (
    Conflict,
    CoreError,
    Forbidden,
    IntegrityFailure,
    InvalidInput,
    NotFound,
    ServiceUnavailable,
    Unauthenticated,
    hsm_failure,
)
from keyserver.core.keys import key_filter
from keyserver.core.kmip_sealed import UnsealError, seal, unseal
from keyserver.core.permissions import Permission
from keyserver.core.policy import Policy
from keyserver.core.principal import ANONYMOUS, Principal, RequestContext
from keyserver.core.states import DESTROYED_STATES, KeyState
from keyserver.core.xks_cache import XksGrant, XksLookups
from keyserver.store.models import ManagedKey
from keyserver.store.notify import Notifier
from keyserver.store.xks import XksKey, XksStore

SERVICE = "kms-xks-proxy"
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$")
NAME_RULE = ("a key store name is 1 to 64 lower-case letters, digits, '.', '_' or '-', beginning and ending "
             "with a letter or digit")
REGION_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-[0-9]{1,2}$")
EXTERNAL_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
# A required client certificate subject: a DNS name (AWS KMS's is cks.kms.<region>.amazonaws.com).
SUBJECT_RE = re.compile(r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")
MAX_PLAINTEXT = 4300  # the XKS API's cap on plaintext (and so on ciphertext)
MAX_AAD = 8192
METADATA_MAGIC = b"SRX1"
METADATA_BYTES = 8
SEEN_EVERY = timedelta(minutes=1)
# The key store's actor: uses keys (the store's grants decide which), administers nothing.
XKS_PERMISSIONS = frozenset({Permission.KEYS_READ, Permission.KEYS_ENCRYPT, Permission.KEYS_DECRYPT})


@dataclass(frozen=True, slots=True)
class XksKeyRecord:
    external_id: str
    key_name: str
    key_uuid: uuid.UUID
    granted_at: datetime
    granted_by: str
    last_used_at: datetime | None


@dataclass(frozen=True, slots=True)
class XksStoreRecord:
    id: uuid.UUID
    name: str
    description: str
    region: str
    access_key_id: str
    credential_issued_at: datetime
    previous_access_key_id: str | None  # still accepted until retired
    client_cert_subject: str | None  # required of every call's client certificate when set
    created_at: datetime
    created_by: str
    last_seen_at: datetime | None
    revoked_at: datetime | None
    keys: tuple[XksKeyRecord, ...]


class Keep(enum.Enum):
    """`XksService.update`: leave this field as it is."""

    KEEP = 0


@dataclass(frozen=True, slots=True)
class IssuedStore:
    store: XksStoreRecord
    secret_access_key: str  # shown once


@dataclass(frozen=True, slots=True)
class XksCall:
    """What the front read from a request: the AWS metadata that goes into the audit."""

    operation: str  # metadata | encrypt | decrypt | health
    meta: dict[str, str]


@dataclass(frozen=True, slots=True)
class XksEncrypted:
    ciphertext: bytes
    iv: bytes
    tag: bytes
    metadata: bytes


@dataclass(frozen=True, slots=True)
class XksKeyStatus:
    enabled: bool


def _key_record(k: XksKey) -> XksKeyRecord:
    return XksKeyRecord(external_id=k.external_id, key_name=k.key.name, key_uuid=k.key_id, granted_at=k.granted_at,
                        granted_by=k.granted_by, last_used_at=k.last_used_at)


def store_record(r: XksStore) -> XksStoreRecord:
    return XksStoreRecord(id=r.id, name=r.name, description=r.description, region=r.region,
                          access_key_id=r.access_key_id, credential_issued_at=r.credential_issued_at,
                          previous_access_key_id=r.previous_access_key_id,
                          client_cert_subject=r.client_cert_subject, created_at=r.created_at,
                          created_by=r.created_by, last_seen_at=r.last_seen_at, revoked_at=r.revoked_at,
                          keys=tuple(_key_record(k) for k in r.keys))


def normalise_subject(value: str | None) -> str | None:
    """A required subject as stored (lower case: DNS names compare so), or None."""
    if value is None:
        return None
    if not isinstance(value, str) or not SUBJECT_RE.match(value.lower()):
        raise InvalidInput("client_cert_subject is a DNS name without wildcards, such as "
                           "cks.kms.eu-west-1.amazonaws.com (null: SigV4 alone)", code="invalid_client_cert_subject")
    return value.lower()


def xks_principal(name: str) -> Principal:
    return Principal(name=f"xks:{name}", actor_type="host", role=None, permissions=XKS_PERMISSIONS)


def ciphertext_metadata(version: int) -> bytes:
    return METADATA_MAGIC + version.to_bytes(4, "big")


def metadata_version(metadata: bytes) -> int:
    if len(metadata) != METADATA_BYTES or not metadata.startswith(METADATA_MAGIC):
        raise InvalidInput("ciphertextMetadata is not one this proxy wrote", code="invalid_ciphertext")
    return int.from_bytes(metadata[4:], "big")


class XksService:
    def __init__(self, session_factory: sessionmaker[Session], hsm: HsmBackend, audit: AuditService,
                 policy: Policy, crypto: CryptoService, current_kek: Callable[[], str], *,
                 notifier: Notifier | None = None, autocommit_engine: Engine | None = None,
                 cache_seconds: float = 30.0, now: Callable[[], datetime] = utcnow) -> None:
        self._db = session_factory
        # The proxy's reads in autocommit: no BEGIN/ROLLBACK round trips (as kmip_base.py).
        self._read = session_factory if autocommit_engine is None else sessionmaker(
            autocommit_engine, expire_on_commit=False)
        self._hsm = hsm
        self._audit = audit
        self._policy = policy
        self._crypto = crypto
        self._kek = current_kek
        self._now = now
        # (access key id, credential issued at, scope) -> the day's signing key; never the secret.
        self._keys: dict[tuple[str, datetime | None, sigv4.Scope], bytes] = {}
        self._keys_lock = threading.Lock()
        # What authenticate and _grant read, cached per replica (core/xks_cache.py).
        self._lookups = XksLookups(self._read, notifier, cache_seconds=cache_seconds)
        self._seen: dict[str, datetime] = {}  # last_seen_at as this replica last wrote it

    # --- management --------------------------------------------------------------
    def list_all(self, ctx: RequestContext) -> list[XksStoreRecord]:
        self._policy.require(ctx, Permission.XKS_READ, action="xks.list")
        with self._db() as s:
            return [store_record(r) for r in s.execute(select(XksStore).order_by(XksStore.name)).scalars()]

    def get(self, ctx: RequestContext, name: str) -> XksStoreRecord:
        self._policy.require(ctx, Permission.XKS_READ, action="xks.read", object_type="xks_store", object_id=name)
        with self._db() as s:
            return store_record(self._load(s, name))

    @staticmethod
    def _load(s: Session, name: str, *, lock: bool = False) -> XksStore:
        stmt = select(XksStore).where(XksStore.name == name)
        row = s.execute(stmt.with_for_update() if lock else stmt).scalar_one_or_none()
        if row is None:
            raise NotFound(f"no external key store named '{name}'", code="xks_store_not_found")
        return row

    def _credential(self) -> tuple[str, str, WrappedKey, bytes]:
        access = "SRXKS" + base64.b32encode(secrets.token_bytes(15)).decode()  # 29 of A-Z, 2-7
        secret = base64.b64encode(secrets.token_bytes(36)).decode()  # 48 characters
        try:
            sealed = seal(self._hsm, secret.encode(), kek_id=self._kek())
        except HsmError as exc:
            raise hsm_failure("seal the key store's secret access key", exc) from exc
        return access, secret, sealed.dek, sealed.material

    @staticmethod
    def _set_credential(row: XksStore, access: str, dek: WrappedKey, material: bytes, now: datetime) -> None:
        row.access_key_id, row.secret_dek_wrapping_key_id = access, dek.wrapping_key_id
        row.secret_dek_mechanism, row.secret_dek, row.secret_sealed = dek.mechanism, dek.ciphertext, material
        row.credential_issued_at = now

    def create(self, ctx: RequestContext, *, name: str, region: str, description: str = "",
               client_cert_subject: str | None = None) -> IssuedStore:
        self._policy.require(ctx, Permission.XKS_MANAGE, action="xks.create", object_type="xks_store",
                             object_id=name)
        if not NAME_RE.match(name):
            raise InvalidInput(NAME_RULE, code="invalid_xks_store_name")
        if not REGION_RE.match(region):
            raise InvalidInput("region is an AWS region name such as eu-west-1", code="invalid_region")
        if len(description) > 1000:
            raise InvalidInput("a description is at most 1,000 characters")
        subject = normalise_subject(client_cert_subject)
        access, secret, dek, material = self._credential()
        now = self._now()
        with self._db.begin() as s:
            if s.execute(select(XksStore.id).where(XksStore.name == name)).first() is not None:
                raise Conflict(f"an external key store named '{name}' exists (revoked ones keep their name)",
                               code="xks_store_exists")
            row = XksStore(id=uuid.uuid4(), name=name, description=description, region=region, created_at=now,
                           created_by=ctx.principal.name, client_cert_subject=subject, keys=[])
            self._set_credential(row, access, dek, material, now)
            s.add(row)
            self._lookups.changed(s)
            self._audit.add(s, ctx, action="xks.create", object_type="xks_store", object_id=name,
                            details={"region": region, "access_key_id": access, "client_cert_subject": subject})
            s.flush()
            return IssuedStore(store_record(row), secret)

    def update(self, ctx: RequestContext, name: str, *, description: str | Keep = Keep.KEEP,
               client_cert_subject: str | Keep | None = Keep.KEEP) -> XksStoreRecord:
        """Change a store's description or required client certificate subject (None:
        SigV4 alone again); audited with the subject before and after."""
        self._policy.require(ctx, Permission.XKS_MANAGE, action="xks.update", object_type="xks_store",
                             object_id=name)
        if not isinstance(description, Keep) and len(description) > 1000:
            raise InvalidInput("a description is at most 1,000 characters")
        subject = Keep.KEEP if isinstance(client_cert_subject, Keep) else normalise_subject(client_cert_subject)
        with self._db.begin() as s:
            row = self._load(s, name, lock=True)
            if row.revoked_at is not None:
                raise Conflict(f"external key store '{name}' is revoked; create a new one", code="xks_store_revoked")
            details: dict[str, object] = {}
            if not isinstance(description, Keep) and description != row.description:
                row.description, details["description"] = description, description
            if not isinstance(subject, Keep) and subject != row.client_cert_subject:
                details["client_cert_subject"] = {"from": row.client_cert_subject, "to": subject}
                row.client_cert_subject = subject
            if details:
                self._lookups.changed(s)
                self._audit.add(s, ctx, action="xks.update", object_type="xks_store", object_id=name, details=details)
            return store_record(row)

    def rotate_credential(self, ctx: RequestContext, name: str) -> IssuedStore:
        """A new access key id and secret. The pair it replaces stays accepted until
        `retire_previous` (the XKS API's rotation: both pairs work while AWS KMS's hosts
        move over); one before that is refused from now on."""
        self._policy.require(ctx, Permission.XKS_MANAGE, action="xks.credential", object_type="xks_store",
                             object_id=name)
        access, secret, dek, material = self._credential()
        with self._db.begin() as s:
            row = self._load(s, name, lock=True)
            if row.revoked_at is not None:
                raise Conflict(f"external key store '{name}' is revoked; create a new one", code="xks_store_revoked")
            dropped = row.previous_access_key_id
            row.previous_access_key_id, row.previous_dek_wrapping_key_id = (row.access_key_id,
                                                                            row.secret_dek_wrapping_key_id)
            row.previous_dek_mechanism, row.previous_dek = row.secret_dek_mechanism, row.secret_dek
            row.previous_sealed, row.previous_issued_at = row.secret_sealed, row.credential_issued_at
            s.flush()  # the old id leaves the unique access_key_id column before the new one arrives
            self._set_credential(row, access, dek, material, self._now())
            self._lookups.changed(s)
            self._audit.add(s, ctx, action="xks.credential", object_type="xks_store", object_id=name,
                            details={"access_key_id": access, "previous": row.previous_access_key_id,
                                     "dropped": dropped})
            return IssuedStore(store_record(row), secret)

    def retire_previous(self, ctx: RequestContext, name: str) -> XksStoreRecord:
        """Refuse the credential the last re-issue replaced, from now on."""
        self._policy.require(ctx, Permission.XKS_MANAGE, action="xks.credential_retire", object_type="xks_store",
                             object_id=name)
        with self._db.begin() as s:
            row = self._load(s, name, lock=True)
            if row.previous_access_key_id is None:
                raise Conflict(f"key store '{name}' has no previous credential", code="no_previous_credential")
            retired = row.previous_access_key_id
            row.previous_access_key_id = row.previous_dek_wrapping_key_id = row.previous_dek_mechanism = None
            row.previous_dek = row.previous_sealed = None
            row.previous_issued_at = None
            self._lookups.changed(s)
            self._audit.add(s, ctx, action="xks.credential_retire", object_type="xks_store", object_id=name,
                            details={"access_key_id": retired})
            return store_record(row)

    def revoke(self, ctx: RequestContext, name: str) -> XksStoreRecord:
        self._policy.require(ctx, Permission.XKS_MANAGE, action="xks.revoke", object_type="xks_store",
                             object_id=name)
        with self._db.begin() as s:
            row = self._load(s, name, lock=True)
            if row.revoked_at is None:
                row.revoked_at = self._now()
                self._lookups.changed(s)
                self._audit.add(s, ctx, action="xks.revoke", object_type="xks_store", object_id=name,
                                details={"keys": [k.external_id for k in row.keys]})
            return store_record(row)

    def grant(self, ctx: RequestContext, name: str, *, key: str, external_id: str | None = None) -> XksKeyRecord:
        """Let AWS KMS use a managed AES-256 key through this store under `external_id`
        (default: the key's name). The key never leaves the HSM."""
        self._policy.require(ctx, Permission.XKS_MANAGE, action="xks.grant", object_type="xks_store",
                             object_id=name)
        if not isinstance(key, str) or not 1 <= len(key) <= 128:
            raise InvalidInput("key is a key's name or id", code="invalid_key")
        with self._db.begin() as s:
            row = self._load(s, name, lock=True)
            if row.revoked_at is not None:
                raise Conflict(f"external key store '{name}' is revoked", code="xks_store_revoked")
            managed = s.execute(select(ManagedKey).where(key_filter(key))).scalar_one_or_none()
            if managed is None:
                raise NotFound(f"no key named or with id '{key}'", code="key_not_found")
            ext = external_id or managed.name
            if not EXTERNAL_ID_RE.match(ext):
                raise InvalidInput("an external key id is 1 to 128 letters, digits, '.', '_' or '-'",
                                   code="invalid_external_key_id")
            if managed.algorithm != "AES" or managed.length_bits != 256:
                raise Conflict(f"key '{managed.name}' is not an AES-256 key; an external key store uses AES-256 keys",
                               code="wrong_key_algorithm")
            state = KeyState(managed.versions[-1].state)
            if state is not KeyState.ACTIVE:
                raise Conflict(f"key '{managed.name}' is {state.value}: grant an Active key", code="key_not_active")
            if any(k.external_id == ext for k in row.keys):
                raise Conflict(f"key store '{name}' already has external key id '{ext}'", code="external_id_in_use")
            grant = XksKey(id=uuid.uuid4(), store_id=row.id, external_id=ext, key_id=managed.id,
                           granted_at=self._now(), granted_by=ctx.principal.name)
            grant.key = managed
            s.add(grant)
            self._lookups.changed(s)
            self._audit.add(s, ctx, action="xks.grant", object_type="xks_store", object_id=name,
                            details={"key": managed.name, "key_uuid": str(managed.id), "external_id": ext})
            s.flush()
            return _key_record(grant)

    def ungrant(self, ctx: RequestContext, name: str, external_id: str) -> None:
        self._policy.require(ctx, Permission.XKS_MANAGE, action="xks.ungrant", object_type="xks_store",
                             object_id=name)
        with self._db.begin() as s:
            row = self._load(s, name, lock=True)
            grant = next((k for k in row.keys if k.external_id == external_id), None)
            if grant is None:
                raise NotFound(f"key store '{name}' has no external key id '{external_id}'", code="grant_not_found")
            row.keys.remove(grant)
            self._lookups.changed(s)
            self._audit.add(s, ctx, action="xks.ungrant", object_type="xks_store", object_id=name,
                            details={"key": grant.key.name, "key_uuid": str(grant.key_id), "external_id": external_id})

    # --- the proxy front -----------------------------------------------------------
    def _refuse(self, ctx: RequestContext, call: XksCall, exc: CoreError, *, object_type: str | None = None,
                object_id: str | None = None, outcome: str = "denied") -> NoReturn:
        self._audit.record_now(ctx, action=f"xks.{call.operation}", outcome=outcome,  # type: ignore[arg-type]
                               object_type=object_type, object_id=object_id,
                               details={**call.meta, "refused": exc.code})
        raise exc

    def refused(self, ctx: RequestContext, call: XksCall, reason: str) -> None:
        """A request the front refused after authenticating it (malformed input): audited."""
        self._audit.record_now(ctx, action=f"xks.{call.operation}", outcome="denied", object_type="xks_store",
                               object_id=ctx.principal.name.removeprefix("xks:"), details={**call.meta,
                                                                                          "refused": reason})

    def authenticate(self, store: str, call: XksCall, *, authorization: str | None, method: str, raw_path: str,
                     query: str, headers: dict[str, str], body: bytes, source_ip: str | None,
                     request_id: str | None, client_names: frozenset[str] | None = None) -> RequestContext:
        """The key store a SigV4-signed request comes from; every refusal audited.
        `client_names`: the CN and DNS names of the client certificate the XKS port
        verified, None without one. A store with a required subject refuses a call
        without it before its signature is looked at (decision 0023)."""
        anon = RequestContext(ANONYMOUS, source_ip, request_id)
        signed: sigv4.Signed | None = None
        unsigned: sigv4.SigV4Error | None = None
        try:
            signed = sigv4.parse(authorization, headers, now=self._now())
        except sigv4.SigV4Error as exc:
            unsigned = exc
        access = signed.scope.access_key_id if signed is not None else ""
        rows = self._lookups.store_rows(store, access)
        target = next((r for r in rows if r.name == store), None)
        if target is not None and target.client_cert_subject is not None:
            self._check_certificate(anon, call, target, client_names)
        if signed is None:
            assert unsigned is not None
            self._refuse(anon, call, Unauthenticated(str(unsigned), code="signature_invalid"),
                         object_type="xks_store", object_id=store)
        row = next((r for r in rows if access and access in (r.access_key_id, r.previous_access_key_id)), None)
        if row is None or row.revoked_at is not None:
            self._refuse(anon, call, Unauthenticated("unknown or revoked access key id", code="credential_invalid"),
                         object_type="xks_store", object_id=store)
        scope = signed.scope
        if scope.service != SERVICE or scope.region != row.region:
            self._refuse(anon, call, Unauthenticated(
                f"the credential scope must name service {SERVICE} and this key store's region",
                code="scope_invalid"), object_type="xks_store", object_id=store)
        key = self._signing_key(access, row, scope)
        try:
            sigv4.verify(signed, key, method=method, raw_path=raw_path, query=query, headers=headers, body=body)
        except sigv4.SigV4Error as exc:
            self._refuse(anon, call, Unauthenticated(str(exc), code="signature_invalid"), object_type="xks_store",
                         object_id=store)
        ctx = RequestContext(xks_principal(row.name), source_ip, request_id)
        if row.name != store:
            self._refuse(ctx, call, Forbidden("this credential belongs to another key store", code="wrong_store"),
                         object_type="xks_store", object_id=store)
        now = self._now()
        seen = max(filter(None, (row.last_seen_at, self._seen.get(store))), default=None)
        if seen is None or now - seen > SEEN_EVERY:
            with self._db.begin() as s:  # (first: a call retried in a thread must write it again)
                s.execute(update(XksStore).where(XksStore.name == store).values(last_seen_at=now))
            self._seen[store] = now
        return ctx

    def _check_certificate(self, anon: RequestContext, call: XksCall, target: XksStore,
                           client_names: frozenset[str] | None) -> None:
        required = target.client_cert_subject
        if client_names is None:
            exc = Unauthenticated(f"key store '{target.name}' requires a client certificate (mutual TLS): AWS KMS "
                                  "must call the XKS port with the key store's mTLS setting on",
                                  code="client_certificate_required")
        elif required not in {n.lower() for n in client_names}:
            exc = Unauthenticated(f"the client certificate's subject is not the one key store '{target.name}' "
                                  "requires", code="client_certificate_subject")
        else:
            return
        self._audit.record_now(anon, action=f"xks.{call.operation}", outcome="denied", object_type="xks_store",
                               object_id=target.name,
                               details={**call.meta, "refused": exc.code, "required_subject": required,
                                        "client_certificate": None if client_names is None else sorted(client_names)})
        raise exc

    def _signing_key(self, access: str, row: XksStore, scope: sigv4.Scope) -> bytes:
        current = access == row.access_key_id
        issued = row.credential_issued_at if current else row.previous_issued_at
        cache_key = (access, issued, scope)
        with self._keys_lock:
            hit = self._keys.get(cache_key)
        if hit is not None:
            return hit
        if current:
            dek = WrappedKey(row.secret_dek_wrapping_key_id, row.secret_dek_mechanism, row.secret_dek)
            sealed = row.secret_sealed
        else:
            assert row.previous_dek_wrapping_key_id and row.previous_dek_mechanism
            assert row.previous_dek is not None and row.previous_sealed is not None
            dek = WrappedKey(row.previous_dek_wrapping_key_id, row.previous_dek_mechanism, row.previous_dek)
            sealed = row.previous_sealed
        try:
            secret = unseal(self._hsm, dek, sealed, mechanism=AES_KWP, der=False).decode()
        except UnsealError:
            raise IntegrityFailure() from None
        except HsmError as exc:
            raise hsm_failure("unseal the key store's secret access key", exc) from exc
        key = sigv4.signing_key(secret, scope)
        with self._keys_lock:
            if len(self._keys) > 1000:
                self._keys.clear()
            self._keys[cache_key] = key
        return key

    def _grant(self, ctx: RequestContext, call: XksCall, external_id: str) -> XksGrant:
        store = ctx.principal.name.removeprefix("xks:")
        grant = self._lookups.grant(store, external_id)
        if grant is None:
            self._refuse(ctx, call, NotFound(f"no external key '{external_id}' in this key store",
                                             code="xks_key_not_found"), object_type="xks_store", object_id=store)
        return grant

    def _enabled(self, ctx: RequestContext, call: XksCall, grant: XksGrant) -> None:
        newest = grant.newest
        state = KeyState(newest.state)
        if state is not KeyState.ACTIVE:
            why = "destroyed" if state in DESTROYED_STATES else (
                "revoked" if newest.revocation_reason else state.value)
            self._refuse(ctx, call, Conflict(f"the external key is disabled (its key is {why})",
                                             code="key_disabled"), object_type="key", object_id=str(grant.key_id))

    def _details(self, call: XksCall, grant: XksGrant) -> dict[str, object]:
        return {"xks_operation": call.operation, "external_id": grant.external_id, **call.meta}

    def key_status(self, ctx: RequestContext, call: XksCall, external_id: str) -> XksKeyStatus:
        grant = self._grant(ctx, call, external_id)
        enabled = KeyState(grant.newest.state) is KeyState.ACTIVE
        self._audit.commit(PendingRecord(ctx=ctx, action="xks.metadata", object_type="key",
                                         object_id=str(grant.key_id),
                                         details={**self._details(call, grant), "enabled": enabled}))
        return XksKeyStatus(enabled=enabled)

    def encrypt(self, ctx: RequestContext, call: XksCall, external_id: str, plaintext: bytes,
                aad: bytes) -> XksEncrypted:
        grant = self._grant(ctx, call, external_id)
        self._enabled(ctx, call, grant)
        newest = grant.newest
        metadata = ciphertext_metadata(newest.number)
        out = self._crypto.encrypt(ctx, str(newest.id), plaintext, mode=AES_GCM, aad=gcm_aad(aad, metadata),
                                   details={**self._details(call, grant), "version": newest.number})
        return XksEncrypted(ciphertext=out.data, iv=out.iv, tag=out.tag, metadata=metadata)

    def decrypt(self, ctx: RequestContext, call: XksCall, external_id: str, ciphertext: bytes, *, aad: bytes,
                iv: bytes, tag: bytes, metadata: bytes) -> bytes:
        grant = self._grant(ctx, call, external_id)
        self._enabled(ctx, call, grant)
        try:
            number = metadata_version(metadata)
        except InvalidInput as exc:
            self._refuse(ctx, call, exc, object_type="key", object_id=str(grant.key_id))
        # Every version of the key is in the grant (a new one comes with a notification);
        # its state is the HSM call's to check (CryptoService, as before).
        version = grant.versions.get(number)
        if version is None:
            self._refuse(ctx, call, InvalidInput("the ciphertext names no version of this key",
                                                 code="invalid_ciphertext"), object_type="key",
                         object_id=str(grant.key_id))
        return self._crypto.decrypt(ctx, str(version.id), ciphertext, mode=AES_GCM, iv=iv,
                                    aad=gcm_aad(aad, metadata),
                                    tag=tag, details={**self._details(call, grant), "version": number})

    def health(self, ctx: RequestContext, call: XksCall) -> bool:
        """The HSM answers (True) or not; audited."""
        try:
            self._hsm.check()
            healthy = True
        except (HsmError, ServiceUnavailable):
            healthy = False
        self._audit.commit(PendingRecord(ctx=ctx, action="xks.health", object_type="xks_store",
                                         object_id=ctx.principal.name.removeprefix("xks:"),
                                         details={**call.meta, "hsm": "ok" if healthy else "unavailable"}))
        return healthy


def gcm_aad(aad: bytes, metadata: bytes) -> bytes:
    """The AAD for AES-GCM as the XKS API defines it (Encrypt, "ciphertextMetadata"): both
    lengths included, so metadata passed as AAD (or the reverse) cannot authenticate."""
    return len(aad).to_bytes(2, "big") + aad + len(metadata).to_bytes(1, "big") + metadata


def integrity_value(aad: bytes, metadata: bytes, iv: bytes, ciphertext: bytes, tag: bytes) -> bytes:
    """The XKS API's ciphertextDataIntegrityValue (SHA_256): over AAD, ciphertextMetadata,
    IV, ciphertext and authentication tag, in that order."""
    return hashlib.sha256(aad + metadata + iv + ciphertext + tag).digest()
