"""KMIP client identities: issue (server-generated key, or from a CSR), list, change what
key material may leave to them, revoke.

The private key in a server-generated bundle is in this one response only; prefer a
CSR, so the key never leaves the client host."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, model_validator

from keyserver.api.deps import Ctx, ServicesDep
from keyserver.api.schemas import KMIP_GROUP_PATTERN as GROUP_PATTERN
from keyserver.core.kmip_groups import client_group
from keyserver.core.views import KmipClientView

router = APIRouter(prefix="/kmip/clients", tags=["kmip"])
KeyExport = Literal["plaintext", "wrapped", "none"]
GROUP_HELP = ("its KMIP tenancy group (docs/kmip.md \"Tenancy\"): it sees the group's objects and those granted "
              "to it; 1 to 64 of a-z 0-9 . _ -")
KEY_EXPORT_HELP = ("what key material KMIP Get may deliver to this client, within its role: 'plaintext' "
                   "(KMIP's behaviour), 'wrapped' (only wrapped under another key, inside the HSM) or 'none'")


class KmipClientCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, description="a DNS name; also the certificate's SAN")
    role: str = Field(description="admin, key-officer, operator, auditor, storage-admin or kmip-client")
    csr: str | None = Field(default=None, max_length=16384,
                            description="PEM PKCS#10 request; without it the server generates the key pair")
    key_export: KeyExport = Field(default="plaintext", description=KEY_EXPORT_HELP)
    group: str | None = Field(default=None, pattern=GROUP_PATTERN, description=GROUP_HELP + "; default: its name")


class KmipClientUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key_export: KeyExport | None = Field(default=None, description=KEY_EXPORT_HELP)
    group: str | None = Field(default=None, pattern=GROUP_PATTERN, description=GROUP_HELP)

    @model_validator(mode="after")
    def _something(self) -> KmipClientUpdate:
        if self.key_export is None and self.group is None:
            raise ValueError("give key_export, group or both")
        return self


class KmipClientPublic(BaseModel):
    id: uuid.UUID
    name: str
    role: str
    serial: str
    fingerprint_sha256: str
    not_after: datetime
    created_at: datetime
    created_by: str
    revoked_at: datetime | None
    key_export: KeyExport
    group: str


class KmipClientIssued(BaseModel):
    client: KmipClientPublic
    certificate_pem: str
    ca_certificate_pem: str
    private_key_pem: str | None = Field(description="only when no CSR was given; shown once")


def client_public(c: KmipClientView) -> KmipClientPublic:
    return KmipClientPublic(id=c.id, name=c.name, role=c.role, serial=c.serial,
                            fingerprint_sha256=c.fingerprint_sha256, not_after=c.not_after,
                            created_at=c.created_at, created_by=c.created_by, revoked_at=c.revoked_at,
                            key_export=c.key_export, group=client_group(c))  # type: ignore[arg-type]


@router.get("", operation_id="listKmipClients", response_model=list[KmipClientPublic])
def list_kmip_clients(ctx: Ctx, services: ServicesDep) -> list[KmipClientPublic]:
    return [client_public(c) for c in services.kmip_clients.list(ctx)]


@router.post("", operation_id="createKmipClient", response_model=KmipClientIssued, status_code=201)
def create_kmip_client(body: KmipClientCreate, ctx: Ctx, services: ServicesDep) -> KmipClientIssued:
    issued = services.kmip_clients.create(ctx, name=body.name, role=body.role, csr_pem=body.csr,
                                          key_export=body.key_export, group=body.group)
    return KmipClientIssued(client=client_public(issued.client), certificate_pem=issued.certificate_pem,
                            ca_certificate_pem=issued.ca_certificate_pem, private_key_pem=issued.private_key_pem)


@router.patch("/{client_id}", operation_id="updateKmipClient", response_model=KmipClientPublic)
def update_kmip_client(client_id: uuid.UUID, body: KmipClientUpdate, ctx: Ctx,
                       services: ServicesDep) -> KmipClientPublic:
    """Takes effect on the client's next request, on every replica."""
    return client_public(services.kmip_clients.update(ctx, client_id, key_export=body.key_export, group=body.group))


@router.delete("/{client_id}", operation_id="revokeKmipClient", response_model=KmipClientPublic)
def revoke_kmip_client(client_id: uuid.UUID, ctx: Ctx, services: ServicesDep) -> KmipClientPublic:
    """Refused at once: the serial is checked on every KMIP connection and request."""
    return client_public(services.kmip_clients.revoke(ctx, client_id))
