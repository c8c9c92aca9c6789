"""Databases that keep their encryption keys in Strongroom (issue 27, docs/integrations.md).

A *database identity* (MariaDB with its `hashicorp_key_management` plugin) reads keys
over a HashiCorp Vault KV-v2 compatible front with a bearer token (`X-Vault-Token`).
It reads only what was granted to it: a managed AES key under a numeric key id (the
id the database asks for, 1..2^32-1). Strongroom's key versions are the KV versions,
so a rotation is a new KV version the database picks up; a key with no Active version
(revoked, deactivated) has no latest version, so the database cannot open what it
encrypted under it; destroyed versions are gone.

Rules of a read (`read`), decided here and audited with the database as the actor
(`database:<name>`), never with the bytes:
* latest (no version asked): the key's newest version, only while it is Active;
* a version by number: while it is Active or Deactivated (KMIP's "process, not
  protect": pages not yet re-encrypted after a rotation stay readable), and only
  while the key still has an Active version: a revoked key refuses old versions too;
* Compromised versions are refused, destroyed ones and versions that never existed
  are not found.

The token is stored as a lookup id and a SHA-256 of its secret, compared in constant
time (as API tokens: core/identity/tokens.py); a new token replaces the old at once.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import NoReturn

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from hsm import HsmBackend, HsmError, HsmIntegrityError
from keyserver.core.approvals import ApprovalService
from keyserver.core.audit import AuditService, utcnow
from keyserver.core.errors import Conflict, Forbidden, IntegrityFailure, InvalidInput, NotFound, hsm_failure
from keyserver.core.identity.records import check_secret, mint_secret, split_secret
from keyserver.core.keys import key_filter, version_wrapped
from keyserver.core.permissions import Permission
from keyserver.core.policy import Policy
from keyserver.core.principal import ANONYMOUS, Principal, RequestContext
from keyserver.core.states import DESTROYED_STATES, KeyState
from keyserver.store.databases import DatabaseGrant, DatabaseIdentity
from keyserver.store.models import AuditUsageHourly, KeyVersion, ManagedKey

TOKEN_PREFIX = "srdb_"  # noqa: S105 - a public prefix, not a secret
KINDS = ("mariadb",)
MAX_KV_ID = 2**32 - 1
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$")
NAME_RULE = ("a database name is 1 to 64 lower-case letters, digits, '.', '_' or '-', beginning and ending "
             "with a letter or digit")
MAX_CONSUMERS = 100


@dataclass(frozen=True, slots=True)
class GrantRecord:
    key_id: int  # the database's numeric key id
    key_name: str
    key_uuid: uuid.UUID
    granted_at: datetime
    granted_by: str
    last_read_at: datetime | None
    last_read_version: int | None


@dataclass(frozen=True, slots=True)
class DatabaseRecord:
    id: uuid.UUID
    name: str
    description: str
    kind: str
    created_at: datetime
    created_by: str
    last_seen_at: datetime | None
    revoked_at: datetime | None
    grants: tuple[GrantRecord, ...]


@dataclass(frozen=True, slots=True)
class IssuedDatabase:
    database: DatabaseRecord
    token: str  # shown once


@dataclass(frozen=True, slots=True)
class KvSecret:
    """One key version as the KV front delivers it: the material (32 bytes for AES-256)
    goes to the database and nowhere else."""

    version: int
    created_time: datetime
    material: bytes


@dataclass(frozen=True, slots=True)
class Consumer:
    kind: str  # database | kmip-client
    name: str
    detail: str
    last_used_at: datetime | None


def _grant_record(g: DatabaseGrant) -> GrantRecord:
    return GrantRecord(key_id=g.kv_id, key_name=g.key.name, key_uuid=g.key_id, granted_at=g.granted_at,
                       granted_by=g.granted_by, last_read_at=g.last_read_at, last_read_version=g.last_read_version)


def database_record(d: DatabaseIdentity) -> DatabaseRecord:
    return DatabaseRecord(id=d.id, name=d.name, description=d.description, kind=d.kind, created_at=d.created_at,
                          created_by=d.created_by, last_seen_at=d.last_seen_at, revoked_at=d.revoked_at,
                          grants=tuple(_grant_record(g) for g in d.grants))


def check_kv_id(value: int) -> int:
    if not 1 <= value <= MAX_KV_ID:
        raise InvalidInput(f"key_id is the database's numeric key id, 1 to {MAX_KV_ID}", code="invalid_key_id")
    return value


def database_principal(name: str) -> Principal:
    """The actor a database's reads are recorded as."""
    return Principal(name=f"database:{name}", actor_type="host", role=None, permissions=frozenset())


