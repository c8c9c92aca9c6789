from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field, StringConstraints

from keyserver.api.deps import Ctx, ServicesDep
from keyserver.api.schemas import Strict
from keyserver.core.guardpoints import GuardPointSpec
from keyserver.core.views import GuardPointView

router = APIRouter(prefix="/guard-points", tags=["guard points"])

Name = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")]
Exe = Annotated[str, StringConstraints(min_length=2, max_length=1024, pattern=r"^/")]


class RuleModel(Strict):
    """Who (users, uids, groups: any listed matches; an empty list matches everyone),
    which program (absolute executable paths), what access, and the effect. First
    matching rule wins."""

    effect: Literal["permit", "deny"]
    users: list[Name] = Field(default_factory=list, max_length=64)
    uids: list[Annotated[int, Field(ge=0, lt=2**32)]] = Field(default_factory=list, max_length=64)
    groups: list[Name] = Field(default_factory=list, max_length=64)
    executables: list[Exe] = Field(default_factory=list, max_length=64)
    access: Literal["read", "write", "all"] = "all"
    audit: bool = Field(default=False, description="record permitted accesses too (denials always are)")


class GuardPointIn(Strict):
    host_group: str | None = Field(default=None, max_length=64, description="every host of this group…")
    host_id: uuid.UUID | None = Field(default=None, description="…or one host")
    path: str = Field(min_length=2, max_length=1024, examples=["/srv/postgres"])
    backing_path: str | None = Field(default=None, max_length=1024,
                                     description="where the ciphertext lives; default: /parent/.name.strongroom")
    key: str = Field(min_length=1, max_length=128, description="managed key name or id")
    chunk_size: int = Field(default=4096, ge=512, le=1 << 20)
    mode: Literal["enforce", "learn", "off"] = Field(
        default="enforce", description="learn: allow everything, audit what enforce would deny; off: encryption "
        "off, the path shows the backing files as stored (ciphertext stays ciphertext, new files are written in "
        "clear and encrypted when the mode returns to enforce or learn)")
    rules: list[RuleModel] = Field(default_factory=list, max_length=64)
    default_effect: Literal["permit", "deny"] = "deny"


class GuardPointPublic(BaseModel):
    id: uuid.UUID
    host_group: str | None
    host_id: uuid.UUID | None
    path: str
    backing_path: str
    key_id: uuid.UUID
    key_name: str
    chunk_size: int
    mode: str
    rules: list[RuleModel]
    default_effect: str
    revision: int
    rekey_generation: int = Field(description="bumped by each re-key request")
    unprotect_generation: int = Field(description="bumped by each unprotect request")
    created_by: str
    created_at: datetime
    updated_at: datetime


def guard_point_public(gp: GuardPointView, key_name: str) -> GuardPointPublic:
    return GuardPointPublic(id=gp.id, host_group=gp.host_group, host_id=gp.host_id, path=gp.path,
                            backing_path=gp.backing_path, key_id=gp.key_id, key_name=key_name,
                            chunk_size=gp.chunk_size, mode=gp.mode, rules=[RuleModel(**r) for r in gp.rules],
                            default_effect=gp.default_effect, revision=gp.revision,
                            rekey_generation=gp.rekey_generation,
                            unprotect_generation=gp.unprotect_generation, created_by=gp.created_by,
                            created_at=gp.created_at, updated_at=gp.updated_at)


def _spec(body: GuardPointIn) -> GuardPointSpec:
    return GuardPointSpec(path=body.path, key=body.key, host_group=body.host_group, host_id=body.host_id,
                          backing_path=body.backing_path, chunk_size=body.chunk_size, mode=body.mode,
                          rules=tuple(r.model_dump() for r in body.rules), default_effect=body.default_effect)


@router.get("", operation_id="listGuardPoints", response_model=list[GuardPointPublic])
def list_guard_points(ctx: Ctx, services: ServicesDep) -> list[GuardPointPublic]:
    return [guard_point_public(gp, name) for gp, name in services.guard_points.list_all(ctx)]


@router.post("", operation_id="createGuardPoint", response_model=GuardPointPublic, status_code=201)
def create_guard_point(body: GuardPointIn, ctx: Ctx, services: ServicesDep) -> GuardPointPublic:
    gp = services.guard_points.create(ctx, _spec(body))
    return guard_point_public(*services.guard_points.get(ctx, gp.id))


@router.get("/{gp_id}", operation_id="getGuardPoint", response_model=GuardPointPublic)
def get_guard_point(gp_id: uuid.UUID, ctx: Ctx, services: ServicesDep) -> GuardPointPublic:
    return guard_point_public(*services.guard_points.get(ctx, gp_id))


@router.put("/{gp_id}", operation_id="updateGuardPoint", response_model=GuardPointPublic)
def update_guard_point(gp_id: uuid.UUID, body: GuardPointIn, ctx: Ctx, services: ServicesDep) -> GuardPointPublic:
    """Replace mode, rules, default and chunk size (for new files); agents apply it live.
    Path, backing path and key are fixed."""
    services.guard_points.update(ctx, gp_id, _spec(body))
    return guard_point_public(*services.guard_points.get(ctx, gp_id))


@router.post("/{gp_id}/rekey", operation_id="rekeyGuardPoint", response_model=GuardPointPublic, status_code=202)
def rekey_guard_point(gp_id: uuid.UUID, ctx: Ctx, services: ServicesDep) -> GuardPointPublic:
    """Re-encrypt every existing file under fresh file keys, online; hosts report progress
    in their guard points (`rekey`)."""
    services.guard_points.request_rekey(ctx, gp_id)
    return guard_point_public(*services.guard_points.get(ctx, gp_id))


@router.post("/{gp_id}/unprotect", operation_id="unprotectGuardPoint", response_model=GuardPointPublic,
             status_code=202)
def unprotect_guard_point(gp_id: uuid.UUID, ctx: Ctx, services: ServicesDep) -> GuardPointPublic:
    """Decrypt every file in place in the backing directory (mode off only: 409 otherwise);
    hosts report progress in their guard points (`unprotect`). Deleting the guard point
    afterwards moves the plaintext back to its path."""
    services.guard_points.request_unprotect(ctx, gp_id)
    return guard_point_public(*services.guard_points.get(ctx, gp_id))


@router.delete("/{gp_id}", operation_id="deleteGuardPoint", status_code=204)
def delete_guard_point(gp_id: uuid.UUID, ctx: Ctx, services: ServicesDep) -> None:
    """Agents unmount it; the ciphertext stays in the backing directory (an unprotected
    guard point's plaintext is moved back to its path)."""
    services.guard_points.delete(ctx, gp_id)
