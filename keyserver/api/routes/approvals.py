"""The two-person rule's requests: list, read, approve, reject (core/approvals.py)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from keyserver.api.deps import Ctx, ServicesDep
from keyserver.core.views import ApprovalView

router = APIRouter(prefix="/approvals", tags=["approvals"])
State = Literal["pending", "approved", "executed", "failed", "rejected", "expired"]


class ApprovalPublic(BaseModel):
    id: uuid.UUID
    action: str = Field(description="key.destroy, kek.rotate, kek.retire, user.role or key.export")
    target: str
    params: dict[str, Any]
    requested_by: str
    required: int = Field(description="approvals by other people it needs")
    approvals: list[dict[str, Any]] = Field(description="who approved, and when")
    state: State
    created_at: datetime
    expires_at: datetime
    decided_at: datetime | None
    result: str | None = Field(description="why an approved action failed when it ran")


class ApprovalDecision(BaseModel):
    approval: ApprovalPublic
    executed: bool = Field(description="true when this approval was the last one needed and the action ran")


def approval_public(r: ApprovalView) -> ApprovalPublic:
    return ApprovalPublic(id=r.id, action=r.action, target=r.target, params=dict(r.params or {}),
                          requested_by=r.requested_by, required=r.required, approvals=list(r.approvals or []),
                          state=r.state, created_at=r.created_at, expires_at=r.expires_at,  # type: ignore[arg-type]
                          decided_at=r.decided_at, result=r.result)


@router.get("", operation_id="listApprovals", response_model=list[ApprovalPublic])
def list_approvals(ctx: Ctx, services: ServicesDep,
                   state: Annotated[State | None, Query()] = None) -> list[ApprovalPublic]:
    return [approval_public(r) for r in services.approvals.list(ctx, state=state)]


@router.get("/{request_id}", operation_id="getApproval", response_model=ApprovalPublic)
def get_approval(request_id: uuid.UUID, ctx: Ctx, services: ServicesDep) -> ApprovalPublic:
    return approval_public(services.approvals.get(ctx, request_id))


@router.post("/{request_id}/approve", operation_id="approveRequest", response_model=ApprovalDecision)
def approve(request_id: uuid.UUID, ctx: Ctx, services: ServicesDep) -> ApprovalDecision:
    """Needs the permission the action itself needs; the requester cannot approve."""
    d = services.approvals.approve(ctx, request_id)
    return ApprovalDecision(approval=approval_public(d.request), executed=d.executed)


@router.post("/{request_id}/reject", operation_id="rejectRequest", response_model=ApprovalPublic)
def reject(request_id: uuid.UUID, ctx: Ctx, services: ServicesDep) -> ApprovalPublic:
    return approval_public(services.approvals.reject(ctx, request_id))
