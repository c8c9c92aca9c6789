"""The two-person rule: chosen actions wait until other people approve them.

With `STRONGROOM_APPROVALS='{"key.destroy": 2, "kek.rotate": 2, "user.role": 1}'` an
action named there does not run when asked: it becomes a pending request (202 with the
request), and runs once that many *other* people, each holding the permission the
action itself needs, have approved it. Anyone eligible may reject it; unanswered, it
expires. Every step — request, approval, rejection, execution, expiry — is audited.

The action runs with the requester's identity (its audit record names the requester
and the approvers) and is checked again when it runs: a key destroyed meanwhile, a
requester whose permission was withdrawn, and the action is refused then, not earlier.
The server's own CLI (a system actor: whoever runs it holds the HSM's PINs and the
database anyway) is not held.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from keyserver.core.audit import AuditService, utcnow
from keyserver.core.errors import Conflict, CoreError, Forbidden, NotFound
from keyserver.core.permissions import Permission
from keyserver.core.policy import Policy
from keyserver.core.principal import SYSTEM, RequestContext
from keyserver.store.models import ApprovalRequest

log = logging.getLogger(__name__)
# The actions that can be held, and the permission a requester and each approver need.
ACTIONS: dict[str, Permission] = {
    "key.destroy": Permission.KEYS_DESTROY,
    "kek.rotate": Permission.SYSTEM_KEK,
    "kek.retire": Permission.SYSTEM_KEK,
    "user.role": Permission.USERS_MANAGE,
    # Plaintext export (KMIP Get): approval grants the requester one export of that key,
    # taken by their next Get within GRANT_TTL; a KMIP Get cannot wait, so it is refused
    # with the request's id and asked again once approved.
    "key.export": Permission.KEYS_EXPORT,
}
GRANTS = frozenset({"key.export"})
DEFAULT_TTL = timedelta(hours=24)
GRANT_TTL = timedelta(hours=1)


class ApprovalPending(Forbidden):
    """The action waits for approval; `request` says which request to approve. To a
    caller who wanted it done now it is a refusal (KMIP: Permission Denied, with the
    request's id in the message); REST answers 202 with the request."""

    code = "approval_required"

    def __init__(self, request: ApprovalRequest, required: int) -> None:
        super().__init__(f"'{request.action}' needs {required} approval(s) by other people holding "
                         f"'{ACTIONS[request.action].value}'; they approve request {request.id} "
                         f"(POST /api/v1/approvals/{request.id}/approve)", code="approval_required")
        self.request = request


Executor = Callable[[RequestContext, dict[str, Any]], Any]


@dataclass(frozen=True, slots=True)
class Decision:
    request: ApprovalRequest
    executed: bool
    result: Any = None


class ApprovalService:
    def __init__(self, session_factory: sessionmaker[Session], audit: AuditService, policy: Policy,
                 *, required: dict[str, int] | None = None, ttl: timedelta = DEFAULT_TTL,
                 now: Callable[[], datetime] = utcnow) -> None:
        unknown = set(required or {}) - set(ACTIONS)
        if unknown:
            raise ValueError(f"approvals can hold {', '.join(sorted(ACTIONS))}; not {', '.join(sorted(unknown))}")
        self._db = session_factory
        self._audit = audit
        self._policy = policy
        self._required = {k: v for k, v in (required or {}).items() if v > 0}
        self._ttl = ttl
        self._now = now
        self._executors: dict[str, Executor] = {}

    def register(self, action: str, executor: Executor) -> None:
        """How a held action runs once approved (wired by services.py)."""
        self._executors[action] = executor

    def hold(self, ctx: RequestContext, *, action: str, target: str, params: dict[str, Any]) -> None:
        """Called by a service before it acts: returns when the action may run now;
        raises ApprovalPending (having recorded the request) when it must wait."""
        required = self._required.get(action)
        if not required or ctx.approval is not None or ctx.principal.actor_type == "system":
            return
        now = self._now()
        with self._db() as s:  # asking again while a request waits: that request, not a new one
            waiting = s.execute(select(ApprovalRequest).where(
                ApprovalRequest.action == action, ApprovalRequest.target == target,
                ApprovalRequest.requested_by == ctx.principal.name, ApprovalRequest.state == "pending",
                ApprovalRequest.expires_at > now)).scalars().first()
        if waiting is not None:
            raise ApprovalPending(waiting, required)
        req = ApprovalRequest(
            id=uuid.uuid4(), action=action, target=target, params=params, requested_by=ctx.principal.name,
            requester_user_id=ctx.principal.user_id, required=required, approvals=[], state="pending",
            created_at=now, expires_at=now + self._ttl)
        with self._db.begin() as s:
            s.add(req)
            self._audit.add(s, ctx, action="approval.request", object_type="approval", object_id=str(req.id),
                            details={"action": action, "target": target, "required": required})
        raise ApprovalPending(req, required)

    def _load(self, s: Session, request_id: uuid.UUID, *, lock: bool = False) -> ApprovalRequest:
        stmt = select(ApprovalRequest).where(ApprovalRequest.id == request_id)
        req = s.execute(stmt.with_for_update() if lock else stmt).scalar_one_or_none()
        if req is None:
            raise NotFound(f"no approval request {request_id}", code="approval_not_found")
        return req

    def _eligible(self, ctx: RequestContext, req: ApprovalRequest, verb: str) -> None:
        self._policy.require(ctx, ACTIONS[req.action], action=f"approval.{verb}", object_type="approval",
                             object_id=str(req.id))
        same = (ctx.principal.user_id is not None and ctx.principal.user_id == req.requester_user_id) or \
            ctx.principal.name.split("/token:")[0] == req.requested_by.split("/token:")[0]
        if same:
            self._audit.record_now(ctx, action=f"approval.{verb}", outcome="denied", object_type="approval",
                                   object_id=str(req.id), details={"reason": "own_request"})
            raise Forbidden("the requester cannot approve or reject their own request: another person must",
                            code="own_request")

    def _expire(self, s: Session, req: ApprovalRequest) -> bool:
        if req.state == "pending" and req.expires_at <= self._now():
            req.state, req.decided_at = "expired", self._now()
            return True
        return False

    def _may_decide(self, ctx: RequestContext, verb: str, request_id: uuid.UUID) -> None:
        """Only someone who could be an approver of some held action may look a request up."""
        if not any(p in ctx.principal.permissions for p in ACTIONS.values()):
            self._policy.deny(ctx, action=f"approval.{verb}", object_type="approval", object_id=str(request_id),
                              details={"reason": "not_an_approver"},
                              message="deciding on approval requests needs the permission of a held action ("
                                      + ", ".join(sorted(p.value for p in ACTIONS.values())) + ")")

    def approve(self, ctx: RequestContext, request_id: uuid.UUID) -> Decision:
        self._may_decide(ctx, "approve", request_id)
        with self._db() as s:
            req = self._load(s, request_id)
        self._eligible(ctx, req, "approve")
        with self._db.begin() as s:
            req = self._load(s, request_id, lock=True)
            if self._expire(s, req):
                self._audit.add(s, ctx, action="approval.expire", object_type="approval", object_id=str(req.id))
            if req.state != "pending":
                raise Conflict(f"request {req.id} is {req.state}; only a pending request can be approved",
                               code="approval_closed")
            who = ctx.principal.name.split("/token:")[0]
            if any(a["by"] == who for a in req.approvals):
                raise Conflict("you approved this request already; another person must", code="approval_repeated")
            req.approvals = [*req.approvals, {"by": who, "at": self._now().isoformat()}]
            ready = len(req.approvals) >= req.required
            if ready:
                req.state = "approved"
            self._audit.add(s, ctx, action="approval.approve", object_type="approval", object_id=str(req.id),
                            details={"action": req.action, "target": req.target, "approvals": len(req.approvals),
                                     "required": req.required})
        if not ready:
            return Decision(req, executed=False)
        return self._execute(req)

    def holds(self, action: str) -> bool:
        return action in self._required

    def take_grant(self, ctx: RequestContext, *, action: str, target: str) -> bool:
        """Use up an approved grant of `action` on `target` for this caller (one use,
        within GRANT_TTL of its approval); False when there is none."""
        now = self._now()
        with self._db.begin() as s:
            grant = s.execute(select(ApprovalRequest).where(
                ApprovalRequest.action == action, ApprovalRequest.target == target,
                ApprovalRequest.requested_by == ctx.principal.name, ApprovalRequest.state == "executed",
                ApprovalRequest.result.is_(None), ApprovalRequest.decided_at > now - GRANT_TTL)
                .order_by(ApprovalRequest.decided_at).limit(1).with_for_update()).scalars().first()
            if grant is None:
                return False
            grant.result = f"used {now.isoformat()}"
            self._audit.add(s, ctx, action="approval.use", object_type="approval", object_id=str(grant.id),
                            details={"action": action, "target": target})
        return True

    def _execute(self, req: ApprovalRequest) -> Decision:
        """Run the approved action as the requester (checked again now); for a grant
        (plaintext export), record it for the requester's next request."""
        approvers = [a["by"] for a in req.approvals]
        if req.action in GRANTS:
            with self._db.begin() as s:
                row = self._load(s, req.id, lock=True)
                row.state, row.decided_at = "executed", self._now()
                self._audit.add(s, RequestContext(principal=SYSTEM, approval=str(req.id)), action="approval.execute",
                                object_type="approval", object_id=str(req.id),
                                details={"action": req.action, "target": req.target, "approvers": approvers,
                                         "grant_for": req.requested_by})
            return Decision(row, executed=True)
        executor = self._executors[req.action]
        ctx = RequestContext(principal=self._requester(req), approval=str(req.id))
        try:
            result = executor(ctx, dict(req.params))
        except CoreError as exc:
            with self._db.begin() as s:
                row = self._load(s, req.id, lock=True)
                row.state, row.decided_at, row.result = "failed", self._now(), exc.message[:1000]
                self._audit.add(s, ctx, action="approval.execute", outcome="error", object_type="approval",
                                object_id=str(req.id), details={"action": req.action, "reason": exc.code,
                                                                 "approvers": approvers})
            raise
        with self._db.begin() as s:
            row = self._load(s, req.id, lock=True)
            row.state, row.decided_at = "executed", self._now()
            self._audit.add(s, ctx, action="approval.execute", object_type="approval", object_id=str(req.id),
                            details={"action": req.action, "target": req.target, "approvers": approvers})
            req = row
        return Decision(req, executed=True, result=result)

    def _requester(self, req: ApprovalRequest) -> Any:
        """The requester's principal as it is now (role changes and disabling count)."""
        from keyserver.core.permissions import permissions_for
        from keyserver.core.principal import Principal
        from keyserver.store.models import User

        if req.requester_user_id is None:
            raise Conflict("the requester is not a user any more; ask again", code="approval_requester_gone")
        with self._db() as s:
            user = s.get(User, req.requester_user_id)
        if user is None or user.disabled:
            raise Conflict("the requester's account is disabled or gone; ask again", code="approval_requester_gone")
        return Principal(name=user.username, actor_type="user", role=user.role,
                         permissions=permissions_for(user.role), user_id=user.id)

    def reject(self, ctx: RequestContext, request_id: uuid.UUID) -> ApprovalRequest:
        self._may_decide(ctx, "reject", request_id)
        with self._db() as s:
            req = self._load(s, request_id)
        self._eligible(ctx, req, "reject")
        with self._db.begin() as s:
            req = self._load(s, request_id, lock=True)
            self._expire(s, req)
            if req.state != "pending":
                raise Conflict(f"request {req.id} is {req.state}; only a pending request can be rejected",
                               code="approval_closed")
            req.state, req.decided_at = "rejected", self._now()
            req.approvals = [*req.approvals]
            self._audit.add(s, ctx, action="approval.reject", object_type="approval", object_id=str(req.id),
                            details={"action": req.action, "target": req.target})
        return req

    def _may_read(self, ctx: RequestContext) -> None:
        if not any(p in ctx.principal.permissions for p in ACTIONS.values()):
            self._policy.require(ctx, Permission.AUDIT_READ, action="approval.list")

    def get(self, ctx: RequestContext, request_id: uuid.UUID) -> ApprovalRequest:
        self._may_read(ctx)
        with self._db.begin() as s:
            req = self._load(s, request_id)
            self._expire(s, req)
        return req

    def list(self, ctx: RequestContext, *, state: str | None = None) -> list[ApprovalRequest]:
        self._may_read(ctx)
        with self._db.begin() as s:
            rows = list(s.execute(select(ApprovalRequest).order_by(ApprovalRequest.created_at.desc())
                                  .limit(200)).scalars())
            for r in rows:
                self._expire(s, r)
        return [r for r in rows if state is None or r.state == state]

    @property
    def required(self) -> dict[str, int]:
        return dict(self._required)
