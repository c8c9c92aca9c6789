"""Retiring a key version (decision 0024): its inventory of use, the held retirement,
exclusions and cancelling; the list of retirements."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field

from keyserver.api.deps import Ctx, ServicesDep
from keyserver.api.schemas import MAX_INT, Strict

router = APIRouter(tags=["retirement"])
KeyRef = Annotated[str, "key UUID or name"]
Version = Annotated[int, Path(ge=1, le=MAX_INT)]
Kind = Literal["data_keys", "guard_point", "volume", "database", "xks_store", "kmip_client", "host"]


class Exclusion(BaseModel):
    kind: str
    holder: str
    reason: str
    excluded_by: str
    excluded_at: datetime


class Retirement(BaseModel):
    id: uuid.UUID
    key_id: uuid.UUID
    key: str | None
    version: int
    state: Literal["running", "complete", "cancelled"]
    reason: str
    contents: bool
    requested_by: str
    requested_at: datetime
    completed_at: datetime | None
    cancelled_at: datetime | None
    cancelled_by: str | None
    statement_seq: int | None = Field(description="the seq of its signed key.version_retired audit record")
    initial: dict[str, int] = Field(description="counts per kind when it began")
    exclusions: list[Exclusion]


class Holder(BaseModel):
    kind: Literal["data_keys", "guard_point", "volume", "database", "xks_store", "kmip_client"]
    holder: str = Field(description="what an exclusion names: `applications`, `<guard point id>@<host id>`, "
                                    "a volume's, a database grant's id, a key store's or KMIP client's name")
    name: str
    host: str | None
    count: int | None = Field(description="null where the server cannot count (in use until excluded)")
    state: Literal["in_use", "clear", "unreported", "excluded"]
    unreadable: int | None = Field(default=None, description="a guard point's files, at its last walk, whose "
                                   "header names no version of the key (damaged, or another key's): they hold "
                                   "no version of it and block nothing; the statement names them. Null for "
                                   "other kinds and for a walk that did not say")
    reported_at: datetime | None


class Inventory(BaseModel):
    key: str
    key_id: uuid.UUID
    version: int
    state: str
    in_use: bool
    computed_at: datetime
    kinds: dict[str, int]
    holders: list[Holder]
    unreported_hosts: list[str]
    retirement: Retirement | None


class RetireRequest(Strict):
    reason: str = Field(default="", max_length=1000)
    contents: bool = Field(default=False, description="also re-key every guard point on the key (new file keys, "
                                                      "contents re-encrypted), not only re-wrap headers")


class ExclusionRequest(Strict):
    kind: Kind = Field(description="a holder's kind, or `host`: every guard point and volume of a host")
    holder: str = Field(min_length=1, max_length=300, description="as the inventory names it; a host by id or name")
    reason: str = Field(min_length=1, max_length=1000, description="why it holds nothing under the version")


PREFIX = "/keys/{key_ref}/versions/{version}"


@router.get(PREFIX + "/inventory", operation_id="getVersionInventory", response_model=Inventory)
def inventory(key_ref: KeyRef, version: Version, ctx: Ctx, services: ServicesDep) -> Any:
    """Where the version is used, computed now; completes a running retirement that reached zero."""
    return services.retirement.inventory(ctx, key_ref, version)


@router.post(PREFIX + "/retire", operation_id="retireVersion", response_model=Retirement, status_code=201)
def retire(key_ref: KeyRef, version: Version, body: RetireRequest, ctx: Ctx, services: ServicesDep) -> Any:
    """Start retiring the version (held as `key.retire` under the two-person rule: 202 with the request)."""
    return services.retirement.retire(ctx, key_ref, version, reason=body.reason, contents=body.contents)


@router.delete(PREFIX + "/retire", operation_id="cancelRetirement", response_model=Retirement)
def cancel(key_ref: KeyRef, version: Version, ctx: Ctx, services: ServicesDep) -> Any:
    """Cancel a running retirement; nothing is undone."""
    return services.retirement.cancel(ctx, key_ref, version)


@router.post(PREFIX + "/retire/exclusions", operation_id="excludeRetirementHolder", response_model=Retirement,
             status_code=201)
def exclude(key_ref: KeyRef, version: Version, body: ExclusionRequest, ctx: Ctx, services: ServicesDep) -> Any:
    """Declare a holder clear of the version (held as `key.retire_exclude`)."""
    return services.retirement.exclude(ctx, key_ref, version, kind=body.kind, holder=body.holder, reason=body.reason)


@router.get("/retirements", operation_id="listRetirements", response_model=list[Retirement])
def list_retirements(ctx: Ctx, services: ServicesDep, state: Annotated[
        Literal["running", "complete", "cancelled"] | None, Query(description="only retirements in this state")] = None,
) -> Any:
    return services.retirement.list(ctx, state=state)
