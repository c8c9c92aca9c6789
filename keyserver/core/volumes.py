"""Block volumes bound to the key server: LUKS2 volumes on hosts whose keyslot
passphrase is a data key sealed under a managed key. The sealed blob lives in the
volume's own LUKS2 header (a token, like Clevis's); opening the volume means asking
this service to unseal it, so a revoked volume or host, a host outside the volume's
scope, or a destroyed key version cannot open it, and every open and refusal is in the
audit chain (docs/volumes.md).

The passphrase leaves the server only encrypted under the asking host's public key
(RSA-OAEP-SHA256), as key deliveries do; the server keeps no copy.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from sqlalchemy import or_, select
from sqlalchemy.orm import Session, sessionmaker

from keyserver.core.audit import AuditService, utcnow
from keyserver.core.datakeys import DataKeyService, parse_blob
from keyserver.core.errors import Conflict, CoreError, InvalidInput, NotFound
from keyserver.core.guardpoints import check_path
from keyserver.core.hosts import may_receive
from keyserver.core.keys import key_filter, require_aes
from keyserver.core.permissions import Permission
from keyserver.core.policy import Policy
from keyserver.core.principal import RequestContext
from keyserver.store.models import Host, ManagedKey, Volume

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
STATES = ("created", "open", "closed", "rekeying", "revoked")
# What a host may report of its own volume (revoked is the server's word).
HOST_STATES = frozenset({"open", "closed", "rekeying"})
OPEN_PATHS = ("userspace", "dm-crypt")
SCOPES = ("host", "group")
SECTOR_SIZES = (512, 4096)
PASSPHRASE_BYTES = 32
MAX_GRACE_SECONDS = 7 * 86_400
MECHANISM = "RSA-OAEP-SHA256"
# The data key's encryption context: a blob opens only for the volume it was made for.
CONTEXT_KEY = "strongroom:volume"


@dataclass(frozen=True, slots=True)
class VolumeSpec:
    name: str
    path: str
    key: str
    scope: str = "host"
    sector_size: int = 4096
    size_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Secret:
    """A keyslot passphrase for the host: encrypted under its public key, with the blob
    that seals it (what the volume's token keeps) and the key version it is sealed under."""

    key_name: str
    key_version: int
    blob: bytes
    wrapped: bytes
    mechanism: str = MECHANISM
    # Until when the host may open the volume with this passphrase without asking again
    # (the volume's offline grace); None: fail closed.
    grace_until: datetime | None = None


def _for_host(host: Host, secret: bytes) -> bytes:
    public = serialization.load_der_public_key(host.public_key_der)
    if not isinstance(public, rsa.RSAPublicKey):
        raise Conflict("this host's key is not an RSA key: re-enroll it", code="host_key_unsupported")
    return public.encrypt(secret, padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(),
                                               label=None))


def _context(volume_id: uuid.UUID) -> dict[str, str]:
    return {CONTEXT_KEY: str(volume_id)}


