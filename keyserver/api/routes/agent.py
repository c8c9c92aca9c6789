"""The routes enrolled hosts call, on the agent port, authenticated by their client
certificates (docs/agents.md)."""

from __future__ import annotations

import base64
import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import AwareDatetime, BaseModel, Field, StringConstraints

from keyserver.api.deps import HostDep, ServicesDep
from keyserver.api.routes.guardpoints import GuardPointPublic, guard_point_public
from keyserver.api.routes.volumes import RekeyState, VolumePublic, volume_public
from keyserver.api.schemas import MAX_INT, Strict
from keyserver.core.audit import utcnow
from keyserver.core.errors import InvalidInput
from keyserver.core.guardpoints import revision_tag
from keyserver.core.hosts import EVENT_NAME_RE, AgentEvent
from keyserver.core.volumes import Secret, VolumeSpec

router = APIRouter(prefix="/agent", tags=["agent"])

Short = Annotated[str, StringConstraints(max_length=1024)]
EventValue = Short | int | float | bool | None


class RekeyProgress(Strict):
    generation: int = Field(ge=0, le=MAX_INT)
    done: int = Field(ge=0, le=MAX_INT)
    total: int = Field(ge=0, le=MAX_INT)
    finished: bool
    # Hard-linked files a re-key leaves as they are (re-keying one name would split the
    # file): the agent names up to 100 so the operator can see what stays on old file keys.
    skipped_hard_links: list[Annotated[str, Field(min_length=1, max_length=4096)]] | None = Field(
        default=None, max_length=100)


class GuardPointReport(Strict):
    id: uuid.UUID | None = Field(default=None, description="the server's guard point this is")
    revision: int | None = Field(default=None, ge=1, le=MAX_INT, description="the policy revision applied")
    path: str = Field(min_length=1, max_length=4096)
    key: str = Field(min_length=1, max_length=200, description="the managed key's name or id")
    state: Literal["mounted", "off", "unmounted", "error", "protecting", "unprotecting"]
    detail: str = Field(default="", max_length=500)
    rekey: RekeyProgress | None = None
    unprotect: RekeyProgress | None = None
    versions: dict[Annotated[str, StringConstraints(pattern=r"^[1-9][0-9]{0,9}$")],
                   Annotated[int, Field(ge=0, le=MAX_INT)]] | None = Field(
        default=None, max_length=64,
        description="files per key version named in their headers (version number → files), from the "
                    "agent's last full walk; what a key version's inventory counts (decision 0024)")
    scanned_at: AwareDatetime | None = Field(default=None, description="when that walk finished")
    # Strict: a count sent as "3" or 3.5 or true is a broken agent, not a number to guess at.
    unreadable: int | None = Field(
        default=None, ge=0, le=MAX_INT, strict=True,
        description="files of that walk whose header names no version of this key (damaged, or another "
                    "key's): no version of it decrypts them, so they hold none; the inventory shows them and "
                    "a retirement's statement names them (decision 0024)")


class HeartbeatRequest(Strict):
    os: str = Field(default="", max_length=200)
    agent_version: str = Field(default="", max_length=64)
    guard_points: list[GuardPointReport] | None = Field(
        default=None, max_length=256, description="omitted: unchanged (a status check, not the daemon)")


class HeartbeatResponse(BaseModel):
    host_id: uuid.UUID
    hostname: str
    host_group: str
    state: str
    server_time: datetime = Field(description="for the agent's clock-skew check")
    heartbeat_seconds: int
    guard_points_tag: str = Field(description="changes whenever this host's guard points do: fetch them again")


class AgentKey(BaseModel):
    key_id: uuid.UUID
    name: str
    active_version: int | None
    retiring_versions: list[int] = Field(
        default_factory=list, description="versions being retired: move guard points and volumes off them, "
                                          "walk again and report `versions`")
    destroyed_versions: list[int] = Field(
        default_factory=list, description="destroyed versions: wipe them from every cache and data plane")


class DeliveredKeyPublic(BaseModel):
    key_id: uuid.UUID
    name: str
    version: int
    state: str
    mechanism: str = Field(description="how `wrapped_key` is wrapped under the host's public key")
    wrapped_key: str = Field(description="base64; only the host's private key unwraps it")


class EventIn(Strict):
    event: str = Field(pattern=EVENT_NAME_RE.pattern, examples=["access.denied"])
    time: float = Field(ge=0, description="when it happened on the host (Unix seconds)")
    object_type: str | None = Field(default=None, max_length=64)
    object_id: str | None = Field(default=None, max_length=4096)
    fields: dict[Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,31}$")], EventValue] = Field(
        default_factory=dict, max_length=32)