class DatabaseService:
    def __init__(self, session_factory: sessionmaker[Session], hsm: HsmBackend, audit: AuditService,
                 policy: Policy, *, approvals: ApprovalService | None = None,
                 now: Callable[[], datetime] = utcnow) -> None:
        self._db = session_factory
        self._hsm = hsm
        self._audit = audit
        self._policy = policy
        self._approvals = approvals
        self._now = now

    # --- management --------------------------------------------------------------
    def list_all(self, ctx: RequestContext) -> list[DatabaseRecord]:
        self._policy.require(ctx, Permission.DATABASES_READ, action="database.list")
        with self._db() as s:
            rows = s.execute(select(DatabaseIdentity).order_by(DatabaseIdentity.name)).scalars()
            return [database_record(d) for d in rows]

    def get(self, ctx: RequestContext, name: str) -> DatabaseRecord:
        self._policy.require(ctx, Permission.DATABASES_READ, action="database.read", object_type="database",
                             object_id=name)
        with self._db() as s:
            return database_record(self._load(s, name))

    @staticmethod
    def _load(s: Session, name: str, *, lock: bool = False) -> DatabaseIdentity:
        stmt = select(DatabaseIdentity).where(DatabaseIdentity.name == name)
        if lock:
            stmt = stmt.with_for_update()
        row = s.execute(stmt).scalar_one_or_none()
        if row is None:
            raise NotFound(f"no database identity named '{name}'", code="database_not_found")
        return row

    @staticmethod
    def _new_token() -> tuple[str, str, str]:
        minted = mint_secret(TOKEN_PREFIX)
        return minted.lookup, minted.secret_hash, minted.token

    def create(self, ctx: RequestContext, *, name: str, description: str = "", kind: str = "mariadb") -> IssuedDatabase:
        self._policy.require(ctx, Permission.DATABASES_MANAGE, action="database.create", object_type="database",
                             object_id=name)
        if not NAME_RE.match(name):
            raise InvalidInput(NAME_RULE, code="invalid_database_name")
        if kind not in KINDS:
            raise InvalidInput(f"kind must be one of: {', '.join(KINDS)}", code="invalid_database_kind")
        if len(description) > 1000:
            raise InvalidInput("a description is at most 1,000 characters")
        now = self._now()
        lookup, digest, token = self._new_token()
        with self._db.begin() as s:
            if s.execute(select(DatabaseIdentity.id).where(DatabaseIdentity.name == name)).first() is not None:
                raise Conflict(f"a database identity named '{name}' exists (revoked ones keep their name)",
                               code="database_exists")
            row = DatabaseIdentity(id=uuid.uuid4(), name=name, description=description, kind=kind,
                                   token_lookup=lookup, token_hash=digest, token_issued_at=now, created_at=now,
                                   created_by=ctx.principal.name, grants=[])
            s.add(row)
            self._audit.add(s, ctx, action="database.create", object_type="database", object_id=name,
                            details={"kind": kind})
            s.flush()
            record = database_record(row)
        return IssuedDatabase(record, token)

    def reissue_token(self, ctx: RequestContext, name: str) -> IssuedDatabase:
        """A new token; the old one is refused from now on."""
        self._policy.require(ctx, Permission.DATABASES_MANAGE, action="database.token", object_type="database",
                             object_id=name)
        lookup, digest, token = self._new_token()
        with self._db.begin() as s:
            row = self._load(s, name, lock=True)
            if row.revoked_at is not None:
                raise Conflict(f"database '{name}' is revoked; create a new identity", code="database_revoked")
            row.token_lookup, row.token_hash, row.token_issued_at = lookup, digest, self._now()
            self._audit.add(s, ctx, action="database.token", object_type="database", object_id=name, details={})
            record = database_record(row)
        return IssuedDatabase(record, token)

    def revoke(self, ctx: RequestContext, name: str) -> DatabaseRecord:
        self._policy.require(ctx, Permission.DATABASES_MANAGE, action="database.revoke", object_type="database",
                             object_id=name)
        with self._db.begin() as s:
            row = self._load(s, name, lock=True)
            if row.revoked_at is None:
                row.revoked_at = self._now()
                self._audit.add(s, ctx, action="database.revoke", object_type="database", object_id=name,
                                details={"grants": [g.kv_id for g in row.grants]})
            return database_record(row)

    def grant(self, ctx: RequestContext, name: str, *, key: str, key_id: int) -> GrantRecord:
        """Make `key` readable by the database under `key_id`. Its material will leave in
        plaintext at each read: keys:export as well as databases:manage, and held by the
        two-person rule when `database.grant` is configured."""
        self._policy.require(ctx, Permission.DATABASES_MANAGE, action="database.grant", object_type="database",
                             object_id=name)
        self._policy.require(ctx, Permission.KEYS_EXPORT, action="database.grant", object_type="database",
                             object_id=name)
        check_kv_id(key_id)
        if not isinstance(key, str) or not 1 <= len(key) <= 128:
            raise InvalidInput("key is a key's name or id", code="invalid_key")
        with self._db() as s:
            self._check_grant(s, name, key, key_id)
        if self._approvals is not None:
            self._approvals.hold(ctx, action="database.grant", target=name,
                                 params={"database": name, "key": key, "key_id": key_id})
        now = self._now()
        with self._db.begin() as s:
            db, managed = self._check_grant(s, name, key, key_id, lock=True)
            grant = DatabaseGrant(id=uuid.uuid4(), database_id=db.id, kv_id=key_id, key_id=managed.id,
                                  granted_at=now, granted_by=ctx.principal.name)
            grant.key = managed
            s.add(grant)
            self._audit.add(s, ctx, action="database.grant", object_type="database", object_id=name,
                            details={"key": managed.name, "key_uuid": str(managed.id), "key_id": key_id})
            s.flush()
            return _grant_record(grant)

    def _check_grant(self, s: Session, name: str, key: str, key_id: int, *,
                     lock: bool = False) -> tuple[DatabaseIdentity, ManagedKey]:
        db = self._load(s, name, lock=lock)
        if db.revoked_at is not None:
            raise Conflict(f"database '{name}' is revoked", code="database_revoked")
        managed = s.execute(select(ManagedKey).where(key_filter(key))).scalar_one_or_none()
        if managed is None:
            raise NotFound(f"no key named or with id '{key}'", code="key_not_found")
        if managed.algorithm != "AES":
            raise Conflict(f"key '{managed.name}' is an {managed.algorithm} key; a database encrypts with AES keys",
                           code="wrong_key_algorithm")
        state = KeyState(managed.versions[-1].state)
        if state in DESTROYED_STATES:
            raise Conflict(f"key '{managed.name}' is {state.value}", code="key_destroyed")
        if state is not KeyState.ACTIVE:
            raise Conflict(f"key '{managed.name}' is {state.value}: a database needs an Active key "
                           "(activate it, or grant another key)", code="key_not_active")
        if not managed.exportable:
            raise Conflict(f"key '{managed.name}' is not exportable in plaintext (its policy), and a database reads "
                           "the key itself", code="key_not_exportable")
        if any(g.kv_id == key_id for g in db.grants):
            raise Conflict(f"database '{name}' already has key id {key_id}; revoke that grant first",
                           code="key_id_in_use")
        return db, managed

    def ungrant(self, ctx: RequestContext, name: str, key_id: int) -> None:
        self._policy.require(ctx, Permission.DATABASES_MANAGE, action="database.ungrant", object_type="database",
                             object_id=name)
        with self._db.begin() as s:
            db = self._load(s, name, lock=True)
            grant = next((g for g in db.grants if g.kv_id == key_id), None)
            if grant is None:
                raise NotFound(f"database '{name}' has no key id {key_id}", code="grant_not_found")
            db.grants.remove(grant)
            self._audit.add(s, ctx, action="database.ungrant", object_type="database", object_id=name,
                            details={"key": grant.key.name, "key_uuid": str(grant.key_id), "key_id": key_id})

    def consumers(self, ctx: RequestContext, key_ref: str) -> list[Consumer]:
        """The databases granted this key, and the KMIP clients that used it (the audit
        chain's hourly usage counts of the key and its versions: one indexed read)."""
        self._policy.require(ctx, Permission.KEYS_READ, action="key.consumers", object_type="key", object_id=key_ref)
        with self._db() as s:
            key = s.execute(select(ManagedKey).where(key_filter(key_ref))).scalar_one_or_none()
            if key is None:
                raise NotFound(f"no key named or with id '{key_ref}'", code="key_not_found")
            out = [Consumer(kind="database", name=g.database.name,
                            detail=f"key id {g.kv_id}" + (" (revoked)" if g.database.revoked_at else ""),
                            last_used_at=g.last_read_at)
                   for g in s.execute(select(DatabaseGrant).where(DatabaseGrant.key_id == key.id)
                                      .order_by(DatabaseGrant.granted_at).limit(MAX_CONSUMERS)).scalars()]
            ids = [str(key.id), *(str(v.id) for v in key.versions)]
            u = AuditUsageHourly
            used = s.execute(select(u.actor, func.max(u.hour), func.sum(u.count))
                             .where(u.key_id.in_(ids), u.actor.like("kmip:%"))
                             .group_by(u.actor).order_by(func.max(u.hour).desc()).limit(MAX_CONSUMERS))
            out += [Consumer(kind="kmip-client", name=actor.removeprefix("kmip:"), detail=f"{count} operations",
                             last_used_at=hour) for actor, hour, count in used]
        return out

    # --- the KV front --------------------------------------------------------------
    def _deny(self, ctx: RequestContext, *, action: str, object_type: str | None, object_id: str | None,
              details: dict[str, object], code: str) -> NoReturn:
        """Refused, audited; Vault's words to the caller ("permission denied")."""
        self._policy.deny(ctx, action=action, object_type=object_type, object_id=object_id, details=details,
                          message="permission denied", code=code)
        raise Forbidden("permission denied", code=code)  # deny raised already

    def authenticate(self, token: str | None, *, source_ip: str | None = None,
                     request_id: str | None = None) -> RequestContext:
        """The database behind a KV token, as a context for its reads; refusals audited."""
        anon = RequestContext(ANONYMOUS, source_ip, request_id)
        parts = split_secret(TOKEN_PREFIX, token)
        if parts is None:
            self._deny(anon, action="database.authenticate", object_type=None, object_id=None,
                       details={"code": "token_invalid"}, code="token_invalid")
        lookup, secret = parts
        with self._db() as s:
            row = s.execute(select(DatabaseIdentity.name, DatabaseIdentity.token_hash, DatabaseIdentity.revoked_at)
                            .where(DatabaseIdentity.token_lookup == lookup)).one_or_none()
        if not check_secret(secret, row.token_hash if row is not None else None) or row is None:
            self._deny(anon, action="database.authenticate", object_type=None, object_id=None,
                       details={"code": "token_invalid"}, code="token_invalid")
        ctx = RequestContext(database_principal(row.name), source_ip, request_id)
        if row.revoked_at is not None:
            self._deny(ctx, action="database.authenticate", object_type="database", object_id=row.name,
                       details={"code": "database_revoked"}, code="database_revoked")
        return ctx

    def read(self, ctx: RequestContext, *, kv_id: int, version: int | None) -> KvSecret:
        """Key id `kv_id` of the calling database at `version` (None: the latest)."""
        name = ctx.principal.name.removeprefix("database:")
        asked: dict[str, object] = {"key_id": kv_id, "version": version}
        with self._db() as s:
            db = self._load(s, name)
            grant = next((g for g in db.grants if g.kv_id == kv_id), None)
            key = grant.key if grant is not None else None
            versions = [] if key is None else list(s.execute(
                select(KeyVersion).where(KeyVersion.key_id == key.id).order_by(KeyVersion.version)).scalars())
        if db.revoked_at is not None or grant is None or key is None:
            reason = "database_revoked" if db.revoked_at is not None else "no_grant"
            self._deny(ctx, action="database.key_read", object_type="database", object_id=name,
                       details={**asked, "reason": reason}, code=reason)
        asked.update(key=key.name)
        newest = versions[-1]
        wanted = newest if version is None else next((v for v in versions if v.version == version), None)

        def refuse(reason: str, *, found: bool) -> NoReturn:
            details = {**asked, "reason": reason}
            if found:
                self._deny(ctx, action="database.key_read", object_type="key", object_id=str(key.id),
                           details=details, code=reason)
            self._audit.record_now(ctx, action="database.key_read", outcome="denied", object_type="key",
                                   object_id=str(key.id), details=details)
            raise NotFound(f"no version {version} of key id {kv_id}", code=reason)

        if wanted is None:
            refuse("no_such_version", found=False)
        state = KeyState(wanted.state)
        if state in DESTROYED_STATES:
            refuse("key_destroyed", found=False)
        if KeyState(newest.state) in DESTROYED_STATES:
            refuse("key_destroyed", found=False)
        if KeyState(newest.state) is not KeyState.ACTIVE:
            refuse("key_revoked" if newest.revocation_reason else "key_not_active", found=True)
        if state not in (KeyState.ACTIVE, KeyState.DEACTIVATED):
            refuse("key_compromised" if state is KeyState.COMPROMISED else "key_not_active", found=True)
        self._policy.gate(ctx, Permission.KEYS_EXPORT, action="database.key_read", object_type="key",
                          object_id=str(key.id))
        try:
            material = self._hsm.unwrap_key(version_wrapped(wanted))
        except HsmIntegrityError:
            raise IntegrityFailure() from None
        except HsmError as exc:
            raise hsm_failure("unwrap the key for the database", exc) from exc
        now = self._now()
        # Committed before the material is returned: no key leaves without its record.
        with self._db.begin() as s:
            s.execute(update(DatabaseIdentity).where(DatabaseIdentity.id == db.id).values(last_seen_at=now))
            s.execute(update(DatabaseGrant).where(DatabaseGrant.id == grant.id)
                      .values(last_read_at=now, last_read_version=wanted.version))
            self._audit.add(s, ctx, action="database.key_read", object_type="key", object_id=str(key.id),
                            details={**asked, "version": wanted.version, "latest": version is None,
                                     "state": state.value})
        return KvSecret(version=wanted.version, created_time=wanted.created_at, material=material)

    def check(self, ctx: RequestContext) -> None:
        """The database's token is good (the KV front's mount description): seen now."""
        name = ctx.principal.name.removeprefix("database:")
        with self._db.begin() as s:
            s.execute(update(DatabaseIdentity).where(DatabaseIdentity.name == name)
                      .values(last_seen_at=self._now()))

