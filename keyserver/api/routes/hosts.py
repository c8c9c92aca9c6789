from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from keyserver.api.deps import Ctx, ServicesDep, client_ip
from keyserver.api.schemas import MAX_INT, Page, Strict
from keyserver.core.hosts import TOKEN_PREFIX
from keyserver.core.views import EnrollmentTokenView, HostRecord
from keyserver.logs import request_id_var
from keyserver.services import Services

router = APIRouter(tags=["hosts"])


class EnrollmentTokenCreate(Strict):
    host_group: str = Field(min_length=1, max_length=64, examples=["db-servers"])
    max_uses: int = Field(default=1, ge=1, le=10_000)
    expires_in_hours: int = Field(default=24, ge=1, le=720)


class EnrollmentTokenPublic(BaseModel):
    id: uuid.UUID
    prefix: str
    host_group: str
    max_uses: int
    uses: int
    created_by: str
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None


class EnrollmentTokenCreated(BaseModel):
    token: EnrollmentTokenPublic
    secret: str = Field(description="the token; shown only once")


class EnrollRequest(Strict):
    token: str = Field(min_length=1, max_length=200)
    csr_pem: str = Field(min_length=1, max_length=16_384, description="PEM CSR of the host's own RSA key")
    hostname: str = Field(min_length=1, max_length=253)
    os: str = Field(default="", max_length=200)
    agent_version: str = Field(default="", max_length=64)


class EnrollResponse(BaseModel):
    host_id: uuid.UUID
    host_group: str
    certificate_pem: str
    ca_pem: str


class HostRekeyProgress(BaseModel):
    generation: int
    done: int
    total: int
    finished: bool


class HostGuardPoint(BaseModel):
    id: uuid.UUID | None = None
    revision: int | None = None
    path: str
    key: str
    state: Literal["mounted", "off", "unmounted", "error", "protecting", "unprotecting"]
    detail: str = ""
    rekey: HostRekeyProgress | None = None
    unprotect: HostRekeyProgress | None = None


class HostPublic(BaseModel):
    id: uuid.UUID
    hostname: str
    host_group: str
    os: str
    agent_version: str
    cert_serial: str
    state: Literal["active", "revoked"]
    enrolled_at: datetime
    last_heartbeat_at: datetime | None
    revoked_at: datetime | None
    last_seen_ip: str | None
    guard_points: list[HostGuardPoint] = Field(description="as the agent last reported them")
    online: bool = Field(description="active, with a heartbeat within three heartbeat intervals")


class HostPage(Page[HostPublic]):
    counts: dict[str, int] = Field(description="hosts per status (online, offline, revoked) over the other filters")
    groups: list[str] = Field(description="every host group with hosts")


class HeartbeatHour(BaseModel):
    hour: datetime
    count: int


def host_public(h: HostRecord, services: Services) -> HostPublic:
    return HostPublic.model_validate({**{c: getattr(h, c) for c in _HOST_COLUMNS},
                                      "online": services.hosts.is_online(h)})


_HOST_COLUMNS = [f for f in HostPublic.model_fields if f != "online"]


def token_public(t: EnrollmentTokenView) -> EnrollmentTokenPublic:
    return EnrollmentTokenPublic(id=t.id, prefix=f"{TOKEN_PREFIX}{t.lookup_id}", host_group=t.host_group,
                                 max_uses=t.max_uses, uses=t.uses, created_by=t.created_by,
                                 created_at=t.created_at, expires_at=t.expires_at, revoked_at=t.revoked_at)


@router.post("/enrollment-tokens", operation_id="createEnrollmentToken", response_model=EnrollmentTokenCreated,
             status_code=201)
def create_enrollment_token(body: EnrollmentTokenCreate, ctx: Ctx, services: ServicesDep) -> EnrollmentTokenCreated:
    issued = services.hosts.create_token(ctx, host_group=body.host_group, max_uses=body.max_uses,
                                         expires_in_hours=body.expires_in_hours)
    return EnrollmentTokenCreated(token=token_public(issued.token), secret=issued.secret)


@router.get("/enrollment-tokens", operation_id="listEnrollmentTokens", response_model=list[EnrollmentTokenPublic])
def list_enrollment_tokens(ctx: Ctx, services: ServicesDep) -> list[EnrollmentTokenPublic]:
    return [token_public(t) for t in services.hosts.list_tokens(ctx)]


@router.delete("/enrollment-tokens/{token_id}", operation_id="revokeEnrollmentToken",
               response_model=EnrollmentTokenPublic)
def revoke_enrollment_token(token_id: uuid.UUID, ctx: Ctx, services: ServicesDep) -> EnrollmentTokenPublic:
    return token_public(services.hosts.revoke_token(ctx, token_id))


@router.post("/enroll", operation_id="enrollHost", response_model=EnrollResponse, status_code=201)
def enroll(body: EnrollRequest, request: Request, services: ServicesDep) -> EnrollResponse:
    """Called by the agent installer with a one-time token: no session, no API token."""
    e = services.hosts.enroll(token=body.token, csr_pem=body.csr_pem, hostname=body.hostname, os_name=body.os,
                              agent_version=body.agent_version, source_ip=client_ip(request),
                              request_id=request_id_var.get())
    return EnrollResponse(host_id=e.host.id, host_group=e.host.host_group,
                          certificate_pem=e.certificate_pem.decode(), ca_pem=e.ca_pem.decode())


@router.get("/hosts", operation_id="listHosts", response_model=HostPage)
def list_hosts(
    ctx: Ctx, services: ServicesDep,
    q: Annotated[str | None, Query(max_length=128, description="substring of hostname, group, address or OS")] = None,
    group: Annotated[str | None, Query(max_length=64)] = None,
    status: Annotated[Literal["online", "offline", "revoked"] | None, Query()] = None,
    sort: Annotated[str, Query(max_length=32, description="hostname, host_group, enrolled_at, last_heartbeat_at "
                                                          "or agent_version; '-' first for descending")] = "hostname",
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
) -> HostPage:
    page = services.hosts.list_hosts(ctx, q=q, group=group, status=status, sort=sort, limit=limit, offset=offset)
    return HostPage(items=[host_public(h, services) for h in page.hosts], total=page.total, limit=limit,
                    offset=offset, counts=page.counts, groups=page.groups)


@router.get("/hosts/{host_id}/heartbeats", operation_id="getHostHeartbeats", response_model=list[HeartbeatHour])
def host_heartbeats(
    host_id: uuid.UUID, ctx: Ctx, services: ServicesDep,
    since: Annotated[datetime, Query(description="start, with a time zone; rounded down to the hour")],
    until: Annotated[datetime, Query(description="end (exclusive), at most 31 days after since")],
) -> list[HeartbeatHour]:
    """Heartbeats per hour, every hour of the range: the host's online timeline."""
    return [HeartbeatHour(hour=h, count=n) for h, n in services.hosts.heartbeats(ctx, host_id, since=since,
                                                                                  until=until)]


@router.get("/hosts/{host_id}", operation_id="getHost", response_model=HostPublic)
def get_host(host_id: uuid.UUID, ctx: Ctx, services: ServicesDep) -> HostPublic:
    return host_public(services.hosts.get_host(ctx, host_id), services)


@router.post("/hosts/{host_id}/revoke", operation_id="revokeHost", response_model=HostPublic)
def revoke_host(host_id: uuid.UUID, ctx: Ctx, services: ServicesDep) -> HostPublic:
    return host_public(services.hosts.revoke_host(ctx, host_id), services)