class EventBatch(Strict):
    events: list[EventIn] = Field(min_length=1, max_length=500)


class EventsAccepted(BaseModel):
    accepted: int


@router.post("/heartbeat", operation_id="agentHeartbeat", response_model=HeartbeatResponse)
def heartbeat(body: HeartbeatRequest, caller: HostDep, services: ServicesDep) -> HeartbeatResponse:
    host = services.hosts.heartbeat(caller.host, os_name=body.os, agent_version=body.agent_version,
                                    guard_points=None if body.guard_points is None else
                                    [g.model_dump(mode="json") for g in body.guard_points],
                                    source_ip=caller.ctx.source_ip)
    tag = revision_tag([gp for gp, _ in services.guard_points.for_host(host)])
    return HeartbeatResponse(host_id=host.id, hostname=host.hostname, host_group=host.host_group, state=host.state,
                             server_time=utcnow(), heartbeat_seconds=services.hosts.heartbeat_seconds,
                             guard_points_tag=tag)


@router.get("/guard-points", operation_id="listAgentGuardPoints", response_model=list[GuardPointPublic])
def guard_points(caller: HostDep, services: ServicesDep) -> list[GuardPointPublic]:
    """The guard points this host must serve, with their current policy."""
    return [guard_point_public(gp, name) for gp, name in services.guard_points.for_host(caller.host)]


@router.get("/keys", operation_id="listAgentKeys", response_model=list[AgentKey])
def list_keys(caller: HostDep, services: ServicesDep) -> list[AgentKey]:
    """The keys this host's group may receive."""
    return [AgentKey(key_id=k.id, name=k.name, active_version=v, retiring_versions=r, destroyed_versions=d)
            for k, v, r, d in services.hosts.allowed_keys(caller.host)]


@router.get("/keys/{key_ref}", operation_id="getAgentKey", response_model=DeliveredKeyPublic)
def get_key(key_ref: str, caller: HostDep, services: ServicesDep,
            version: Annotated[int | None, Query(ge=1, lt=2**32)] = None) -> DeliveredKeyPublic:
    """A key version (the Active one by default) re-wrapped inside the HSM under this
    host's public key."""
    d = services.hosts.deliver_key(caller.ctx, caller.host, key_ref, version)
    wrapped = base64.b64encode(d.wrapped.ciphertext).decode()
    return DeliveredKeyPublic(key_id=d.key_id, name=d.key_name, version=d.version, state=d.state,
                              mechanism=d.wrapped.mechanism, wrapped_key=wrapped)


@router.post("/events", operation_id="reportAgentEvents", response_model=EventsAccepted)
def report_events(body: EventBatch, caller: HostDep, services: ServicesDep) -> EventsAccepted:
    """A batch from the agent's spool, recorded whole in the audit log as this host."""
    events = [AgentEvent(e.event, e.time, e.object_type, e.object_id, dict[str, Any](e.fields)) for e in body.events]
    return EventsAccepted(accepted=services.hosts.record_events(caller.ctx, caller.host, events))


# --- block volumes (docs/volumes.md) ----------------------------------------------------
Blob = Annotated[str, StringConstraints(min_length=8, max_length=4096, pattern=r"^[A-Za-z0-9+/]+={0,2}$")]


class VolumeIn(Strict):
    name: str = Field(min_length=1, max_length=64, examples=["pgdata"])
    path: str = Field(min_length=2, max_length=1024, description="block device or image file on this host")
    key: str = Field(min_length=1, max_length=128, description="managed key name or id (allowed for this host)")
    scope: Literal["host", "group"] = Field(default="host", description="group: every host of this host's group "
                                            "may open it (shared storage)")
    sector_size: Literal[512, 4096] = 4096
    size_bytes: int | None = Field(default=None, ge=0, le=MAX_INT)


class SecretOut(BaseModel):
    key_name: str
    key_version: int
    blob: str = Field(description="base64 of the sealed passphrase: what the volume's LUKS2 token keeps")
    mechanism: str = Field(description="how `wrapped_passphrase` is wrapped under the host's public key")
    wrapped_passphrase: str = Field(description="base64; only the host's private key unwraps it")
    grace_until: datetime | None = Field(default=None, description="until when the host may keep it to open the "
                                         "volume while the server is unreachable; null: fail closed")


class VolumeSecret(BaseModel):
    volume: VolumePublic
    secret: SecretOut


class VolumeResealed(BaseModel):
    volume: VolumePublic
    current: SecretOut = Field(description="the passphrase of the keyslot in use")
    new: SecretOut = Field(description="the new passphrase, sealed under the key's Active version")