class VolumeService:
    def __init__(self, session_factory: sessionmaker[Session], audit: AuditService, policy: Policy,
                 datakeys: DataKeyService, *, now: Callable[[], datetime] = utcnow) -> None:
        self._db = session_factory
        self._audit = audit
        self._policy = policy
        self._datakeys = datakeys
        self._now = now

    # --- what hosts call (agent port) ---------------------------------------------------
    @staticmethod
    def _as_host(ctx: RequestContext) -> RequestContext:
        """The host, once this service has authorised it for the volume, may seal and
        unseal that volume's passphrase (the data keys' own policy and audit apply)."""
        granted = frozenset({Permission.DATAKEYS_GENERATE, Permission.DATAKEYS_DECRYPT})
        return replace(ctx, principal=replace(ctx.principal, permissions=granted))

    def _seal(self, ctx: RequestContext, host: Host, key_ref: str, volume_id: uuid.UUID) -> Secret:
        dk = self._datakeys.generate(self._as_host(ctx), key_ref, number_of_bytes=PASSPHRASE_BYTES,
                                     context=_context(volume_id))
        assert dk.plaintext is not None
        return Secret(dk.key_name, dk.key_version, dk.blob, _for_host(host, dk.plaintext))

    def create(self, ctx: RequestContext, host: Host, spec: VolumeSpec) -> tuple[Volume, Secret]:
        """Record a new volume of this host and make its first keyslot passphrase."""
        if not NAME_RE.match(spec.name):
            raise InvalidInput("a volume name is 1-64 characters: lower-case letters, digits and . _ -")
        check_path("path", spec.path)
        if spec.scope not in SCOPES:
            raise InvalidInput(f"scope is one of {', '.join(SCOPES)}")
        if spec.sector_size not in SECTOR_SIZES:
            raise InvalidInput("sector_size is 512 or 4096")
        with self._db() as s:
            key = s.execute(select(ManagedKey).where(key_filter(spec.key))).scalar_one_or_none()
            if key is None:
                raise NotFound(f"no key named or with id '{spec.key}'", code="key_not_found")
            require_aes(key, "a volume")
            allowed = may_receive(s, host, key)
            taken = s.execute(select(Volume.id).where(Volume.host_id == host.id, Volume.name == spec.name)).first()
        if not allowed:
            self._policy.deny(ctx, action="volume.create", object_type="key", object_id=str(key.id),
                              details={"name": spec.name, "key": key.name, "reason": "key_not_for_host"},
                              message=f"host group '{host.host_group}' may not use key '{key.name}': tag the key "
                                      f"host-group={host.host_group} to allow it")
        if taken is not None:
            raise Conflict(f"this host already has a volume named '{spec.name}'", code="volume_exists")
        volume_id = uuid.uuid4()
        secret = self._seal(ctx, host, str(key.id), volume_id)
        now = self._now()
        with self._db.begin() as s:
            vol = Volume(id=volume_id, host_id=host.id, host_group=host.host_group, scope=spec.scope, name=spec.name,
                         path=spec.path, key_id=key.id, key_version=secret.key_version, size_bytes=spec.size_bytes,
                         sector_size=spec.sector_size, state="created", rekey_generation=0, rekey_applied=0,
                         created_by=ctx.principal.name, created_at=now, updated_at=now)
            s.add(vol)
            self._audit.add(s, ctx, action="volume.create", object_type="volume", object_id=str(volume_id),
                            details={"name": spec.name, "path": spec.path, "key": key.name,
                                     "version": secret.key_version, "scope": spec.scope})
        return vol, secret

    def _authorise(self, ctx: RequestContext, host: Host, volume_id: uuid.UUID, action: str) -> Volume:
        """The volume, if this host may use it now; refusals are audited."""
        with self._db() as s:
            vol = s.get(Volume, volume_id)
        if vol is None:
            self._audit.record_now(ctx, action=action, outcome="denied", object_type="volume",
                                   object_id=str(volume_id), details={"reason": "unknown"})
            raise NotFound(f"no volume {volume_id}: it was never made through this server, or it was deleted",
                           code="volume_not_found")
        mine = vol.host_id == host.id or (vol.scope == "group" and vol.host_group == host.host_group)
        if not mine:
            self._policy.deny(ctx, action=action, object_type="volume", object_id=str(vol.id),
                              details={"name": vol.name, "reason": "other_host"},
                              message=f"volume '{vol.name}' belongs to another host; only its own host"
                                      f"{' group' if vol.scope == 'group' else ''} may open it")
        if vol.state == "revoked":
            self._policy.deny(ctx, action=action, object_type="volume", object_id=str(vol.id),
                              details={"name": vol.name, "reason": "revoked"}, code="volume_revoked",
                              message=f"volume '{vol.name}' is revoked on the key server: it cannot be opened "
                                      "(its recovery passphrase, if one was made, still opens it)")
        return vol

    def _unseal(self, ctx: RequestContext, host: Host, vol: Volume, blob: bytes, action: str) -> Secret:
        try:
            _, key_id, _, _ = parse_blob(blob)
            if key_id != vol.key_id:
                raise InvalidInput("this blob is sealed under another key than the volume's", code="invalid_blob")
            dk = self._datakeys.decrypt(self._as_host(ctx), blob, context=_context(vol.id))
        except CoreError as exc:
            self._audit.record_now(ctx, action=action, outcome="denied", object_type="volume", object_id=str(vol.id),
                                   details={"name": vol.name, "reason": exc.code})
            raise
        assert dk.plaintext is not None
        return Secret(dk.key_name, dk.key_version, blob, _for_host(host, dk.plaintext))

    def unseal(self, ctx: RequestContext, host: Host, volume_id: uuid.UUID, blob: bytes) -> tuple[Volume, Secret]:
        """The passphrase of the volume's keyslot, to open it."""
        vol = self._authorise(ctx, host, volume_id, "volume.open")
        secret = self._unseal(ctx, host, vol, blob, "volume.open")
        details: dict[str, Any] = {"name": vol.name, "version": secret.key_version}
        if vol.grace_seconds > 0:
            secret = replace(secret, grace_until=self._now() + timedelta(seconds=vol.grace_seconds))
            details["grace_until"] = secret.grace_until.isoformat() if secret.grace_until else None
        self._audit.record_now(ctx, action="volume.unseal", outcome="allowed", object_type="volume",
                               object_id=str(vol.id), details=details)
        return vol, secret

    def reseal(self, ctx: RequestContext, host: Host, volume_id: uuid.UUID,
               blob: bytes) -> tuple[Volume, Secret, Secret]:
        """Rotation: the current passphrase (to add a keyslot with it) and a new one
        sealed under the key's Active version. The host replaces the keyslot, then reports
        the new version (`report`)."""
        vol = self._authorise(ctx, host, volume_id, "volume.rotate")
        old = self._unseal(ctx, host, vol, blob, "volume.rotate")
        new = self._seal(ctx, host, str(vol.key_id), vol.id)
        self._audit.record_now(ctx, action="volume.reseal", outcome="allowed", object_type="volume",
                               object_id=str(vol.id),
                               details={"name": vol.name, "from_version": old.key_version,
                                        "to_version": new.key_version})
        return vol, old, new

    def report(self, ctx: RequestContext, host: Host, volume_id: uuid.UUID, *, state: str,
               opened_by: str | None = None, luks_uuid: str | None = None, size_bytes: int | None = None,
               key_version: int | None = None, rekey: dict[str, Any] | None = None,
               detail: str = "") -> Volume:
        """What the host did with its volume: formatted, opened, closed, rotated, re-keyed."""
        if state not in HOST_STATES:
            raise InvalidInput(f"a host reports one of {', '.join(sorted(HOST_STATES))}")
        if opened_by is not None and opened_by not in OPEN_PATHS:
            raise InvalidInput(f"opened_by is one of {', '.join(OPEN_PATHS)}")
        action = "volume.rekey" if rekey is not None or state == "rekeying" else \
            {"open": "volume.open", "closed": "volume.close"}[state]
        self._authorise(ctx, host, volume_id, action)
        now = self._now()
        with self._db.begin() as s:
            vol = s.get(Volume, volume_id, with_for_update=True)
            if vol is None:
                raise NotFound(f"no volume {volume_id}", code="volume_not_found")
            details: dict[str, Any] = {"name": vol.name, "state": state}
            if vol.state == "revoked":
                raise Conflict(f"volume '{vol.name}' is revoked", code="volume_revoked")
            was = vol.state
            vol.state, vol.updated_at = state, now
            if state == "open":
                vol.opened_by, vol.last_opened_at = opened_by, now
                details["opened_by"] = opened_by
            elif state == "closed":
                vol.opened_by = None
            if luks_uuid is not None:
                vol.luks_uuid = luks_uuid
            if size_bytes is not None:
                vol.size_bytes = size_bytes
            if key_version is not None and key_version != vol.key_version:
                details["version"] = vol.key_version = key_version
            if rekey is not None:
                vol.rekey_progress = rekey
                if rekey.get("finished") and int(rekey.get("generation", 0)) > vol.rekey_applied:
                    vol.rekey_applied = int(rekey["generation"])
                    # A re-key the host ran of its own accord counts as asked for: the next
                    # request is a new generation, not one already done.
                    vol.rekey_generation = max(vol.rekey_generation, vol.rekey_applied)
                    details["rekeyed"] = vol.rekey_applied
                    # LUKS2 re-encryption keeps only the sealed keyslot: a recovery
                    # passphrase made before it no longer opens the volume.
                    vol.recovery_created_at = None
            if detail:
                details["detail"] = detail[:500]
            # A progress tick is not an event; the state changes and their outcomes are (a
            # re-key the host reports stopped included: it leaves `rekeying` unfinished).
            if rekey is None or rekey.get("finished") or rekey.get("done", 0) == 0 or state != was:
                self._audit.add(s, ctx, action=action, object_type="volume", object_id=str(vol.id), details=details)
        return vol

    def record_recovery(self, ctx: RequestContext, host: Host, volume_id: uuid.UUID) -> Volume:
        """The host is adding a recovery passphrase keyslot (made and shown on the host,
        never sent here): once per volume, audited."""
        self._authorise(ctx, host, volume_id, "volume.recovery")
        with self._db.begin() as s:
            vol = s.get(Volume, volume_id, with_for_update=True)
            assert vol is not None
            if vol.recovery_created_at is not None:
                raise Conflict(f"volume '{vol.name}' already has a recovery passphrase (made "
                               f"{vol.recovery_created_at:%Y-%m-%d %H:%M} UTC); it is shown only once",
                               code="recovery_exists")
            vol.recovery_created_at = vol.updated_at = self._now()
            self._audit.add(s, ctx, action="volume.recovery", object_type="volume", object_id=str(vol.id),
                            details={"name": vol.name})
        return vol

    def for_host(self, host: Host) -> list[tuple[Volume, str, str]]:
        """The volumes this host may open: its own, and its group's shared ones."""
        return self._rows(or_(Volume.host_id == host.id,
                              (Volume.scope == "group") & (Volume.host_group == host.host_group)))

    def _rows(self, *where: Any) -> list[tuple[Volume, str, str]]:
        q = (select(Volume, ManagedKey.name, Host.hostname).join(ManagedKey, ManagedKey.id == Volume.key_id)
             .join(Host, Host.id == Volume.host_id).where(*where).order_by(Host.hostname, Volume.name))
        with self._db() as s:
            return [(v, k, h) for v, k, h in s.execute(q)]

    # --- what people call (REST) --------------------------------------------------------
    def list_all(self, ctx: RequestContext, *, host_id: uuid.UUID | None = None,
                 state: str | None = None) -> list[tuple[Volume, str, str]]:
        self._policy.require(ctx, Permission.HOSTS_READ, action="volume.list")
        where = []
        if host_id is not None:
            where.append(Volume.host_id == host_id)
        if state is not None:
            if state not in STATES:
                raise InvalidInput(f"state is one of {', '.join(STATES)}")
            where.append(Volume.state == state)
        return self._rows(*where)

    def describe(self, volume_id: uuid.UUID) -> tuple[Volume, str, str]:
        """The volume with its key's name and host's, for the answer to a call that this
        service has just authorised (no policy check of its own)."""
        rows = self._rows(Volume.id == volume_id)
        if not rows:
            raise NotFound(f"no volume {volume_id}", code="volume_not_found")
        return rows[0]

    def get(self, ctx: RequestContext, volume_id: uuid.UUID) -> tuple[Volume, str, str]:
        self._policy.require(ctx, Permission.HOSTS_READ, action="volume.read", object_type="volume",
                             object_id=str(volume_id))
        return self.describe(volume_id)

    def _row(self, s: Session, volume_id: uuid.UUID) -> Volume:
        vol = s.get(Volume, volume_id, with_for_update=True)
        if vol is None:
            raise NotFound(f"no volume {volume_id}", code="volume_not_found")
        return vol

    def revoke(self, ctx: RequestContext, volume_id: uuid.UUID) -> Volume:
        """From now on the server refuses to unseal it: no host opens it again (an open
        volume stays open until its host closes it or the agent learns of the revocation)."""
        self._policy.require(ctx, Permission.VOLUMES_MANAGE, action="volume.revoke", object_type="volume",
                             object_id=str(volume_id))
        with self._db.begin() as s:
            vol = self._row(s, volume_id)
            if vol.state == "revoked":
                raise Conflict(f"volume '{vol.name}' is already revoked", code="volume_revoked")
            vol.state, vol.revoked_at = "revoked", self._now()
            vol.updated_at = vol.revoked_at
            self._audit.add(s, ctx, action="volume.revoke", object_type="volume", object_id=str(vol.id),
                            details={"name": vol.name, "host": str(vol.host_id)})
        return vol

    def set_policy(self, ctx: RequestContext, volume_id: uuid.UUID, *, grace_seconds: int) -> Volume:
        """The offline grace: how long after an unseal the host may open the volume
        again without the server (0: fail closed, the default)."""
        self._policy.require(ctx, Permission.VOLUMES_MANAGE, action="volume.policy", object_type="volume",
                             object_id=str(volume_id))
        if not 0 <= grace_seconds <= MAX_GRACE_SECONDS:
            raise InvalidInput(f"grace_seconds is 0 (fail closed) to {MAX_GRACE_SECONDS} (7 days)")
        with self._db.begin() as s:
            vol = self._row(s, volume_id)
            before, vol.grace_seconds, vol.updated_at = vol.grace_seconds, grace_seconds, self._now()
            self._audit.add(s, ctx, action="volume.policy", object_type="volume", object_id=str(vol.id),
                            details={"name": vol.name, "grace_seconds": grace_seconds, "was": before})
        return vol

    def request_rekey(self, ctx: RequestContext, volume_id: uuid.UUID) -> Volume:
        """Ask the host to re-encrypt the volume's data under a new volume key (LUKS2
        reencryption, resumable); it reports progress with `report`."""
        self._policy.require(ctx, Permission.VOLUMES_MANAGE, action="volume.rekey", object_type="volume",
                             object_id=str(volume_id))
        with self._db.begin() as s:
            vol = self._row(s, volume_id)
            if vol.state == "revoked":
                raise Conflict(f"volume '{vol.name}' is revoked", code="volume_revoked")
            vol.rekey_generation += 1
            vol.updated_at = self._now()
            self._audit.add(s, ctx, action="volume.rekey_requested", object_type="volume", object_id=str(vol.id),
                            details={"name": vol.name, "generation": vol.rekey_generation})
        return vol
