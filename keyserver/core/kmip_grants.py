"""KMIP tenancy administration: the groups there are, and the grants that let a KMIP
client or a whole group see objects of another group (docs/kmip.md "Tenancy").

What a grant allows is decided per request in core/kmip_tenancy.py; this service only
keeps the grants, checks them on the way in and audits every change. Grants are never
cached (a deletion takes effect on the next KMIP request), so no notification is needed.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import exists, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, aliased, sessionmaker

from keyserver.core.audit import AuditService, utcnow
from keyserver.core.errors import Conflict, InvalidInput, NotFound
from keyserver.core.keys import key_filter
from keyserver.core.kmip_groups import group_column
from keyserver.core.kmip_tenancy import CLIENT, EXPORT, GROUP, RIGHTS
from keyserver.core.names import GROUP_RE, UUID_RE
from keyserver.core.permissions import Permission
from keyserver.core.policy import Policy
from keyserver.core.principal import RequestContext
from keyserver.core.states import DESTROYED_STATES
from keyserver.store.kmip_grants import KmipGrant
from keyserver.store.models import KeyVersion, KmipClient, KmipPublicKey, KmipSealedObject, ManagedKey

_GONE = [st.value for st in DESTROYED_STATES]


@dataclass(frozen=True, slots=True)
class GroupSummary:
    name: str
    clients: list[str]  # unrevoked clients in the group, by name
    objects: int  # live objects (a managed key counts once, whatever its versions)


@dataclass(frozen=True, slots=True)
class GrantRecord:
    id: uuid.UUID
    grantee: str
    target_kind: str
    target: str
    target_name: str
    rights: list[str]
    created_by: str
    created_at: datetime


class KmipGrantService:
    def __init__(self, session_factory: sessionmaker[Session], audit: AuditService, policy: Policy, *,
                 now: Callable[[], datetime] = utcnow) -> None:
        self._db = session_factory
        self._audit = audit
        self._policy = policy
        self._now = now

    # --- groups -------------------------------------------------------------------
    def groups(self, ctx: RequestContext) -> list[GroupSummary]:
        """Every group a client is in or an object is in, with its clients and live objects."""
        self._policy.require(ctx, Permission.KEYS_READ, action="kmip.group.list")
        clients: dict[str, list[str]] = {}
        counts: dict[str, int] = {}
        v = aliased(KeyVersion)
        live_key = exists().where(v.key_id == ManagedKey.id, v.state.not_in(_GONE))
        with self._db() as s:
            for name, group in s.execute(select(KmipClient.name, group_column())
                                         .where(KmipClient.revoked_at.is_(None)).order_by(KmipClient.name)):
                clients.setdefault(group, []).append(name)
            for stmt in (
                select(ManagedKey.kmip_group, func.count()).where(ManagedKey.kmip_group.is_not(None), live_key)
                .group_by(ManagedKey.kmip_group),
                select(KmipPublicKey.kmip_group, func.count()).where(
                    KmipPublicKey.kmip_group.is_not(None), KmipPublicKey.state.not_in(_GONE))
                .group_by(KmipPublicKey.kmip_group),
                select(KmipSealedObject.kmip_group, func.count()).where(
                    KmipSealedObject.kmip_group.is_not(None), KmipSealedObject.state.not_in(_GONE))
                .group_by(KmipSealedObject.kmip_group),
            ):
                for g, n in s.execute(stmt):
                    counts[str(g)] = counts.get(str(g), 0) + n
        return [GroupSummary(name=g, clients=clients.get(g, []), objects=counts.get(g, 0))
                for g in sorted(set(clients) | set(counts))]

    # --- grants -------------------------------------------------------------------
    def grants(self, ctx: RequestContext, *, grantee: str | None = None, key: str | None = None,
             group: str | None = None) -> list[GrantRecord]:
        self._policy.require(ctx, Permission.KEYS_READ, action="kmip.grant.list")
        stmt = select(KmipGrant).order_by(KmipGrant.created_at, KmipGrant.id)
        with self._db() as s:
            if grantee is not None:
                stmt = stmt.where(KmipGrant.grantee == grantee)
            if key is not None:
                found = s.execute(select(ManagedKey.id).where(key_filter(key))).scalar()
                if found is None:
                    return []
                stmt = stmt.where(KmipGrant.target_kind == "key", KmipGrant.target == str(found))
            if group is not None:
                stmt = stmt.where(KmipGrant.target_kind == "group", KmipGrant.target == group)
            return [self._record(s, g) for g in s.execute(stmt).scalars()]

    def create(self, ctx: RequestContext, *, grantee: str, rights: list[str], key: str | None = None,
               object: str | None = None, group: str | None = None) -> GrantRecord:
        """Grant `rights` on one key (all its versions), one standalone object or a whole
        group to a client or a group. A grant adds visibility, never a permission: the
        grantee's role and key-export setting still apply. Export also needs keys:export
        of whoever grants it, as database grants do."""
        self._policy.require(ctx, Permission.KMIP_CLIENTS, action="kmip.grant.create", object_type="kmip_grant",
                             object_id=grantee)
        wanted = sorted(set(rights), key=RIGHTS.index) if set(rights) <= set(RIGHTS) else None
        if not wanted:
            raise InvalidInput(f"rights is a non-empty list of: {', '.join(RIGHTS)}", code="invalid_rights")
        if sum(t is not None for t in (key, object, group)) != 1:
            raise InvalidInput("name exactly one target: key, object or group", code="invalid_grant_target")
        if EXPORT in wanted:
            self._policy.require(ctx, Permission.KEYS_EXPORT, action="kmip.grant.create", object_type="kmip_grant",
                                 object_id=grantee)
        with self._db.begin() as s:
            self._check_grantee(s, grantee)
            kind, target, name = self._target(s, key=key, object=object, group=group)
            existing = s.execute(select(KmipGrant.id).where(
                KmipGrant.grantee == grantee, KmipGrant.target_kind == kind, KmipGrant.target == target)).scalar()
            if existing is not None:
                raise Conflict(f"{grantee} has a grant on this {kind} already (id {existing}); delete it and grant "
                               "again to change its rights", code="kmip_grant_exists")
            grant = KmipGrant(id=uuid.uuid4(), grantee=grantee, target_kind=kind, target=target, rights=wanted,
                              created_by=ctx.principal.name, created_at=self._now())
            s.add(grant)
            try:
                s.flush()
            except IntegrityError:  # the same grant made at this moment by someone else
                raise Conflict(f"{grantee} has a grant on this {kind} already; list the grants",
                               code="kmip_grant_exists") from None
            self._audit.add(s, ctx, action="kmip.grant.create", object_type="kmip_grant", object_id=str(grant.id),
                            details={"grantee": grantee, "target_kind": kind, "target": target,
                                     "target_name": name, "rights": wanted})
            return _record(grant, name)

    def delete(self, ctx: RequestContext, grant_id: uuid.UUID) -> None:
        """Takes effect on the grantee's next KMIP request, on every replica (grants are
        read per request, never cached)."""
        self._policy.require(ctx, Permission.KMIP_CLIENTS, action="kmip.grant.delete", object_type="kmip_grant",
                             object_id=str(grant_id))
        with self._db.begin() as s:
            grant = s.get(KmipGrant, grant_id, with_for_update=True)
            if grant is None:
                raise NotFound(f"no KMIP grant with id '{grant_id}'; list them with GET /api/v1/kmip/grants",
                               code="kmip_grant_not_found")
            record = self._record(s, grant)
            s.delete(grant)
            self._audit.add(s, ctx, action="kmip.grant.delete", object_type="kmip_grant", object_id=str(grant_id),
                            details={"grantee": record.grantee, "target_kind": record.target_kind,
                                     "target": record.target, "target_name": record.target_name,
                                     "rights": record.rights})

    # --- checks -------------------------------------------------------------------
    @staticmethod
    def _check_grantee(s: Session, grantee: str) -> None:
        if grantee.startswith(CLIENT):
            name = grantee[len(CLIENT):]
            if s.execute(select(KmipClient.id).where(KmipClient.name == name,
                                                     KmipClient.revoked_at.is_(None))).first() is None:
                raise NotFound(f"no unrevoked KMIP client named '{name}'; issue it first (POST /api/v1/kmip/clients)",
                               code="kmip_client_not_found")
        elif grantee.startswith(GROUP) and GROUP_RE.match(grantee[len(GROUP):]):
            name = grantee[len(GROUP):]
            if s.execute(select(KmipClient.id).where(group_column() == name,
                                                     KmipClient.revoked_at.is_(None))).first() is None:
                raise NotFound(f"no unrevoked KMIP client is in group '{name}'; set a client's group first "
                               "(PATCH /api/v1/kmip/clients/{id})", code="kmip_group_not_found")
        else:
            raise InvalidInput("grantee is 'client:<client name>' or 'group:<group name>'", code="invalid_grantee")

    @staticmethod
    def _target(s: Session, *, key: str | None, object: str | None, group: str | None) -> tuple[str, str, str]:
        if key is not None:
            found = s.execute(select(ManagedKey.id, ManagedKey.name).where(key_filter(key))).first()
            if found is None:
                raise NotFound(f"no key named or with id '{key}'", code="key_not_found")
            return "key", str(found[0]), found[1]
        if object is not None:
            row = _standalone(s, object) if UUID_RE.match(object) else None
            if row is None:
                version = s.execute(select(KeyVersion.key_id).where(KeyVersion.id == uuid.UUID(object))).first() \
                    if UUID_RE.match(object) else None
                hint = (f"; it is a version of key {version[0]}: grant the key (key=…)" if version is not None
                        else ": give a public key's, private key's, secret data's or certificate's unique identifier")
                raise NotFound(f"no standalone KMIP object '{object}'{hint}", code="object_not_found")
            return "object", str(row.id), row.name or str(row.id)
        assert group is not None
        known = (s.execute(select(KmipClient.id).where(group_column() == group)).first()
                 or any(s.execute(select(t.id).where(t.kmip_group == group).limit(1)).first()
                        for t in (ManagedKey, KmipPublicKey, KmipSealedObject)))
        if not known:
            raise NotFound(f"no KMIP client or object is in group '{group}' (GET /api/v1/kmip/groups lists them)",
                           code="kmip_group_not_found")
        return "group", group, group

    def _record(self, s: Session, grant: KmipGrant) -> GrantRecord:
        name = grant.target
        if grant.target_kind == "key":
            name = s.execute(select(ManagedKey.name).where(ManagedKey.id == uuid.UUID(grant.target))).scalar() or name
        elif grant.target_kind == "object":
            row = _standalone(s, grant.target)
            name = (row.name if row is not None else None) or name
        return _record(grant, name)


def _standalone(s: Session, uid: str) -> KmipPublicKey | KmipSealedObject | None:
    wanted = uuid.UUID(uid)
    return s.get(KmipPublicKey, wanted) or s.get(KmipSealedObject, wanted)


def _record(g: KmipGrant, name: str) -> GrantRecord:
    return GrantRecord(id=g.id, grantee=g.grantee, target_kind=g.target_kind, target=g.target, target_name=name,
                       rights=list(g.rights), created_by=g.created_by, created_at=g.created_at)
