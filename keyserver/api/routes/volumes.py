"""Block volumes as people see and govern them: list, read, revoke, ask for a re-key.
Hosts make, open and close them through the agent port (routes/agent.py)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from keyserver.api.deps import Ctx, ServicesDep
from keyserver.api.schemas import Strict
from keyserver.core.views import VolumeView
from keyserver.core.volumes import MAX_GRACE_SECONDS

router = APIRouter(prefix="/volumes", tags=["volumes"])

VolumeState = Literal["created", "open", "closed", "rekeying", "revoked"]


class RekeyState(BaseModel):
    generation: int
    done: int = 0
    total: int = 0
    finished: bool = False


class VolumePublic(BaseModel):
    id: uuid.UUID
    name: str
    host_id: uuid.UUID
    hostname: str
    host_group: str
    scope: Literal["host", "group"] = Field(description="who may open it: its host, or every host of the group")
    path: str = Field(description="the block device or image file on the host")
    key_id: uuid.UUID
    key_name: str
    key_version: int = Field(description="the key version the keyslot passphrase is sealed under")
    luks_uuid: str | None
    size_bytes: int | None
    sector_size: int
    state: VolumeState
    opened_by: Literal["userspace", "dm-crypt"] | None = Field(description="how it is open, while it is")
    rekey_generation: int = Field(description="bumped by each re-key request")
    rekey_applied: int = Field(description="the last re-key request the host finished")
    rekey: RekeyState | None = Field(description="the host's last progress report")
    has_recovery: bool = Field(description="a recovery passphrase keyslot was made (shown once, on the host)")
    recovery_created_at: datetime | None
    grace_seconds: int = Field(description="how long after an unseal its host may open it without the server; "
                               "0: fail closed")
    revoked_at: datetime | None
    created_by: str
    created_at: datetime
    updated_at: datetime
    last_opened_at: datetime | None


def volume_public(v: VolumeView, key_name: str, hostname: str) -> VolumePublic:
    return VolumePublic(
        id=v.id, name=v.name, host_id=v.host_id, hostname=hostname, host_group=v.host_group,
        scope=v.scope,  # type: ignore[arg-type]
        path=v.path, key_id=v.key_id, key_name=key_name, key_version=v.key_version, luks_uuid=v.luks_uuid,
        size_bytes=v.size_bytes, sector_size=v.sector_size, state=v.state,  # type: ignore[arg-type]
        opened_by=v.opened_by,  # type: ignore[arg-type]
        rekey_generation=v.rekey_generation, rekey_applied=v.rekey_applied,
        rekey=RekeyState(**v.rekey_progress) if v.rekey_progress else None,
        has_recovery=v.recovery_created_at is not None, recovery_created_at=v.recovery_created_at,
        grace_seconds=v.grace_seconds,
        revoked_at=v.revoked_at, created_by=v.created_by, created_at=v.created_at, updated_at=v.updated_at,
        last_opened_at=v.last_opened_at)


@router.get("", operation_id="listVolumes", response_model=list[VolumePublic])
def list_volumes(ctx: Ctx, services: ServicesDep,
                 host_id: Annotated[uuid.UUID | None, Query(description="one host's volumes")] = None,
                 state: Annotated[VolumeState | None, Query()] = None) -> list[VolumePublic]:
    return [volume_public(*row) for row in services.volumes.list_all(ctx, host_id=host_id, state=state)]


@router.get("/{volume_id}", operation_id="getVolume", response_model=VolumePublic)
def get_volume(volume_id: uuid.UUID, ctx: Ctx, services: ServicesDep) -> VolumePublic:
    return volume_public(*services.volumes.get(ctx, volume_id))


@router.post("/{volume_id}/revoke", operation_id="revokeVolume", response_model=VolumePublic)
def revoke_volume(volume_id: uuid.UUID, ctx: Ctx, services: ServicesDep) -> VolumePublic:
    """The server refuses to unseal it from now on: no host opens it again, except with
    its recovery passphrase. Cannot be undone."""
    services.volumes.revoke(ctx, volume_id)
    return volume_public(*services.volumes.get(ctx, volume_id))


class VolumePolicy(Strict):
    grace_seconds: int = Field(ge=0, le=MAX_GRACE_SECONDS, description="0 (fail closed) to 7 days")


@router.put("/{volume_id}/policy", operation_id="setVolumePolicy", response_model=VolumePublic)
def set_volume_policy(volume_id: uuid.UUID, body: VolumePolicy, ctx: Ctx, services: ServicesDep) -> VolumePublic:
    """The offline grace: how long after an unseal the host may open the volume again
    while the server is unreachable (its passphrase kept wrapped under the host's key)."""
    services.volumes.set_policy(ctx, volume_id, grace_seconds=body.grace_seconds)
    return volume_public(*services.volumes.get(ctx, volume_id))


@router.post("/{volume_id}/rekey", operation_id="rekeyVolume", response_model=VolumePublic, status_code=202)
def rekey_volume(volume_id: uuid.UUID, ctx: Ctx, services: ServicesDep) -> VolumePublic:
    """Ask the host to re-encrypt the data under a new volume key (`kms-agent volume rekey`
    does it, resumably, and reports progress in `rekey`)."""
    services.volumes.request_rekey(ctx, volume_id)
    return volume_public(*services.volumes.get(ctx, volume_id))
