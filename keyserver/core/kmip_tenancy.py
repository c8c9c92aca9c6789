"""KMIP tenancy: which objects a KMIP client sees and what it may do with them
(docs/kmip.md "Tenancy", decision 0022).

A client sees the objects of its own group and those it created (full rights, lifecycle
included), and those granted to it or to its group, with exactly the granted rights.
Rights never exceed what its role and key-export setting allow: the permission is
checked first (policy.Policy.require), tenancy narrows on top. Principals that are not
KMIP clients (REST users and tokens, the system) and clients whose role holds
`kmip:all-objects` are not scoped.

Grants are read from the database on each request that needs them, never cached, so a
revoked grant is gone on the very next request; an object's own group needs no lookup
(the hot path of a client using its own keys).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import ColumnElement, or_, select, true
from sqlalchemy.orm import Session, sessionmaker

from keyserver.core.kmip_model import StandaloneObject, VersionObject
from keyserver.core.permissions import Permission
from keyserver.core.principal import Principal
from keyserver.store.kmip_grants import KmipGrant
from keyserver.store.models import KmipPublicKey, KmipSealedObject, ManagedKey

READ, USE, EXPORT, DESTROY = "read", "use", "export", "destroy"
RIGHTS = (READ, USE, EXPORT, DESTROY)
# Not grantable: Activate, ReKey and attribute changes stay with the object's own group.
MANAGE = "manage"
OWNER_RIGHTS = frozenset({*RIGHTS, MANAGE})

P = Permission
_RIGHT_OF: dict[Permission, str] = {
    P.KEYS_READ: READ, P.KEYS_ENCRYPT: USE, P.KEYS_DECRYPT: USE, P.KEYS_VERIFY: USE,
    P.KEYS_EXPORT: EXPORT, P.KEYS_EXPORT_WRAPPED: EXPORT, P.KEYS_REVOKE: DESTROY, P.KEYS_DESTROY: DESTROY,
}

CLIENT = "client:"
GROUP = "group:"
NOT_VISIBLE = "not visible to this client"


def right_for(permission: Permission) -> str:
    """The tenancy right an operation needing `permission` uses."""
    return _RIGHT_OF.get(permission, MANAGE)


def scoped(principal: Principal) -> bool:
    """Whether tenancy narrows what `principal` sees: KMIP clients without kmip:all-objects."""
    return principal.kmip_group is not None and Permission.KMIP_ALL_OBJECTS not in principal.permissions


def grantees(principal: Principal) -> tuple[str, str]:
    return CLIENT + principal.name.removeprefix("kmip:"), GROUP + (principal.kmip_group or "")


@dataclass(frozen=True, slots=True)
class Target:
    """What grants name of an object: its kind, id, group and owner."""

    kind: str  # key (all versions of a managed key) | object (a standalone object)
    id: str
    group: str | None
    owner: str


def target_of(obj: VersionObject | StandaloneObject) -> Target:
    if isinstance(obj, VersionObject):
        return Target("key", str(obj.key.id), obj.key.kmip_group, obj.key.owner)
    return Target("object", str(obj.id), obj.kmip_group, obj.owner)


def owns(principal: Principal, target: Target) -> bool:
    """The object is the caller's own: it made it, or it is in the caller's group."""
    return target.owner == principal.name or (target.group is not None and target.group == principal.kmip_group)


@dataclass(frozen=True, slots=True)
class Readable:
    """What a scoped caller may Locate beyond its own: by grant with the read right."""

    key_ids: frozenset[uuid.UUID]
    object_ids: frozenset[uuid.UUID]
    groups: frozenset[str]


class KmipTenancy:
    def __init__(self, read: sessionmaker[Session]) -> None:
        self._read = read

    def rights(self, principal: Principal, obj: VersionObject | StandaloneObject) -> frozenset[str]:
        """What `principal` may do with `obj` as far as tenancy goes (empty: not visible)."""
        if not scoped(principal):
            return OWNER_RIGHTS
        target = target_of(obj)
        if owns(principal, target):
            return OWNER_RIGHTS
        conditions = [(KmipGrant.target_kind == target.kind) & (KmipGrant.target == target.id)]
        if target.group is not None:
            conditions.append((KmipGrant.target_kind == "group") & (KmipGrant.target == target.group))
        stmt = select(KmipGrant.rights).where(KmipGrant.grantee.in_(grantees(principal)), or_(*conditions))
        with self._read() as s:
            return frozenset(r for rights in s.execute(stmt).scalars() for r in rights)

    def readable(self, principal: Principal) -> Readable:
        stmt = select(KmipGrant.target_kind, KmipGrant.target, KmipGrant.rights).where(
            KmipGrant.grantee.in_(grantees(principal)))
        keys: set[uuid.UUID] = set()
        objects: set[uuid.UUID] = set()
        groups: set[str] = set()
        with self._read() as s:
            for kind, target, rights in s.execute(stmt):
                if READ not in rights:
                    continue
                if kind == "group":
                    groups.add(target)
                else:
                    (keys if kind == "key" else objects).add(uuid.UUID(target))
        return Readable(frozenset(keys), frozenset(objects), frozenset(groups))

    def locate_filter(self, principal: Principal, readable: Readable | None,
                      table: type[ManagedKey] | type[KmipPublicKey] | type[KmipSealedObject]) -> ColumnElement[bool]:
        """The SQL condition Locate adds for `table`, so that paging counts only what the
        caller sees (true for callers tenancy does not scope)."""
        if readable is None:
            return true()
        ids: Iterable[uuid.UUID] = readable.key_ids if table is ManagedKey else readable.object_ids
        conditions: list[ColumnElement[bool]] = [table.owner == principal.name]
        if principal.kmip_group is not None:
            conditions.append(table.kmip_group == principal.kmip_group)
        if ids:
            conditions.append(table.id.in_(sorted(ids)))
        if readable.groups:
            conditions.append(table.kmip_group.in_(sorted(readable.groups)))
        return or_(*conditions)
