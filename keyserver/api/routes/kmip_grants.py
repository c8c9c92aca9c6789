"""KMIP tenancy over REST: the groups there are, and grants letting a KMIP client or a
group see another group's objects (docs/kmip.md "Tenancy", core/kmip_grants.py)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from keyserver.api.deps import Ctx, ServicesDep
from keyserver.api.schemas import KMIP_GROUP_PATTERN as GROUP_PATTERN
from keyserver.core.kmip_grants import GrantRecord

router = APIRouter(prefix="/kmip", tags=["kmip"])
Right = Literal["read", "use", "export", "destroy"]


class KmipGroup(BaseModel):
    name: str
    clients: list[str] = Field(description="the unrevoked KMIP clients in the group, by name")
    objects: int = Field(description="live objects in the group (a managed key counts once)")


class KmipGrantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grantee: str = Field(pattern=r"^(client|group):[a-z0-9][a-z0-9._-]{0,63}$",
                         description="'client:<client name>' or 'group:<group name>'", examples=["client:veeam"])
    key: str | None = Field(default=None, min_length=1, max_length=128,
                            description="a managed key's name or id: the grant covers all its versions")
    object: str | None = Field(default=None, min_length=1, max_length=64,
                               description="a standalone KMIP object's unique identifier (public or private key, "
                                           "secret data, certificate)")
    group: str | None = Field(default=None, pattern=GROUP_PATTERN, description="every object of this group")
    rights: list[Right] = Field(min_length=1, max_length=4,
                                description="read: Locate, GetAttributes; use: Encrypt, Decrypt, Sign, MAC and "
                                            "their verification; export: Get (also needs keys:export of the "
                                            "granter); destroy: Revoke, Destroy")

    @model_validator(mode="after")
    def _one_target(self) -> KmipGrantCreate:
        if sum(t is not None for t in (self.key, self.object, self.group)) != 1:
            raise ValueError("name exactly one target: key, object or group")
        return self


class KmipGrant(BaseModel):
    id: uuid.UUID
    grantee: str
    target_kind: Literal["key", "object", "group"]
    target: str = Field(description="the key's id, the object's unique identifier or the group's name")
    target_name: str
    rights: list[Right]
    created_by: str
    created_at: datetime


def grant_public(g: GrantRecord) -> KmipGrant:
    return KmipGrant(id=g.id, grantee=g.grantee, target_kind=g.target_kind,  # type: ignore[arg-type]
                     target=g.target, target_name=g.target_name, rights=g.rights,  # type: ignore[arg-type]
                     created_by=g.created_by, created_at=g.created_at)


@router.get("/groups", operation_id="listKmipGroups", response_model=list[KmipGroup])
def list_kmip_groups(ctx: Ctx, services: ServicesDep) -> list[KmipGroup]:
    """Every group a KMIP client or an object is in."""
    return [KmipGroup(name=g.name, clients=g.clients, objects=g.objects) for g in services.kmip_grants.groups(ctx)]


@router.get("/grants", operation_id="listKmipGrants", response_model=list[KmipGrant])
def list_kmip_grants(
    ctx: Ctx, services: ServicesDep,
    grantee: Annotated[str | None, Query(max_length=72, description="client:<name> or group:<name>")] = None,
    key: Annotated[str | None, Query(max_length=128, description="grants on this key (name or id)")] = None,
    group: Annotated[str | None, Query(max_length=64, description="grants on this whole group")] = None,
) -> list[KmipGrant]:
    return [grant_public(g) for g in services.kmip_grants.grants(ctx, grantee=grantee, key=key, group=group)]


@router.post("/grants", operation_id="createKmipGrant", response_model=KmipGrant, status_code=201)
def create_kmip_grant(body: KmipGrantCreate, ctx: Ctx, services: ServicesDep) -> KmipGrant:
    """Takes effect on the grantee's next KMIP request. A grant adds visibility, never a
    permission: the client's role and key-export setting still apply."""
    return grant_public(services.kmip_grants.create(ctx, grantee=body.grantee, rights=list(body.rights), key=body.key,
                                                    object=body.object, group=body.group))


@router.delete("/grants/{grant_id}", operation_id="deleteKmipGrant", status_code=204, response_class=Response)
def delete_kmip_grant(grant_id: uuid.UUID, ctx: Ctx, services: ServicesDep) -> Response:
    """Takes effect on the grantee's very next KMIP request, on every replica."""
    services.kmip_grants.delete(ctx, grant_id)
    return Response(status_code=204)
