"""Managed keys: named AES-256 keys with versions and a KMIP lifecycle.

Material exists outside the HSM only as a blob wrapped under the current KEK. Every
change is audited inside its own transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Select, case, exists, func, or_, select
from sqlalchemy.orm import Session, aliased, lazyload, sessionmaker
from sqlalchemy.orm.attributes import set_committed_value

from hsm import HsmBackend, HsmError, WrappedKey
from keyserver.core.approvals import ApprovalService
from keyserver.core.audit import AuditService, utcnow
from keyserver.core.errors import Conflict, InvalidInput, NotFound, hsm_failure
from keyserver.core.inventory import refuse_in_use
from keyserver.core.kek import KekService
from keyserver.core.kmip_dates import objects_due
from keyserver.core.names import UUID_RE, check_group, check_name
from keyserver.core.permissions import Permission
from keyserver.core.policy import Policy
from keyserver.core.principal import RequestContext
from keyserver.core.states import DESTROYED_STATES, KeyState, check_transition
from keyserver.core.views import KeyView
from keyserver.store.models import KeyVersion, ManagedKey
from keyserver.store.notify import Notifier, Topic

MAX_TAGS = 50
REVOCATION_REASONS = frozenset({"unspecified", "key-compromise", "ca-compromise", "affiliation-changed", "superseded",
                                "cessation-of-operation", "privilege-withdrawn"})
COMPROMISE_REASONS = frozenset({"key-compromise", "ca-compromise"})


# What a key list can be sorted by (GET /keys?sort=…).
SORTABLE: dict[str, Any] = {"name": ManagedKey.name, "owner": ManagedKey.owner, "created_at": ManagedKey.created_at,
                            "updated_at": ManagedKey.updated_at, "next_rotation_at": ManagedKey.next_rotation_at}


@dataclass(frozen=True, slots=True)
class KeySpec:
    name: str
    description: str = ""
    tags: dict[str, str] | None = None
    owner: str | None = None
    activate: bool = True
    activation_date: datetime | None = None
    deactivation_date: datetime | None = None
    rotation_period_days: int | None = None
    # AES key length; 256 unless a protocol asks otherwise (KMIP Create can ask 128/192).
    length_bits: int = 256
    # Caller-supplied material (KMIP Register): wrapped under the KEK at once, never stored plain.
    material: bytes | None = field(default=None, repr=False)
    # Or a caller's wrapped key re-wrapped under the KEK in the HSM (KmipRegistry.unwrap_for_import).
    wrapped: WrappedKey | None = field(default=None, repr=False)
    import_details: dict[str, Any] | None = None
    # REST admits one live key per name (so /keys/{name} is one key); a KMIP Name is a
    # label that several objects may carry (keyserver/core/names.py).
    unique_name: bool = True
    kmip_attributes: dict[str, Any] | None = None
    # "AES", or an HMAC key (KMIP Create/Register): "HMAC-SHA256", "HMAC-SHA384", "HMAC-SHA512".
    algorithm: str = "AES"
    # False: never exported in plaintext (KMIP Get), only wrapped under another key.
    exportable: bool = True
    kmip_group: str | None = None  # KMIP tenancy; a KMIP client's keys always go to its own group


AES_LENGTHS = frozenset({128, 192, 256})
# An HMAC key is a generic secret at least as long as its hash's output (SoftHSM2 and
# RFC 2104's advice); generated keys are that long, registered ones 16-128 bytes.
HMAC_ALGORITHMS = {"HMAC-SHA256": 256, "HMAC-SHA384": 384, "HMAC-SHA512": 512}
ALGORITHMS = frozenset({"AES", *HMAC_ALGORITHMS})


PROTECT_STOP_DATE = "Protect Stop Date"  # in kmip_attributes, per version: {"<version>": epoch seconds}


def protection_ends(kmip_attributes: dict[str, Any] | None, version: int,
                    deactivation_date: datetime | None) -> datetime | None:
    """When a key version stops protecting new data: its Deactivation Date or its KMIP
    Protect Stop Date, whichever comes first. Every path that encrypts checks it at the
    moment of use, not only when the scheduler next changes the state."""
    at = ((kmip_attributes or {}).get(PROTECT_STOP_DATE) or {}).get(str(version))
    ends = [d if d.tzinfo is not None else d.replace(tzinfo=UTC) for d in (deactivation_date,) if d is not None]
    if at is not None:
        ends.append(datetime.fromtimestamp(int(at), UTC))
    return min(ends) if ends else None


def require_aes(key: ManagedKey, purpose: str) -> None:
    """Data keys, guard points and host delivery use AES keys only."""
    if key.algorithm != "AES":
        raise Conflict(f"key '{key.name}' is an {key.algorithm} key; {purpose} needs an AES key",
                       code="wrong_key_algorithm")


def key_state(key: KeyView) -> KeyState:
    """A key's state is its newest version's: that is the one new data would use."""
    return KeyState(key.versions[-1].state)


def version_wrapped(v: KeyVersion) -> WrappedKey:
    if v.wrapped_key is None or v.wrapping_key_id is None or v.wrapping_mechanism is None:
        raise Conflict(f"version {v.version} has no key material (destroyed)", code="key_destroyed")
    return WrappedKey(wrapping_key_id=v.wrapping_key_id, mechanism=v.wrapping_mechanism, ciphertext=v.wrapped_key)


def validate_tags(tags: dict[str, str]) -> dict[str, str]:
    if len(tags) > MAX_TAGS:
        raise InvalidInput(f"at most {MAX_TAGS} tags per key")
    for k, v in tags.items():
        if not isinstance(k, str) or not 1 <= len(k) <= 64 or not isinstance(v, str) or len(v) > 256:
            raise InvalidInput("tag names are 1-64 characters, values at most 256")
    return dict(tags)


def live_key_named(name: str) -> Any:
    """A statement selecting the id of a live key (some version not destroyed) named `name`."""
    v = aliased(KeyVersion)
    return select(ManagedKey.id).where(ManagedKey.name == name, exists().where(
        v.key_id == ManagedKey.id, v.state.not_in([st.value for st in DESTROYED_STATES])))


def key_filter(ref: str) -> Any:
    """A key is named by its UUID or by its name (names can never look like UUIDs). A
    name means its live key; where KMIP clients gave several live keys one name, the
    newest; where every key of that name is destroyed, the newest of those."""
    if UUID_RE.match(ref):
        return ManagedKey.id == uuid.UUID(ref)
    # Aliases: the subquery must not correlate with a caller's own ManagedKey/KeyVersion.
    k, v = aliased(ManagedKey), aliased(KeyVersion)
    live = exists().where(v.key_id == k.id, v.state.not_in([st.value for st in DESTROYED_STATES]))
    chosen = (select(k.id).where(k.name == ref)
              .order_by(case((live, 0), else_=1), k.created_at.desc(), k.id).limit(1).scalar_subquery())
    return ManagedKey.id == chosen


class KeyService:
    def __init__(
        self,
        session_factory: sessionmaker[Session],
        hsm: HsmBackend,
        audit: AuditService,
        policy: Policy,
        keks: KekService,
        notifier: Notifier,
        *,
        approvals: ApprovalService | None = None,
        now: Callable[[], datetime] = utcnow,
    ) -> None:
        self._approvals = approvals
        self._db = session_factory
        self._hsm = hsm
        self._audit = audit
        self._policy = policy
        self._keks = keks
        self._notifier = notifier
        self._now = now

    # --- reading -------------------------------------------------------------
    def list(
        self, ctx: RequestContext, *, q: str | None = None, state: str | None = None,
        tag: str | None = None, limit: int = 50, offset: int = 0, sort: str = "name",
    ) -> tuple[list[ManagedKey], int]:
        """A page of keys; `sort` is a column of SORTABLE, "-" first for descending (ties
        by name, so pages never overlap)."""
        self._policy.require(ctx, Permission.KEYS_READ, action="key.list")
        if not 1 <= limit <= 500 or offset < 0:
            raise InvalidInput("limit must be 1-500 and offset >= 0")
        column = SORTABLE.get(sort.removeprefix("-"))
        if column is None:
            raise InvalidInput(f"sort by one of {', '.join(SORTABLE)} (with '-' first for descending)")
        # Keys without a scheduled rotation sort last either way.
        order = [column.is_(None), column.desc() if sort.startswith("-") else column.asc(), ManagedKey.name]
        stmt: Select[Any] = select(ManagedKey)
        if q:
            like = f"%{q.lower()}%"
            stmt = stmt.where(or_(func.lower(ManagedKey.name).like(like),
                                  func.lower(ManagedKey.description).like(like)))
        if state:
            try:
                wanted = KeyState(state)
            except ValueError:
                raise InvalidInput(f"unknown state '{state}'") from None
            newest = (select(func.max(KeyVersion.version)).where(KeyVersion.key_id == ManagedKey.id)
                      .correlate(ManagedKey).scalar_subquery())
            stmt = stmt.join(KeyVersion, (KeyVersion.key_id == ManagedKey.id)
                             & (KeyVersion.version == newest)).where(KeyVersion.state == wanted.value)
        if tag:
            name, has_value, value = tag.partition("=")
            # JSON path access renders as ->> on PostgreSQL and json_extract on SQLite.
            field = ManagedKey.tags[name].as_string()
            stmt = stmt.where(field == value if has_value else field.is_not(None))
        with self._db() as s:
            total = int(s.execute(select(func.count()).select_from(stmt.subquery())).scalar_one())
            rows = list(s.execute(stmt.order_by(*order).limit(limit).offset(offset)).scalars())
        return rows, total

    def get(self, ctx: RequestContext, ref: str) -> ManagedKey:
        self._policy.require(ctx, Permission.KEYS_READ, action="key.read", object_type="key", object_id=ref)
        with self._db() as s:
            return self._load(s, ref)

    @staticmethod
    def _load(s: Session, ref: str, *, lock: bool = False) -> ManagedKey:
        """The key and its versions. With `lock`, the key's row is locked first and the
        versions are read by the next statement, so they are the committed ones of the
        moment the lock was granted (READ COMMITTED takes a snapshot per statement); a
        change returns this same object, without reading it back (expire_on_commit is off)."""
        stmt = select(ManagedKey).where(key_filter(ref))
        if lock:
            # Versions by a plain query of their own below: the select-in loader costs
            # a quarter of a KMIP Activate's CPU time.
            stmt = stmt.with_for_update().options(lazyload(ManagedKey.versions))
        key = s.execute(stmt).scalar_one_or_none()
        if key is None:
            raise NotFound(f"no key named or with id '{ref}'", code="key_not_found")
        if lock:
            set_committed_value(key, "versions", list(s.execute(
                select(KeyVersion).where(KeyVersion.key_id == key.id).order_by(KeyVersion.version)).scalars()))
        return key

    # --- creating --------------------------------------------------------------
    def create(self, ctx: RequestContext, spec: KeySpec) -> ManagedKey:
        self._policy.require(ctx, Permission.KEYS_CREATE, action="key.create",
                             object_type="key", object_id=spec.name)
        check_name(spec.name)
        group = check_group(spec.kmip_group if ctx.principal.kmip_group is None else ctx.principal.kmip_group)
        if spec.rotation_period_days is not None and not 1 <= spec.rotation_period_days <= 3650:
            raise InvalidInput("rotation_period_days must be between 1 and 3650")
        now = self._now()
        if spec.activation_date and spec.deactivation_date and spec.deactivation_date <= spec.activation_date:
            raise InvalidInput("deactivation_date must be after activation_date")
        active_now = spec.activate and (spec.activation_date is None or spec.activation_date <= now)
        # A Deactivation Date already past makes the key Deactivated from its first moment
        # (KMIP: dates drive state): it may process (decrypt) but never protect.
        deactivated = spec.deactivation_date is not None and spec.deactivation_date <= now
        if deactivated and spec.rotation_period_days is not None:
            raise InvalidInput("a key created deactivated is never rotated: leave out the rotation period")
        state = KeyState.DEACTIVATED if deactivated else KeyState.ACTIVE if active_now else KeyState.PRE_ACTIVE
        if spec.algorithm not in ALGORITHMS:
            raise InvalidInput(f"a key's algorithm is one of {', '.join(sorted(ALGORITHMS))}")
        hmac = spec.algorithm in HMAC_ALGORITHMS
        if not hmac and spec.length_bits not in AES_LENGTHS:
            raise InvalidInput("AES keys are 128, 192 or 256 bits long")
        if hmac and spec.material is None and spec.wrapped is None and \
                spec.length_bits != HMAC_ALGORITHMS[spec.algorithm]:
            raise InvalidInput(f"{spec.algorithm} keys are generated {HMAC_ALGORITHMS[spec.algorithm]} bits long")
        if spec.material is not None:
            if len(spec.material) * 8 != spec.length_bits:
                raise InvalidInput("the key material does not have the stated length")
            if hmac and not HMAC_ALGORITHMS[spec.algorithm] // 8 <= len(spec.material) <= 128:
                raise InvalidInput(f"{spec.algorithm} key material is {HMAC_ALGORITHMS[spec.algorithm] // 8} to "
                                   "128 bytes long")
            try:
                wrapped = (self._hsm.import_secret if hmac else self._hsm.import_key)(
                    spec.material, kek_id=self._keks.current())
            except HsmError as exc:
                raise hsm_failure("import the key", exc) from exc
        elif spec.wrapped is not None:
            wrapped = spec.wrapped
        else:
            wrapped = self._generate(spec.length_bits, spec.algorithm)
        with self._db.begin() as s:
            if spec.unique_name and s.execute(live_key_named(spec.name)).first():
                raise Conflict(f"a key named '{spec.name}' exists already (destroy it, or choose another name)",
                               code="key_exists")
            key = ManagedKey(
                id=uuid.uuid4(), name=spec.name, description=spec.description,
                owner=spec.owner or ctx.principal.name, tags=validate_tags(spec.tags or {}),
                created_at=now, updated_at=now, rotation_period_days=spec.rotation_period_days,
                algorithm=spec.algorithm, length_bits=spec.length_bits, exportable=spec.exportable,
                kmip_attributes=dict(spec.kmip_attributes or {}), kmip_group=group,
                next_rotation_at=(now + timedelta(days=spec.rotation_period_days)
                                  if spec.rotation_period_days and active_now and not deactivated else None),
            )
            key.versions = [self._new_version(key, 1, wrapped, now, state=state,
                                              activation_date=now if active_now and not deactivated
                                              else spec.activation_date,
                                              deactivation_date=spec.deactivation_date)]
            s.add(key)
            self._audit.add(s, ctx, action="key.create", object_type="key", object_id=str(key.id),
                            details={"name": key.name, "version": 1, "state": state.value, "kmip_group": group,
                                     **({"imported": True} if spec.material is not None or spec.wrapped is not None
                                        else {}), **(spec.import_details or {})})
        return key

    def _generate(self, length_bits: int = 256, algorithm: str = "AES") -> WrappedKey:
        try:
            if algorithm in HMAC_ALGORITHMS:
                return self._hsm.generate_wrapped_secret(kek_id=self._keks.current(), bits=length_bits)
            if length_bits != 256:
                # The token's generate path makes AES-256 only; shorter keys come from the
                # token's RNG and are wrapped under the KEK's public half at once.
                return self._hsm.import_key(self._hsm.random(length_bits // 8), kek_id=self._keks.current())
            return self._hsm.generate_wrapped_key(kek_id=self._keks.current())
        except HsmError as exc:
            raise hsm_failure("generate a key", exc) from exc

    @staticmethod
    def _new_version(
        key: ManagedKey, n: int, wrapped: WrappedKey, now: datetime, *, state: KeyState,
        activation_date: datetime | None = None, deactivation_date: datetime | None = None,
    ) -> KeyVersion:
        return KeyVersion(
            id=uuid.uuid4(), key_id=key.id, version=n, state=state.value,
            wrapped_key=wrapped.ciphertext, wrapping_key_id=wrapped.wrapping_key_id,
            wrapping_mechanism=wrapped.mechanism, created_at=now,
            activation_date=activation_date, deactivation_date=deactivation_date,
        )

    # --- changing --------------------------------------------------------------
    def update(
        self, ctx: RequestContext, ref: str, *, description: str | None = None,
        tags: dict[str, str] | None = None, owner: str | None = None,
        rotation_period_days: int | None = None, clear_rotation: bool = False, exportable: bool | None = None,
        set_kmip_group: bool = False, kmip_group: str | None = None) -> ManagedKey:
        self._policy.require(ctx, Permission.KEYS_UPDATE, action="key.update", object_type="key", object_id=ref)
        if rotation_period_days is not None and not 1 <= rotation_period_days <= 3650:
            raise InvalidInput("rotation_period_days must be between 1 and 3650")
        if set_kmip_group:
            check_group(kmip_group)
        now = self._now()
        with self._audit.transaction() as s:  # the refusal below is recorded though it rolls back
            key = self._load(s, ref, lock=True)
            changed: dict[str, Any] = {}
            if description is not None:
                key.description, changed["description"] = description, True
            if tags is not None:
                key.tags, changed["tags"] = validate_tags(tags), True
            if owner is not None:
                key.owner, changed["owner"] = owner, owner
            if set_kmip_group and kmip_group != key.kmip_group:  # KMIP clients see it on their next request
                changed.update(kmip_group=kmip_group, kmip_group_was=key.kmip_group)
                key.kmip_group = kmip_group
                self._notifier.publish(s, Topic.KEYS)
            if exportable is not None and exportable != key.exportable:
                key.exportable, changed["exportable"] = exportable, exportable
                self._notifier.publish(s, Topic.KEYS)  # Get's caches hold the policy: replicas drop them
            if clear_rotation:
                key.rotation_period_days = key.next_rotation_at = None
                changed["rotation_period_days"] = None
            elif rotation_period_days is not None:
                state = key_state(key)
                if state in DESTROYED_STATES:
                    self._audit.record_after(s, ctx, action="key.update", outcome="error", object_type="key",
                                             object_id=str(key.id), details={"name": key.name,
                                                                             "reason": "illegal_state"})
                    raise Conflict(f"key '{key.name}' is {state.value}: it is never rotated again, so it takes no "
                                   "rotation schedule", code="illegal_state")
                key.rotation_period_days = rotation_period_days
                key.next_rotation_at = now + timedelta(days=rotation_period_days)
                changed["rotation_period_days"] = rotation_period_days
            key.updated_at, key.revision = now, key.revision + 1
            self._audit.add(s, ctx, action="key.update", object_type="key", object_id=str(key.id),
                            details={"name": key.name, "changed": changed})
        return key

    def rotate(self, ctx: RequestContext, ref: str, *, reason: str = "manual",
               pre_active: bool = False) -> ManagedKey:
        """New Active version; the previous Active one becomes Deactivated (decrypt-only).
        `pre_active` (KMIP ReKey): a Pre-Active key may be re-keyed too; its replacement
        is Pre-Active and the replaced version, never used, is Deactivated."""
        self._policy.require(ctx, Permission.KEYS_ROTATE, action="key.rotate", object_type="key", object_id=ref)
        with self._db() as s:
            current = self._load(s, ref)
        wrapped = self._generate(current.length_bits, current.algorithm)
        now = self._now()
        with self._db.begin() as s:
            key = self._load(s, ref, lock=True)
            newest = key.versions[-1]
            state = KeyState(newest.state)
            if state in DESTROYED_STATES:
                raise Conflict(f"key '{key.name}' is {state.value}; a destroyed key cannot be rotated",
                               code="illegal_state")
            if state is KeyState.PRE_ACTIVE and not pre_active:
                raise Conflict(f"key '{key.name}' is pre-active; activate it before rotating",
                               code="illegal_state")
            replacing = KeyState.PRE_ACTIVE if state is KeyState.PRE_ACTIVE else KeyState.ACTIVE
            for v in key.versions:
                if v.state == replacing:
                    v.state, v.deactivation_date = KeyState.DEACTIVATED.value, now
            version = self._new_version(key, newest.version + 1, wrapped, now, state=replacing,
                                        activation_date=now if replacing is KeyState.ACTIVE else None)
            key.versions.append(version)
            key.updated_at, key.revision = now, key.revision + 1
            if key.rotation_period_days:
                key.next_rotation_at = now + timedelta(days=key.rotation_period_days)
            self._notifier.publish(s, Topic.KEYS)  # replicas drop their cached active versions
            self._audit.add(s, ctx, action="key.rotate", object_type="key", object_id=str(key.id),
                            details={"name": key.name, "version": version.version,
                                     "replaces": newest.version, "reason": reason})
        return key

    def activate(self, ctx: RequestContext, ref: str, *, version: int | None = None) -> ManagedKey:
        """Activate the newest version (or `version`, which must be the newest: a
        replaced version was Active once and never becomes Active again)."""
        self._policy.require(ctx, Permission.KEYS_ACTIVATE, action="key.activate", object_type="key", object_id=ref)
        return self._transition(ctx, ref, version, KeyState.ACTIVE, action="key.activate")

    def deactivate(self, ctx: RequestContext, ref: str) -> ManagedKey:
        self._policy.require(ctx, Permission.KEYS_REVOKE, action="key.deactivate", object_type="key", object_id=ref)
        return self._transition(ctx, ref, None, KeyState.DEACTIVATED, action="key.deactivate")

    def revoke(
        self, ctx: RequestContext, ref: str, *, reason: str, message: str = "",
        compromise_date: datetime | None = None, idempotent: bool = False,
    ) -> ManagedKey:
        """Revoke every version still usable. A compromise reason marks them Compromised
        (destroyed ones Destroyed-Compromised); any other reason deactivates them.
        `idempotent` (KMIP): revoking a key that is revoked already (Deactivated or
        Compromised, nothing left to change) succeeds and changes nothing, so that a
        client's "revoke, then destroy" loop runs through every object it located."""
        self._policy.require(ctx, Permission.KEYS_REVOKE, action="key.revoke", object_type="key", object_id=ref)
        if reason not in REVOCATION_REASONS:
            raise InvalidInput(f"reason must be one of: {', '.join(sorted(REVOCATION_REASONS))}")
        compromised = reason in COMPROMISE_REASONS
        now = self._now()
        with self._db.begin() as s:
            key = self._load(s, ref, lock=True)
            changed = []
            for v in key.versions:
                cur = KeyState(v.state)
                if compromised:
                    target = (KeyState.DESTROYED_COMPROMISED if cur in DESTROYED_STATES
                              else KeyState.COMPROMISED)
                    if cur is target:
                        continue
                else:
                    if cur not in (KeyState.ACTIVE, KeyState.PRE_ACTIVE):
                        continue
                    target = KeyState.DEACTIVATED
                check_transition(cur, target, what=f"version {v.version}")
                v.state = target.value
                v.revocation_reason, v.revocation_message = reason, message or None
                if compromised:
                    v.compromise_date = compromise_date or now
                else:
                    v.deactivation_date = now
                changed.append(v.version)
            already = any(KeyState(v.state) in (KeyState.DEACTIVATED, KeyState.COMPROMISED) for v in key.versions)
            if not changed and not (idempotent and already):
                raise Conflict(f"key '{key.name}' has no version that this revocation would change",
                               code="illegal_state")
            key.updated_at, key.revision, key.next_rotation_at = now, key.revision + 1, None
            self._notifier.publish(s, Topic.KEYS)  # replicas drop their cached active versions
            self._audit.add(s, ctx, action="key.revoke", object_type="key", object_id=str(key.id),
                            details={"name": key.name, "reason": reason, "message": message, "versions": changed})
        return key

    def destroy(self, ctx: RequestContext, ref: str, *, version: int | None = None, shred: bool = False) -> ManagedKey:
        """Erase material (metadata stays). An Active version must be revoked first (KMIP); one
        in use (core/inventory.py) is refused unless `shred` (decision 0024)."""
        self._policy.require(ctx, Permission.KEYS_DESTROY, action="key.destroy", object_type="key", object_id=ref)
        self._audit.flush()  # data keys issued a moment ago are counted (core/inventory.py)
        with self._audit.transaction() as s:  # refused before anything is held
            refuse_in_use(s, self._audit, ctx, self._load(s, ref), version, shred=shred, now=self._now())
        if self._approvals is not None:
            held = {"key": ref, "version": version, **({"shred": True} if shred else {})}
            self._approvals.hold(ctx, action="key.destroy", target=ref, params=held)
        now = self._now()
        forgotten: list[WrappedKey] = []
        with self._audit.transaction() as s:
            key = self._load(s, ref, lock=True)
            holders = refuse_in_use(s, self._audit, ctx, key, version, shred=shred, now=now)
            targets = [v for v in key.versions if version is None or v.version == version]
            if version is not None and not targets:
                raise NotFound(f"key '{key.name}' has no version {version}", code="version_not_found")
            targets = [v for v in targets if KeyState(v.state) not in DESTROYED_STATES]
            if not targets:
                raise Conflict(f"key '{key.name}' is already destroyed", code="illegal_state")
            for v in targets:
                cur = KeyState(v.state)
                target = KeyState.DESTROYED_COMPROMISED if cur is KeyState.COMPROMISED else KeyState.DESTROYED
                check_transition(cur, target, what=f"version {v.version} of '{key.name}'")
            for v in targets:
                if v.wrapped_key is not None:
                    forgotten.append(version_wrapped(v))
                v.state = (KeyState.DESTROYED_COMPROMISED if v.state == KeyState.COMPROMISED
                           else KeyState.DESTROYED).value
                v.wrapped_key = None
                v.destroy_date = now
            key.updated_at, key.revision, key.next_rotation_at = now, key.revision + 1, None
            self._notifier.publish(s, Topic.KEYS)  # replicas drop their cached active versions
            self._audit.add(s, ctx, action="key.destroy", object_type="key", object_id=str(key.id),
                            details={"name": key.name, "versions": [v.version for v in targets],
                                     **({"shred": True, "holders": holders} if shred else {})})
        for w in forgotten:
            self._hsm.forget(w)
        return key

    def _transition(
        self, ctx: RequestContext, ref: str, version: int | None, target: KeyState, *, action: str,
    ) -> ManagedKey:
        now = self._now()
        with self._db.begin() as s:
            key = self._load(s, ref, lock=True)
            v = key.versions[-1] if version is None else next(
                (x for x in key.versions if x.version == version), None)
            if v is None:
                raise NotFound(f"key '{key.name}' has no version {version}", code="version_not_found")
            if target is KeyState.ACTIVE and v is not key.versions[-1]:
                raise Conflict(f"version {v.version} of '{key.name}' has been replaced (by version "
                               f"{key.versions[-1].version}) and cannot be activated", code="illegal_state")
            check_transition(KeyState(v.state), target, what=f"key '{key.name}' (version {v.version})")
            v.state = target.value
            if target is KeyState.ACTIVE:
                v.activation_date = now
                if key.rotation_period_days:
                    key.next_rotation_at = now + timedelta(days=key.rotation_period_days)
            elif target is KeyState.DEACTIVATED:
                v.deactivation_date = now
                key.next_rotation_at = None
            key.updated_at, key.revision = now, key.revision + 1
            self._notifier.publish(s, Topic.KEYS)  # replicas drop their cached active versions
            self._audit.add(s, ctx, action=action, object_type="key", object_id=str(key.id),
                            details={"name": key.name, "version": v.version, "state": target.value})
        return key

    # --- the scheduler's work --------------------------------------------------
    def run_due(self, ctx: RequestContext) -> dict[str, int]:
        """Rotate keys whose schedule is due and apply activation/deactivation dates.
        Safe to run in every replica at once: each key is locked, then re-checked."""
        now = self._now()
        counts = {"rotated": 0, "activated": 0, "deactivated": 0}
        with self._db() as s:
            due = list(s.execute(select(ManagedKey.id).where(ManagedKey.next_rotation_at <= now)).scalars())
            to_activate = list(s.execute(select(KeyVersion.key_id).where(
                KeyVersion.state == KeyState.PRE_ACTIVE.value, KeyVersion.activation_date <= now)).scalars())
            # A Pre-Active key whose Deactivation Date passes is deactivated too (KMIP 1.4 §3.22).
            to_deactivate = list(s.execute(select(KeyVersion.key_id).where(
                KeyVersion.state.in_([KeyState.PRE_ACTIVE.value, KeyState.ACTIVE.value]),
                KeyVersion.deactivation_date <= now)).scalars())
        for key_id in due:
            with self._db() as s:
                k = s.get(ManagedKey, key_id)
                if k is None or k.next_rotation_at is None or k.next_rotation_at > now:
                    continue
            try:
                self.rotate(ctx, str(key_id), reason="scheduled")
                counts["rotated"] += 1
            except Conflict:
                with self._db.begin() as s:
                    k = s.get(ManagedKey, key_id)
                    if k is not None:
                        k.next_rotation_at = None
        for key_id in to_activate:
            try:
                self._transition(ctx, str(key_id), None, KeyState.ACTIVE, action="key.activate")
                counts["activated"] += 1
            except (Conflict, NotFound):
                pass
        for key_id in dict.fromkeys(to_deactivate):
            try:
                self._transition(ctx, str(key_id), None, KeyState.DEACTIVATED, action="key.deactivate")
                counts["deactivated"] += 1
            except (Conflict, NotFound):
                pass
        activated, deactivated = objects_due(self._db, self._audit, self._notifier, ctx, now)
        counts["activated"] += activated
        counts["deactivated"] += deactivated
        return counts
