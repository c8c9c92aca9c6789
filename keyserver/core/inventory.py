"""Where a key version is used, computed from the store when asked (decision 0024 §1).

Every holder kind the server knows or is told about, one holder per place: the data
keys applications hold (counted by the chainer), guard points on each host (the
agents' walks), volumes, database grants, AWS key stores and KMIP clients. A holder's
state is `in_use`, `clear`, `unreported` (a host holding the key that has not walked
since the retirement began) or `excluded` (an operator said so, with a reason). A guard
point also says how many of its files name no version of the key (`unreadable`): no
version decrypts them, so they hold none and block nothing, but they are shown, and the
statement names them, so a proof does not pass over files the walk could not read.

Everything here reads one session the caller holds: destroy computes it inside its own
transaction, under the key's row lock.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from keyserver.core.audit import AuditService
from keyserver.core.errors import Conflict
from keyserver.core.principal import RequestContext
from keyserver.core.states import DESTROYED_STATES, KeyState
from keyserver.store.databases import DatabaseGrant, DatabaseIdentity
from keyserver.store.models import AuditUsageHourly, GuardPoint, Host, ManagedKey, Volume
from keyserver.store.retirement import (
    AuditVersionUsage,
    DatakeyReencrypted,
    KeyVersionDatakeys,
    VersionRetirement,
)
from keyserver.store.xks import XksKey, XksStore

# Counts per kind, in the order the inventory and the statement list them.
KINDS = ("data_keys", "guard_point_files", "volumes", "databases", "xks_stores", "kmip_clients")
# A holder's kind → the count it adds to.
COUNTED = {"data_keys": "data_keys", "guard_point": "guard_point_files", "volume": "volumes",
           "database": "databases", "xks_store": "xks_stores", "kmip_client": "kmip_clients"}
# What an exclusion may name: a holder of one of these kinds, or a whole host (all its
# guard points and volumes: a decommissioned machine).
EXCLUDABLE = frozenset({*COUNTED, "host"})
APPLICATIONS = "applications"  # the one holder of kind data_keys


@dataclass
class Holder:
    kind: str
    holder: str
    name: str
    count: int | None
    state: str
    host: str | None = None
    reported_at: datetime | None = None
    host_id: str | None = None  # what a host's exclusion names
    unreadable: int | None = None  # a guard point's files naming no version of the key (None: not said)
    path: str | None = None  # a guard point's path, for the statement

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "holder": self.holder, "name": self.name, "host": self.host,
                "count": self.count, "state": self.state, "unreadable": self.unreadable,
                "reported_at": self.reported_at.isoformat() if self.reported_at else None}


@dataclass
class Inventory:
    key_id: uuid.UUID
    key: str
    version: int
    state: str
    computed_at: datetime
    holders: list[Holder] = field(default_factory=list)

    @property
    def in_use(self) -> bool:
        return any(h.state not in ("clear", "excluded") for h in self.holders)

    @property
    def blocking(self) -> list[Holder]:
        """What stands between the version and its retirement: in use or unreported."""
        return [h for h in self.holders if h.state in ("in_use", "unreported")]

    @property
    def unreported_hosts(self) -> list[str]:
        return sorted({h.host for h in self.holders if h.state == "unreported" and h.host})

    @property
    def unreadable(self) -> list[dict[str, Any]]:
        """The guard points whose last walk found files naming no version of the key,
        with host and path: what a statement lists so an auditor can go and look."""
        return [{"holder": h.holder, "host": h.host, "path": h.path, "files": h.unreadable, "state": h.state,
                 "scanned_at": h.reported_at.isoformat() if h.reported_at else None}
                for h in self.holders if h.kind == "guard_point" and h.unreadable]

    @property
    def kinds(self) -> dict[str, int]:
        """Per kind: the count still under the version (files, blobs), or for kinds
        without one, the holders still using it; excluded holders are not counted."""
        out = dict.fromkeys(KINDS, 0)
        for h in self.holders:
            if h.state in ("clear", "excluded"):
                continue
            if h.kind in ("data_keys", "guard_point"):
                out[COUNTED[h.kind]] += h.count or 0  # a guard point never walked: in use, count unknown
            else:
                out[COUNTED[h.kind]] += 1
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "key_id": str(self.key_id), "version": self.version, "state": self.state,
                "in_use": self.in_use, "computed_at": self.computed_at.isoformat(), "kinds": self.kinds,
                "holders": [h.as_dict() for h in self.holders], "unreported_hosts": self.unreported_hosts}


def compute(s: Session, key: ManagedKey, version: int, retirement: VersionRetirement | None,
            now: datetime) -> Inventory:
    """The inventory of version `version` of `key`; with a running `retirement`, its
    exclusions apply and hosts must have walked since it began."""
    state = next((v.state for v in key.versions if v.version == version), "unknown")
    inv = Inventory(key.id, key.name, version, state, now)
    excluded = {(x.kind, x.holder) for x in retirement.exclusions} if retirement is not None else set()
    since = retirement.requested_at if retirement is not None and retirement.state == "running" else None
    inv.holders += [_data_keys(s, key.id, version)]
    inv.holders += _guard_points(s, key.id, version, since)
    inv.holders += _volumes(s, key.id, version)
    inv.holders += _databases(s, key.id, version)
    inv.holders += _audited_users(s, key.id, version)
    for h in inv.holders:
        if (h.kind, h.holder) in excluded or (h.host_id is not None and ("host", h.host_id) in excluded):
            h.state = "excluded"
    return inv


def current_retirement(s: Session, key_id: uuid.UUID, version: int) -> VersionRetirement | None:
    """The version's running retirement, else its completed one, else None (a cancelled
    one no longer speaks for the version)."""
    rows = list(s.execute(select(VersionRetirement).where(
        VersionRetirement.key_id == key_id, VersionRetirement.version == version,
        VersionRetirement.state != "cancelled").order_by(VersionRetirement.requested_at.desc())).scalars())
    return next((r for r in rows if r.state == "running"), rows[0] if rows else None)


def in_use_holders(s: Session, key: ManagedKey, versions: list[int], now: datetime) -> list[dict[str, Any]]:
    """The holders that stand in the way of destroying these versions (in use or not yet
    reported), each with its version: what destroy refuses with, or shreds."""
    out = []
    for v in versions:
        inv = compute(s, key, v, current_retirement(s, key.id, v), now)
        out += [{**h.as_dict(), "version": v} for h in inv.blocking]
    return out


def refuse_in_use(s: Session, audit: AuditService, ctx: RequestContext, key: ManagedKey, version: int | None, *,
                  shred: bool, now: datetime) -> list[dict[str, Any]]:
    """Destroy's rule: the holders of the targeted versions (one, or every live one)
    still in use; refused (audited, 409 `version_in_use`) unless the caller shreds."""
    live = [v.version for v in key.versions if (version is None or v.version == version)
            and KeyState(v.state) not in DESTROYED_STATES]
    # A KMIP client destroying what it got itself decides for its own data, not by accident.
    holders = [h for h in in_use_holders(s, key, live, now)
               if not (h["kind"] == "kmip_client" and ctx.principal.name == f"kmip:{h['holder']}")]
    if holders and not shred:
        audit.record_after(s, ctx, action="key.destroy", outcome="denied", object_type="key", object_id=str(key.id),
                           details={"reason": "version_in_use", "holders": holders})
        raise Conflict(f"{len(holders)} holder(s) still use key '{key.name}' (versions "
                       f"{sorted({h['version'] for h in holders})}): retire the version first, or destroy with "
                       "shred to make what they hold unreadable", code="version_in_use", errors=holders)
    return holders


def _data_keys(s: Session, key_id: uuid.UUID, version: int) -> Holder:
    row = s.get(KeyVersionDatakeys, (key_id, version))
    issued, legacy = (row.issued, row.legacy_reencrypted) if row is not None else (0, 0)
    moved = int(s.execute(select(func.count()).select_from(DatakeyReencrypted).where(
        DatakeyReencrypted.key_id == key_id, DatakeyReencrypted.version == version)).scalar_one())
    left = max(0, issued - moved - legacy)
    return Holder("data_keys", APPLICATIONS, "data-key blobs held by applications", left,
                  "in_use" if left else "clear")


def _report(host: Host, gp: GuardPoint) -> dict[str, Any] | None:
    return next((r for r in host.guard_points or [] if isinstance(r, dict) and r.get("id") == str(gp.id)), None)


def _guard_points(s: Session, key_id: uuid.UUID, version: int, since: datetime | None) -> list[Holder]:
    out = []
    for gp in s.execute(select(GuardPoint).where(GuardPoint.key_id == key_id).order_by(GuardPoint.path)).scalars():
        # Revoked hosts too: their files are still under the version until one is excluded.
        hosts = s.execute(select(Host).where(
            Host.id == gp.host_id if gp.host_id is not None else Host.host_group == gp.host_group)
            .order_by(Host.hostname)).scalars()
        for host in hosts:
            report = _report(host, gp)
            versions = report.get("versions") if report else None
            scanned = _parse_time(report.get("scanned_at")) if report else None
            count = int(versions.get(str(version), 0)) if isinstance(versions, dict) else None
            if since is not None and (scanned is None or scanned < since):
                state = "unreported"
            else:
                state = "clear" if count == 0 else "in_use"  # never walked: unknown, so in use
            h = Holder("guard_point", f"{gp.id}@{host.id}", f"{gp.path} on {host.hostname}", count, state,
                       host=host.hostname, reported_at=scanned, host_id=str(host.id),
                       unreadable=_unreadable(report), path=gp.path)
            out.append(h)
    return out


def _unreadable(report: dict[str, Any] | None) -> int | None:
    """The walk's unreadable files; None from an agent that does not say (reports
    stored before it did, when the agent only named them in `detail`)."""
    n = report.get("unreadable") if report is not None and isinstance(report.get("versions"), dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


def _volumes(s: Session, key_id: uuid.UUID, version: int) -> list[Holder]:
    out = []
    rows = s.execute(select(Volume, Host.hostname).join(Host, Host.id == Volume.host_id)
                     .where(Volume.key_id == key_id).order_by(Host.hostname, Volume.name))
    for vol, hostname in rows:
        # The server seals and reseals every volume's passphrase, so it knows the version.
        under = vol.key_version == version
        h = Holder("volume", str(vol.id), f"{vol.name} on {hostname}", 1 if under else 0,
                   "in_use" if under else "clear", host=hostname, host_id=str(vol.host_id))
        out.append(h)
    return out


def _databases(s: Session, key_id: uuid.UUID, version: int) -> list[Holder]:
    rows = s.execute(select(DatabaseGrant, DatabaseIdentity.name)
                     .join(DatabaseIdentity, DatabaseIdentity.id == DatabaseGrant.database_id)
                     .where(DatabaseGrant.key_id == key_id).order_by(DatabaseIdentity.name, DatabaseGrant.kv_id))
    # A database encrypts with the version it last read; an older one it read before may
    # still protect its pages, which it alone knows: that is what an exclusion says.
    return [Holder("database", str(g.id), f"database {name} (key id {g.kv_id})", None,
                   "in_use" if g.last_read_version == version else "clear") for g, name in rows]


def _audited_users(s: Session, key_id: uuid.UUID, version: int) -> list[Holder]:
    """AWS key stores and KMIP clients that used the version. Neither has a per-version
    table of its own, so the audit says: the hourly usage counts name who used the key at
    all, and the chainer's per-version usage (audit_version_usage) which of them used this
    version, in one look by its primary key. The server cannot reach into either (AWS
    keeps its ciphertexts), so only an exclusion clears one."""
    audited = or_(AuditUsageHourly.actor.startswith("xks:"), AuditUsageHourly.actor.startswith("kmip:"))
    actors = set(s.execute(select(AuditUsageHourly.actor).where(
        AuditUsageHourly.key_id == str(key_id), audited).distinct()).scalars())
    u = AuditVersionUsage
    used = set(s.execute(select(u.actor).where(
        u.key_id == key_id, u.version == version, or_(u.actor.startswith("xks:"), u.actor.startswith("kmip:"))))
        .scalars())
    granted = {f"xks:{name}" for name in s.execute(select(XksStore.name).join(XksKey, XksKey.store_id == XksStore.id)
                                                   .where(XksKey.key_id == key_id)).scalars()}
    out = []
    for actor in sorted(actors | used | granted):
        kind, _, name = actor.partition(":")
        label = f"AWS key store {name}" if kind == "xks" else f"KMIP client {name}"
        out.append(Holder("xks_store" if kind == "xks" else "kmip_client", name, label, None,
                          "in_use" if actor in used else "clear"))
    return out


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None
