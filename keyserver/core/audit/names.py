"""The human name beside each record's object id (docs/audit.md "Object names").

Records name their object by id (a UUID), which a reader cannot place. As the chainer
chains a batch it looks up the name each object has at that moment — a key's or a
token's name, a host's hostname, a user's username, a guard point's path, a volume's
name — and writes it into the record's details as `object_name`, before the record is
MACed: the name is part of the record, covered by the chain, found by a search, and
kept after the object is renamed or deleted. One query per kind of object per batch.

A record that already carries `object_name` keeps it. An object deleted in the very
transaction that records it is found no more: its name is taken from the details the
caller wrote (`name`, `hostname`, `username`, `path`), if any.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Connection, select
from sqlalchemy.orm import InstrumentedAttribute

from keyserver.store.models import (
    ApiToken,
    GuardPoint,
    Host,
    KmipPublicKey,
    KmipSealedObject,
    ManagedKey,
    User,
    Volume,
)

OBJECT_NAME = "object_name"

# object_type → (the id column, the name column, the details that name a deleted one).
_SEALED = (KmipSealedObject.id, KmipSealedObject.name, ("name",))
_NAMED: dict[str, tuple[InstrumentedAttribute[Any], InstrumentedAttribute[Any], tuple[str, ...]]] = {
    "key": (ManagedKey.id, ManagedKey.name, ("name", "key_name")),
    "user": (User.id, User.username, ("username",)),
    "token": (ApiToken.id, ApiToken.name, ("name",)),
    "host": (Host.id, Host.hostname, ("hostname",)),
    "guard_point": (GuardPoint.id, GuardPoint.path, ("path",)),
    "volume": (Volume.id, Volume.name, ("name",)),
    "public_key": (KmipPublicKey.id, KmipPublicKey.name, ("name",)),
    "private_key": _SEALED,
    "secret_data": _SEALED,
    "certificate": _SEALED,
}


def _uuid(value: str | None) -> uuid.UUID | None:
    try:
        return uuid.UUID(value) if value else None
    except ValueError:
        return None  # the object was named by reference (a refused lookup): the id is its name


def name_objects(conn: Connection, events: list[dict[str, Any]]) -> None:
    """Add `object_name` to the details of each event (audit_events columns) whose object
    has a name, in place; `details` is replaced, never changed, as callers may share it."""
    wanted: dict[str, set[uuid.UUID]] = {}
    for e in events:
        ident = _uuid(e["object_id"]) if e["object_type"] in _NAMED else None
        if ident is not None and OBJECT_NAME not in (e["details"] or {}):
            wanted.setdefault(e["object_type"], set()).add(ident)
    found: dict[tuple[str, uuid.UUID], str] = {}
    for object_type, ids in wanted.items():
        id_col, name_col, _ = _NAMED[object_type]
        for ident, name in conn.execute(select(id_col, name_col).where(id_col.in_(ids))):
            if name:
                found[(object_type, ident)] = name
    for e in events:
        ident = _uuid(e["object_id"]) if e["object_type"] in _NAMED else None
        details = e["details"] or {}
        if ident is None or OBJECT_NAME in details:
            continue
        name = found.get((e["object_type"], ident))
        if name is None:
            name = next((details[k] for k in _NAMED[e["object_type"]][2] if isinstance(details.get(k), str)), None)
        if name is not None:
            e["details"] = {**details, OBJECT_NAME: name}
