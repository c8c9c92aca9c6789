"""Guard points: protected directories on a host (or every host of a group), each with
its managed key, chunk size, mode and ordered access rules. Agents fetch the ones that
apply to them and apply changes live; every change bumps the guard point's revision so
an agent can report which one it applied (docs/guardpoints.md)."""

from __future__ import annotations

import hashlib
import posixpath
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session, sessionmaker

from keyserver.core.audit import AuditService, utcnow
from keyserver.core.errors import Conflict, InvalidInput, NotFound
from keyserver.core.hosts import GROUP_RE
from keyserver.core.keys import key_filter, require_aes
from keyserver.core.permissions import Permission
from keyserver.core.policy import Policy
from keyserver.core.principal import RequestContext
from keyserver.core.states import KeyState
from keyserver.store.models import GuardPoint, Host, KeyVersion, ManagedKey

MODES = ("enforce", "learn", "off")
EFFECTS = ("permit", "deny")
MAX_RULES = 64


@dataclass(frozen=True, slots=True)
class GuardPointSpec:
    """What an operator sets; `rules` as validated by the caller's schema."""

    path: str
    key: str
    host_group: str | None = None
    host_id: uuid.UUID | None = None
    backing_path: str | None = None
    chunk_size: int = 4096
    mode: str = "enforce"
    rules: tuple[dict[str, Any], ...] = ()
    default_effect: str = "deny"


def default_backing(path: str) -> str:
    """Ciphertext lives beside the protected path, hidden: /srv/db -> /srv/.db.strongroom"""
    parent, name = posixpath.split(path)
    return posixpath.join(parent, f".{name}.strongroom")


def check_path(label: str, path: str) -> str:
    if not path.startswith("/") or "\0" in path or len(path) > 1024:
        raise InvalidInput(f"{label} must be an absolute path (at most 1024 characters)")
    if posixpath.normpath(path) != path or path == "/":
        raise InvalidInput(f"{label} must be a normalised path other than / (no '..', '.', '//' or trailing '/')")
    return path


