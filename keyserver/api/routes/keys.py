from __future__ import annotations

import base64
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from keyserver.api.deps import Ctx, ServicesDep
from keyserver.api.schemas import (
    MAX_INT,
    DataKeyPublic,
    DestroyRequest,
    GenerateDataKeyRequest,
    KeyCreate,
    KeyPublic,
    KeyUpdate,
    KeyVersionPublic,
    Page,
    RevokeRequest,
)
from keyserver.core.datakeys import DataKey
from keyserver.core.keys import KeySpec, key_state
from keyserver.core.views import KeyView

router = APIRouter(prefix="/keys", tags=["keys"])
KeyRef = Annotated[str, "key UUID or name"]


def key_public(k: KeyView) -> KeyPublic:
    versions = []
    for v in k.versions:
        pv = KeyVersionPublic.model_validate(v)
        pv.replaces = v.version - 1 if v.version > 1 else None
        pv.replaced_by = v.version + 1 if v.version < len(k.versions) else None
        versions.append(pv)
    return KeyPublic(
        id=k.id, name=k.name, description=k.description, owner=k.owner, tags=k.tags,
        algorithm=k.algorithm, length_bits=k.length_bits, state=key_state(k).value,
        current_version=k.versions[-1].version, created_at=k.created_at, updated_at=k.updated_at,
        rotation_period_days=k.rotation_period_days, next_rotation_at=k.next_rotation_at,
        exportable=k.exportable, kmip_group=k.kmip_group, versions=versions,
    )


@router.get("", operation_id="listKeys", response_model=Page[KeyPublic])
def list_keys(
    ctx: Ctx, services: ServicesDep,
    q: Annotated[str | None, Query(max_length=128, description="substring of name or description")] = None,
    state: Annotated[str | None, Query(description="state of the current version")] = None,
    tag: Annotated[str | None, Query(max_length=200, description="tag name or name=value")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
    sort: Annotated[str, Query(max_length=32, description="name, owner, created_at, updated_at or next_rotation_at; "
                                                          "'-' first for descending (keys with no rotation "
                                                          "scheduled come last)")] = "name",
) -> Page[KeyPublic]:
    rows, total = services.keys.list(ctx, q=q, state=state, tag=tag, limit=limit, offset=offset, sort=sort)
    return Page(items=[key_public(k) for k in rows], total=total, limit=limit, offset=offset)


@router.post("", operation_id="createKey", response_model=KeyPublic, status_code=201)
def create_key(body: KeyCreate, ctx: Ctx, services: ServicesDep) -> KeyPublic:
    return key_public(services.keys.create(ctx, KeySpec(**body.model_dump())))


@router.get("/{key_ref}", operation_id="getKey", response_model=KeyPublic)
def get_key(key_ref: KeyRef, ctx: Ctx, services: ServicesDep) -> KeyPublic:
    return key_public(services.keys.get(ctx, key_ref))


@router.patch("/{key_ref}", operation_id="updateKey", response_model=KeyPublic)
def update_key(key_ref: KeyRef, body: KeyUpdate, ctx: Ctx, services: ServicesDep) -> KeyPublic:
    return key_public(services.keys.update(
        ctx, key_ref, description=body.description, tags=body.tags, owner=body.owner,
        rotation_period_days=body.rotation_period_days, clear_rotation=body.clear_rotation,
        exportable=body.exportable, set_kmip_group="kmip_group" in body.model_fields_set,
        kmip_group=body.kmip_group))


@router.post("/{key_ref}/rotate", operation_id="rotateKey", response_model=KeyPublic)
def rotate_key(key_ref: KeyRef, ctx: Ctx, services: ServicesDep) -> KeyPublic:
    return key_public(services.keys.rotate(ctx, key_ref))


@router.post("/{key_ref}/activate", operation_id="activateKey", response_model=KeyPublic)
def activate_key(key_ref: KeyRef, ctx: Ctx, services: ServicesDep) -> KeyPublic:
    return key_public(services.keys.activate(ctx, key_ref))


@router.post("/{key_ref}/deactivate", operation_id="deactivateKey", response_model=KeyPublic)
def deactivate_key(key_ref: KeyRef, ctx: Ctx, services: ServicesDep) -> KeyPublic:
    return key_public(services.keys.deactivate(ctx, key_ref))


@router.post("/{key_ref}/revoke", operation_id="revokeKey", response_model=KeyPublic)
def revoke_key(key_ref: KeyRef, body: RevokeRequest, ctx: Ctx, services: ServicesDep) -> KeyPublic:
    return key_public(services.keys.revoke(ctx, key_ref, reason=body.reason, message=body.message,
                                           compromise_date=body.compromise_date))


@router.post("/{key_ref}/destroy", operation_id="destroyKey", response_model=KeyPublic)
def destroy_key(key_ref: KeyRef, body: DestroyRequest, ctx: Ctx, services: ServicesDep) -> KeyPublic:
    return key_public(services.keys.destroy(ctx, key_ref, version=body.version, shred=body.shred))


@router.post("/{key_ref}/generate-data-key", operation_id="generateDataKey", response_model=DataKeyPublic)
def generate_data_key(key_ref: KeyRef, body: GenerateDataKeyRequest, ctx: Ctx,
                      services: ServicesDep) -> JSONResponse:
    # Most calls are answered before they reach this function, by the API's hot path
    # (keyserver/api/hotpath.py); it serves the rest: the first call of a token or for a
    # key, sessions, refusals.
    dk = services.datakeys.generate(ctx, key_ref, number_of_bytes=body.number_of_bytes,
                                    context=body.context, include_plaintext=body.include_plaintext)
    return JSONResponse(data_key_body(dk))


def data_key_body(dk: DataKey) -> dict[str, Any]:
    """The response, built directly in the shape of DataKeyPublic (the declared response
    model): the hottest route saves re-validating what it just made."""
    return {
        "key_id": str(dk.key_id), "key_name": dk.key_name, "key_version": dk.key_version,
        "ciphertext_blob": base64.b64encode(dk.blob).decode(),
        "plaintext": base64.b64encode(dk.plaintext).decode() if dk.plaintext is not None else None,
    }