class SealedIn(Strict):
    blob: Blob


class VolumeReport(Strict):
    state: Literal["open", "closed", "rekeying"]
    opened_by: Literal["userspace", "dm-crypt"] | None = None
    luks_uuid: str | None = Field(default=None, pattern=r"^[0-9a-f-]{36}$")
    size_bytes: int | None = Field(default=None, ge=0, le=MAX_INT)
    key_version: int | None = Field(default=None, ge=1, lt=2**32, description="after a rotation: the new version")
    rekey: RekeyState | None = None
    detail: str = Field(default="", max_length=500)


def _secret(secret: Secret) -> SecretOut:
    return SecretOut(key_name=secret.key_name, key_version=secret.key_version,
                     blob=base64.b64encode(secret.blob).decode(), mechanism=secret.mechanism,
                     wrapped_passphrase=base64.b64encode(secret.wrapped).decode(), grace_until=secret.grace_until)


def _blob(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise InvalidInput("blob is not base64", code="invalid_blob") from None


def _public(services: ServicesDep, volume_id: uuid.UUID) -> VolumePublic:
    return volume_public(*services.volumes.describe(volume_id))


@router.get("/volumes", operation_id="listAgentVolumes", response_model=list[VolumePublic])
def list_volumes(caller: HostDep, services: ServicesDep) -> list[VolumePublic]:
    """The volumes this host may open (its own and its group's shared ones)."""
    return [volume_public(*row) for row in services.volumes.for_host(caller.host)]


@router.post("/volumes", operation_id="createAgentVolume", response_model=VolumeSecret, status_code=201)
def create_volume(body: VolumeIn, caller: HostDep, services: ServicesDep) -> VolumeSecret:
    """Record a new volume of this host and make its keyslot passphrase (the host then
    formats the device with it and writes the sealed blob into the LUKS2 token)."""
    spec = VolumeSpec(name=body.name, path=body.path, key=body.key, scope=body.scope, sector_size=body.sector_size,
                      size_bytes=body.size_bytes)
    vol, secret = services.volumes.create(caller.ctx, caller.host, spec)
    return VolumeSecret(volume=_public(services, vol.id), secret=_secret(secret))


@router.post("/volumes/{volume_id}/unseal", operation_id="unsealAgentVolume", response_model=VolumeSecret)
def unseal_volume(volume_id: uuid.UUID, body: SealedIn, caller: HostDep, services: ServicesDep) -> VolumeSecret:
    """The keyslot passphrase, to open the volume: refused (403) for a revoked volume or
    another host's, (409) for a destroyed or unusable key version."""
    _, secret = services.volumes.unseal(caller.ctx, caller.host, volume_id, _blob(body.blob))
    return VolumeSecret(volume=_public(services, volume_id), secret=_secret(secret))


@router.post("/volumes/{volume_id}/reseal", operation_id="resealAgentVolume", response_model=VolumeResealed)
def reseal_volume(volume_id: uuid.UUID, body: SealedIn, caller: HostDep, services: ServicesDep) -> VolumeResealed:
    """Rotation: the passphrase in use and a new one under the key's Active version."""
    _, current, new = services.volumes.reseal(caller.ctx, caller.host, volume_id, _blob(body.blob))
    return VolumeResealed(volume=_public(services, volume_id), current=_secret(current), new=_secret(new))


@router.post("/volumes/{volume_id}/report", operation_id="reportAgentVolume", response_model=VolumePublic)
def report_volume(volume_id: uuid.UUID, body: VolumeReport, caller: HostDep, services: ServicesDep) -> VolumePublic:
    """What the host did: formatted (closed), opened, closed, rotated, re-key progress."""
    services.volumes.report(caller.ctx, caller.host, volume_id, state=body.state, opened_by=body.opened_by,
                            luks_uuid=body.luks_uuid, size_bytes=body.size_bytes, key_version=body.key_version,
                            rekey=None if body.rekey is None else body.rekey.model_dump(), detail=body.detail)
    return _public(services, volume_id)


@router.post("/volumes/{volume_id}/recovery", operation_id="recordAgentVolumeRecovery", response_model=VolumePublic)
def record_recovery(volume_id: uuid.UUID, caller: HostDep, services: ServicesDep) -> VolumePublic:
    """The host is adding a recovery passphrase (made and shown on the host only): once
    per volume (409 recovery_exists after)."""
    services.volumes.record_recovery(caller.ctx, caller.host, volume_id)
    return _public(services, volume_id)