def _inside(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/")


def revision_tag(points: list[GuardPoint]) -> str:
    """A short digest of which guard points apply and at which revisions: an agent
    fetches them again only when it changes."""
    h = hashlib.sha256()
    for gp in sorted(points, key=lambda g: str(g.id)):
        h.update(f"{gp.id}:{gp.revision};".encode())
    return h.hexdigest()[:16]


class GuardPointService:
    def __init__(self, session_factory: sessionmaker[Session], audit: AuditService, policy: Policy, *,
                 now: Callable[[], datetime] = utcnow) -> None:
        self._db = session_factory
        self._audit = audit
        self._policy = policy
        self._now = now

    def _validate(self, s: Session, spec: GuardPointSpec) -> tuple[ManagedKey, str]:
        if (spec.host_group is None) == (spec.host_id is None):
            raise InvalidInput("a guard point applies to exactly one of host_group or host_id")
        if spec.host_group is not None and not GROUP_RE.match(spec.host_group):
            raise InvalidInput("a host group is 1-64 characters: lower-case letters, digits and . _ -")
        if spec.host_id is not None and s.get(Host, spec.host_id) is None:
            raise NotFound(f"no host {spec.host_id}", code="host_not_found")
        path = check_path("path", spec.path)
        backing = check_path("backing_path", spec.backing_path or default_backing(path))
        if _inside(backing, path) or _inside(path, backing):
            raise InvalidInput("backing_path and path must not contain one another")
        if not 512 <= spec.chunk_size <= 1 << 20 or spec.chunk_size & (spec.chunk_size - 1):
            raise InvalidInput("chunk_size must be a power of two from 512 to 1048576")
        if spec.mode not in MODES or spec.default_effect not in EFFECTS:
            raise InvalidInput(f"mode is one of {', '.join(MODES)}; default_effect one of {', '.join(EFFECTS)}")
        if len(spec.rules) > MAX_RULES:
            raise InvalidInput(f"at most {MAX_RULES} rules")
        key = s.execute(select(ManagedKey).where(key_filter(spec.key))).scalar_one_or_none()
        if key is None:
            raise NotFound(f"no key named or with id '{spec.key}'", code="key_not_found")
        require_aes(key, "a guard point")
        active = s.execute(select(KeyVersion.id).where(KeyVersion.key_id == key.id,
                                                       KeyVersion.state == KeyState.ACTIVE.value)).first()
        if active is None:
            raise Conflict(f"key '{key.name}' has no Active version to encrypt new files with",
                           code="illegal_state")
        return key, backing

    def _overlapping(self, s: Session, spec: GuardPointSpec, path: str, exclude: uuid.UUID | None) -> None:
        target = (GuardPoint.host_group == spec.host_group) if spec.host_group else (GuardPoint.host_id == spec.host_id)
        for other in s.execute(select(GuardPoint).where(target)).scalars():
            if other.id != exclude and (_inside(path, other.path) or _inside(other.path, path)):
                raise Conflict(f"{path} overlaps guard point {other.path} on the same hosts",
                               code="guard_point_overlaps")

    def create(self, ctx: RequestContext, spec: GuardPointSpec) -> GuardPoint:
        self._policy.require(ctx, Permission.GUARDPOINTS_MANAGE, action="guard_point.create",
                             object_type="guard_point", object_id=spec.path)
        now = self._now()
        with self._db.begin() as s:
            key, backing = self._validate(s, spec)
            self._overlapping(s, spec, spec.path, None)
            gp = GuardPoint(id=uuid.uuid4(), host_group=spec.host_group, host_id=spec.host_id, path=spec.path,
                            backing_path=backing, key_id=key.id, chunk_size=spec.chunk_size, mode=spec.mode,
                            rules=list(spec.rules), default_effect=spec.default_effect, revision=1, rekey_generation=0,
                            unprotect_generation=0,
                            created_by=ctx.principal.name, created_at=now, updated_at=now)
            s.add(gp)
            self._audit.add(s, ctx, action="guard_point.create", object_type="guard_point", object_id=str(gp.id),
                            details=self._summary(gp, key))
        return gp

    @staticmethod
    def _row(s: Session, gp_id: uuid.UUID) -> GuardPoint:
        """The guard point, locked for the change in this transaction."""
        gp = s.get(GuardPoint, gp_id, with_for_update=True)
        if gp is None:
            raise NotFound(f"no guard point {gp_id}", code="guard_point_not_found")
        return gp

    def update(self, ctx: RequestContext, gp_id: uuid.UUID, spec: GuardPointSpec) -> GuardPoint:
        """Replace the definition; the revision goes up and agents apply it live. The
        backing directory cannot move (its files stay where they are)."""
        self._policy.require(ctx, Permission.GUARDPOINTS_MANAGE, action="guard_point.update",
                             object_type="guard_point", object_id=str(gp_id))
        with self._db.begin() as s:
            gp = self._row(s, gp_id)
            key, backing = self._validate(s, spec)
            if backing != gp.backing_path or spec.path != gp.path or key.id != gp.key_id:
                raise Conflict("path, backing_path and key of a guard point are fixed: rotate the key instead, "
                               "or create a new guard point and move the data", code="guard_point_fixed")
            gp.host_group, gp.host_id = spec.host_group, spec.host_id
            self._overlapping(s, spec, spec.path, gp.id)
            gp.chunk_size, gp.mode, gp.rules = spec.chunk_size, spec.mode, list(spec.rules)
            gp.default_effect, gp.revision, gp.updated_at = spec.default_effect, gp.revision + 1, self._now()
            self._audit.add(s, ctx, action="guard_point.update", object_type="guard_point", object_id=str(gp.id),
                            details=self._summary(gp, key))
        return gp

    def request_rekey(self, ctx: RequestContext, gp_id: uuid.UUID) -> GuardPoint:
        """Ask the hosts to re-encrypt every file of the guard point under fresh file
        keys wrapped by the key's Active version (after a suspected exposure), online
        and resumably; they report progress with their heartbeats."""
        self._policy.require(ctx, Permission.GUARDPOINTS_MANAGE, action="guard_point.rekey",
                             object_type="guard_point", object_id=str(gp_id))
        with self._db.begin() as s:
            gp = self._row(s, gp_id)
            gp.rekey_generation += 1
            gp.revision += 1
            gp.updated_at = self._now()
            self._audit.add(s, ctx, action="guard_point.rekey", object_type="guard_point", object_id=str(gp.id),
                            details={"path": gp.path, "generation": gp.rekey_generation, "revision": gp.revision})
        return gp

    def request_unprotect(self, ctx: RequestContext, gp_id: uuid.UUID) -> GuardPoint:
        """Ask the hosts to decrypt every file of the guard point in place, in its backing
        directory (resumable, with progress in their heartbeats): the reverse of initial
        protection. Only in mode `off`, where applications see the backing files as
        stored, so no application reads a file while it changes from ciphertext to
        plaintext under a mount that expects one or the other. Deleting the guard point
        afterwards moves the plaintext back to its path."""
        self._policy.require(ctx, Permission.GUARDPOINTS_MANAGE, action="guard_point.unprotect",
                             object_type="guard_point", object_id=str(gp_id))
        with self._db.begin() as s:
            gp = self._row(s, gp_id)
            if gp.mode != "off":
                raise Conflict(f"guard point {gp.path} is in mode {gp.mode}: set its mode to off first (applications "
                               "then see the files as stored), then unprotect it", code="illegal_state")
            gp.unprotect_generation += 1
            gp.revision += 1
            gp.updated_at = self._now()
            self._audit.add(s, ctx, action="guard_point.unprotect", object_type="guard_point", object_id=str(gp.id),
                            details={"path": gp.path, "generation": gp.unprotect_generation,
                                     "revision": gp.revision})
        return gp

    def delete(self, ctx: RequestContext, gp_id: uuid.UUID) -> None:
        """Agents unmount it; the ciphertext stays in the backing directory (unless it was
        unprotected: then the agents move the plaintext back to the path)."""
        self._policy.require(ctx, Permission.GUARDPOINTS_MANAGE, action="guard_point.delete",
                             object_type="guard_point", object_id=str(gp_id))
        with self._db.begin() as s:
            gp = self._row(s, gp_id)
            s.delete(gp)
            self._audit.add(s, ctx, action="guard_point.delete", object_type="guard_point", object_id=str(gp_id),
                            details={"path": gp.path})

    def list_all(self, ctx: RequestContext) -> list[tuple[GuardPoint, str]]:
        self._policy.require(ctx, Permission.HOSTS_READ, action="guard_point.list")
        with self._db() as s:
            rows = s.execute(select(GuardPoint, ManagedKey.name).join(ManagedKey, ManagedKey.id == GuardPoint.key_id)
                             .order_by(GuardPoint.path))
            return [(gp, name) for gp, name in rows]

    def get(self, ctx: RequestContext, gp_id: uuid.UUID) -> tuple[GuardPoint, str]:
        self._policy.require(ctx, Permission.HOSTS_READ, action="guard_point.read", object_type="guard_point",
                             object_id=str(gp_id))
        with self._db() as s:
            row = s.execute(select(GuardPoint, ManagedKey.name).join(ManagedKey, ManagedKey.id == GuardPoint.key_id)
                            .where(GuardPoint.id == gp_id)).first()
        if row is None:
            raise NotFound(f"no guard point {gp_id}", code="guard_point_not_found")
        return row[0], row[1]

    def for_host(self, host: Host) -> list[tuple[GuardPoint, str]]:
        """The guard points that apply to this host (its own and its group's)."""
        with self._db() as s:
            rows = s.execute(select(GuardPoint, ManagedKey.name).join(ManagedKey, ManagedKey.id == GuardPoint.key_id)
                             .where(or_(GuardPoint.host_id == host.id, GuardPoint.host_group == host.host_group))
                             .order_by(GuardPoint.path))
            return [(gp, name) for gp, name in rows]

    @staticmethod
    def _summary(gp: GuardPoint, key: ManagedKey) -> dict[str, Any]:
        return {"path": gp.path, "key": key.name, "mode": gp.mode, "rules": len(gp.rules),
                "default": gp.default_effect, "revision": gp.revision,
                "target": f"group:{gp.host_group}" if gp.host_group else f"host:{gp.host_id}"}
