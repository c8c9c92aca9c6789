"""AWS KMS external key stores: each store's SigV4 credential and the managed keys AWS
KMS uses through it (the proxy API itself: routes/xks_proxy.py). Behaviour and rules:
keyserver/core/xks.py; guide: docs/integrations.md."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Response
from pydantic import BaseModel, ConfigDict, Field

from keyserver.api.deps import Ctx, ServicesDep
from keyserver.api.schemas import Page
from keyserver.core.errors import InvalidInput
from keyserver.core.xks import IssuedStore, Keep, XksKeyRecord, XksStoreRecord
from keyserver.services import Services

router = APIRouter(tags=["xks"])
StoreName = Annotated[str, Path(max_length=64, description="the external key store's name")]
ExternalId = Annotated[str, Path(max_length=128, description="the external key id AWS KMS asks for")]
PREFIX = "/xks/{name}"  # the URI path prefix of a key store's proxy API (routes/xks_proxy.py)
SUBJECT_HELP = ("when set, every call must come over the XKS port (mutual TLS) with a client certificate whose CN "
                "or a DNS name is exactly this, e.g. cks.kms.eu-west-1.amazonaws.com; null: SigV4 alone")


class XksKeyPublic(BaseModel):
    external_id: str = Field(description="the key id AWS KMS names (its XKS key id)")
    key_name: str
    key_uuid: uuid.UUID
    granted_at: datetime
    granted_by: str
    last_used_at: datetime | None


class XksStorePublic(BaseModel):
    id: uuid.UUID
    name: str
    description: str
    region: str
    access_key_id: str
    credential_issued_at: datetime
    previous_access_key_id: str | None = Field(description="the credential the last re-issue replaced, accepted "
                                                           "until retired")
    client_cert_subject: str | None = Field(description=SUBJECT_HELP)
    created_at: datetime
    created_by: str
    last_seen_at: datetime | None
    revoked_at: datetime | None
    uri_path_prefix: str = Field(description="the XKS proxy URI path prefix to enter in AWS KMS")
    keys: list[XksKeyPublic]


class XksStoreCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64,
                      description="lower-case letters, digits, '.', '_' or '-'; also the audit actor xks:<name> and "
                                  "the URI path prefix /xks/<name>")
    region: str = Field(min_length=1, max_length=32, description="the AWS region of the key store (SigV4 scope)")
    description: str = Field(default="", max_length=1000)
    client_cert_subject: str | None = Field(default=None, min_length=1, max_length=253, description=SUBJECT_HELP)


class XksStoreUpdate(BaseModel):
    """Only the fields given change; `client_cert_subject: null` turns the requirement off."""

    model_config = ConfigDict(extra="forbid")

    description: str | None = Field(default=None, max_length=1000)
    client_cert_subject: str | None = Field(default=None, min_length=1, max_length=253, description=SUBJECT_HELP)


class XksStoreIssued(BaseModel):
    store: XksStorePublic
    access_key_id: str = Field(description="the XKS proxy authentication credential's access key id")
    secret_access_key: str = Field(description="its secret access key; shown once")
    proxy_uri_endpoint: str = Field(description="the proxy URI endpoint to enter in AWS KMS")
    proxy_uri_path: str = Field(description="the proxy URI path to enter in AWS KMS (prefix + /kms/xks/v1)")


class XksKeyGrant(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=1, max_length=128, description="the managed AES-256 key's name or id")
    external_id: str | None = Field(default=None, min_length=1, max_length=128,
                                    description="the external key id AWS KMS will name (default: the key's name)")


def key_public(k: XksKeyRecord) -> XksKeyPublic:
    return XksKeyPublic(external_id=k.external_id, key_name=k.key_name, key_uuid=k.key_uuid, granted_at=k.granted_at,
                        granted_by=k.granted_by, last_used_at=k.last_used_at)


def store_public(r: XksStoreRecord) -> XksStorePublic:
    return XksStorePublic(id=r.id, name=r.name, description=r.description, region=r.region,
                          access_key_id=r.access_key_id, credential_issued_at=r.credential_issued_at,
                          previous_access_key_id=r.previous_access_key_id,
                          client_cert_subject=r.client_cert_subject, created_at=r.created_at,
                          created_by=r.created_by, last_seen_at=r.last_seen_at, revoked_at=r.revoked_at,
                          uri_path_prefix=PREFIX.format(name=r.name),
                          keys=[key_public(k) for k in r.keys])


def issued(services: Services, out: IssuedStore) -> XksStoreIssued:
    prefix = PREFIX.format(name=out.store.name)
    return XksStoreIssued(store=store_public(out.store), access_key_id=out.store.access_key_id,
                          secret_access_key=out.secret_access_key, proxy_uri_endpoint=services.settings.url,
                          proxy_uri_path=f"{prefix}/kms/xks/v1")


@router.get("/xks/stores", operation_id="listXksStores", response_model=Page[XksStorePublic])
def list_xks_stores(ctx: Ctx, services: ServicesDep) -> Page[XksStorePublic]:
    rows = services.xks.list_all(ctx)
    return Page(items=[store_public(r) for r in rows], total=len(rows), limit=len(rows), offset=0)


@router.post("/xks/stores", operation_id="createXksStore", response_model=XksStoreIssued, status_code=201)
def create_xks_store(body: XksStoreCreate, ctx: Ctx, services: ServicesDep) -> XksStoreIssued:
    """An external key store and its SigV4 credential (the secret shown once)."""
    return issued(services, services.xks.create(ctx, name=body.name, region=body.region,
                                                description=body.description,
                                                client_cert_subject=body.client_cert_subject))


@router.get("/xks/stores/{name}", operation_id="getXksStore", response_model=XksStorePublic)
def get_xks_store(name: StoreName, ctx: Ctx, services: ServicesDep) -> XksStorePublic:
    return store_public(services.xks.get(ctx, name))


@router.patch("/xks/stores/{name}", operation_id="updateXksStore", response_model=XksStorePublic)
def update_xks_store(name: StoreName, body: XksStoreUpdate, ctx: Ctx, services: ServicesDep) -> XksStorePublic:
    """Change the description or the required client certificate subject (mutual TLS)."""
    given = body.model_fields_set
    if "description" in given and body.description is None:
        raise InvalidInput("description is a string (\"\" for none)", code="invalid_description")
    return store_public(services.xks.update(
        ctx, name, description=body.description if body.description is not None else Keep.KEEP,
        client_cert_subject=body.client_cert_subject if "client_cert_subject" in given else Keep.KEEP))


@router.post("/xks/stores/{name}/credential", operation_id="rotateXksCredential", response_model=XksStoreIssued)
def rotate_xks_credential(name: StoreName, ctx: Ctx, services: ServicesDep) -> XksStoreIssued:
    """A new access key id and secret. The pair it replaces stays accepted until retired
    (update the key store's proxy authentication credential in AWS KMS, then retire it)."""
    return issued(services, services.xks.rotate_credential(ctx, name))


@router.delete("/xks/stores/{name}/credential/previous", operation_id="retireXksPreviousCredential",
               response_model=XksStorePublic)
def retire_xks_previous_credential(name: StoreName, ctx: Ctx, services: ServicesDep) -> XksStorePublic:
    """Refuse the credential the last re-issue replaced, from now on."""
    return store_public(services.xks.retire_previous(ctx, name))


@router.post("/xks/stores/{name}/revoke", operation_id="revokeXksStore", response_model=XksStorePublic)
def revoke_xks_store(name: StoreName, ctx: Ctx, services: ServicesDep) -> XksStorePublic:
    """Its credential is refused at once; every call is refused and audited."""
    return store_public(services.xks.revoke(ctx, name))


@router.post("/xks/stores/{name}/keys", operation_id="grantXksKey", response_model=XksKeyPublic, status_code=201)
def grant_xks_key(name: StoreName, body: XksKeyGrant, ctx: Ctx, services: ServicesDep) -> XksKeyPublic:
    """Let AWS KMS use a managed AES-256 key through this store (the key stays in the HSM)."""
    return key_public(services.xks.grant(ctx, name, key=body.key, external_id=body.external_id))


@router.delete("/xks/stores/{name}/keys/{external_id}", operation_id="removeXksKey", status_code=204,
               response_class=Response)
def remove_xks_key(name: StoreName, external_id: ExternalId, ctx: Ctx, services: ServicesDep) -> Response:
    services.xks.ungrant(ctx, name, external_id)
    return Response(status_code=204)
