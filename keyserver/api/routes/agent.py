"""The routes enrolled hosts call, on the agent port, authenticated by their client
certificates (docs/agents.md)."""

from __future__ import annotations

import base64
import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field, StringConstraints

from keyserver.api.deps import HostDep, ServicesDep
from keyserver.api.routes.guardpoints import GuardPointPublic, guard_point_public
from keyserver.api.schemas import MAX_INT, Strict
from keyserver.core.audit import utcnow
from keyserver.core.guardpoints import revision_tag
from keyserver.core.hosts import EVENT_NAME_RE, AgentEvent

router = APIRouter(prefix="/agent", tags=["agent"])

Short = Annotated[str, StringConstraints(max_length=1024)]
EventValue = Short | int | float | bool | None


class RekeyProgress(Strict):
    generation: int = Field(ge=0, le=MAX_INT)
    done: int = Field(ge=0, le=MAX_INT)
    total: int = Field(ge=0, le=MAX_INT)
    finished: bool


class GuardPointReport(Strict):
    id: uuid.UUID | None = Field(default=None, description="the server's guard point this is")
    revision: int | None = Field(default=None, ge=1, le=MAX_INT, description="the policy revision applied")
    path: str = Field(min_length=1, max_length=4096)
    key: str = Field(min_length=1, max_length=200, description="the managed key's name or id")
    state: Literal["mounted", "off", "unmounted", "error", "protecting", "unprotecting"]
    detail: str = Field(default="", max_length=500)
    rekey: RekeyProgress | None = None
    unprotect: RekeyProgress | None = None


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
    return [AgentKey(key_id=k.id, name=k.name, active_version=v) for k, v in services.hosts.allowed_keys(caller.host)]


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
