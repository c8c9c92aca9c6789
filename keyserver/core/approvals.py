"""The two-person rule: chosen actions wait until other people approve them.

With `STRONGROOM_APPROVALS='{"key.destroy": 2, "kek.rotate": 2, "user.role": 1}'` an
action named there does not run when asked: it becomes a pending request (202 with the
request), and runs once that many *other* people, each holding the permission the
action itself needs, have approved it. Anyone eligible may reject it; unanswered, it
expires. Every step — request, approval, rejection, execution, expiry — is audited.

The action runs with the requester's identity (its audit record names the requester
and the approvers) and is checked again when it runs: a key destroyed meanwhile, a
requester whose permission was withdrawn, and the action is refused then, not earlier.
A KMIP client's request runs as that client (its certificate must still be valid).
The server's own CLI (a system actor: whoever runs it holds the HSM's PINs and the
database anyway) is not held.

Whoever can change who approves can defeat the rule, so once any action is held the
changes of who may approve are held too (PRIVILEGE_ACTIONS, one approval unless
configured): an API token for someone else's account, creating an account of a role
that may approve, changing such a role, resetting such a user's password or second
factor. And an approval counts only from a *person* (`_eligible`, the one place every
path ends in): a user signed in, not an API token, a KMIP client or the CLI; whose
account existed before the request; who did not create or change the requester's
account's role or credentials, nor had theirs created or changed by the requester
(either knew the other's password at some point). The audit trail is the record of
who did that; it is read (chained first) when someone approves.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session, sessionmaker

from keyserver.core.audit import AuditService, utcnow
from keyserver.core.errors import Conflict, CoreError, Forbidden, NotFound
from keyserver.core.kmip_groups import client_group
from keyserver.core.permissions import ROLE_PERMISSIONS, Permission, Role
from keyserver.core.policy import Policy
from keyserver.core.principal import SYSTEM, RequestContext
from keyserver.store.models import ApprovalRequest, AuditEvent, KmipClient, User

log = logging.getLogger(__name__)
# The actions that can be held, and the permission a requester and each approver need.
ACTIONS: dict[str, Permission] = {
    "key.destroy": Permission.KEYS_DESTROY,
    # Retiring a key version, and declaring a holder clear of it (decision 0024).
    "key.retire": Permission.KEYS_DESTROY,
    "key.retire_exclude": Permission.KEYS_DESTROY,
    "kek.rotate": Permission.SYSTEM_KEK,
    "kek.retire": Permission.SYSTEM_KEK,
    "user.role": Permission.USERS_MANAGE,
    # Plaintext export (KMIP Get): approval grants the requester one export of that key,
    # taken by their next Get within GRANT_TTL; a KMIP Get cannot wait, so it is refused
    # with the request's id and asked again once approved.
    "key.export": Permission.KEYS_EXPORT,
    # A key granted to a database (core/integrations.py) leaves in plaintext at each read.
    "database.grant": Permission.KEYS_EXPORT,
}
# Who may approve changes of who may approve: held as soon as the two-person rule is
# on at all, with one approval unless STRONGROOM_APPROVALS names them.
PRIVILEGE_ACTIONS: dict[str, Permission] = {
    "token.create": Permission.TOKENS_ALL,  # an API token for another account
    "user.create": Permission.USERS_MANAGE,  # an account of a role that may approve
    "user.password": Permission.USERS_MANAGE,  # another approver's password reset
    "user.totp": Permission.USERS_MANAGE,  # another approver's second factor removed
}
ACTIONS.update(PRIVILEGE_ACTIONS)
# Approval grants the requester one go, taken by asking again within GRANT_TTL: the
# action hands back a secret (a token, a one-time password) only its requester may see.
GRANTS = frozenset({"key.export", "token.create", "user.create", "user.password"})
# Roles whose holders may approve something (programs' kmip-client role never may).
APPROVER_ROLES = frozenset(r.value for r in Role if r is not Role.KMIP_CLIENT
                           and any(p in ROLE_PERMISSIONS[r] for p in ACTIONS.values()))
# What an account's controller did to it: creating it, or setting its role or credentials.
_CONTROL_ACTIONS = ("user.create", "user.update", "user.reset_password", "user.totp_reset")
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
        configured = dict(required or {})
        if any(v > 0 for v in configured.values()):
            for action in PRIVILEGE_ACTIONS.keys() | {"user.role"}:
                configured.setdefault(action, 1)
        self._required = {k: v for k, v in configured.items() if v > 0}
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
        if action in PRIVILEGE_ACTIONS and action in GRANTS and \
                self.take_grant(ctx, action=action, target=target, params=params):
            return
        now = self._now()
        with self._db() as s:  # asking again while a request waits: that request, not a new one
            waiting = next((r for r in s.execute(select(ApprovalRequest).where(
                ApprovalRequest.action == action, ApprovalRequest.target == target,
                ApprovalRequest.requested_by == ctx.principal.name, ApprovalRequest.state == "pending",
                ApprovalRequest.expires_at > now)).scalars()
                if action not in PRIVILEGE_ACTIONS or r.params == params), None)
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
        """The one rule every approval and rejection passes, whichever door it came in by."""
        self._policy.require(ctx, ACTIONS[req.action], action=f"approval.{verb}", object_type="approval",
                             object_id=str(req.id))
        refusal = self._not_independent(ctx, req)
        if refusal is not None:
            code, message = refusal
            self._audit.record_now(ctx, action=f"approval.{verb}", outcome="denied", object_type="approval",
                                   object_id=str(req.id), details={"reason": code, "action": req.action,
                                                                    "requested_by": req.requested_by})
            raise Forbidden(message, code=code)

    def _not_independent(self, ctx: RequestContext, req: ApprovalRequest) -> tuple[str, str] | None:
        """Why the caller does not count as another person for `req` (code, message), or None."""
        p = ctx.principal
        requester = req.requested_by.split("/token:")[0]
        if (p.user_id is not None and p.user_id == req.requester_user_id) or p.name.split("/token:")[0] == requester:
            return "own_request", "the requester cannot approve or reject their own request: another person must"
        if p.actor_type != "user" or p.user_id is None:
            # A token or a certificate can be handed to anyone, the CLI is whoever has the server.
            return "approver_not_a_person", ("approvals come from people signed in to the console or the API with "
                                             "their password: not from an API token, a KMIP client or the CLI")
        with self._db() as s:
            user = s.get(User, p.user_id)
        if user is None or user.disabled or user.role not in APPROVER_ROLES:
            return "approver_not_a_person", f"'{p.name}' is a program's or a disabled account: it cannot decide"
        if user.must_change_password:
            return "approver_password_pending", ("your password was set by someone else: change it (POST "
                                                 "/api/v1/auth/password) before deciding on requests")
        if user.created_at >= req.created_at:
            return "approver_too_new", ("your account was created after this request: only people whose accounts "
                                        "existed when it was made may decide on it")
        if self._controls(user.username, requester) or self._controls(requester, user.username):
            return "approver_not_independent", (
                f"'{user.username}' and '{requester}' are not independent: one of them created the other's account "
                "or set its role, password or second factor (or made the KMIP client), so one person may hold "
                "both; someone else must decide")
        return None

    def _controls(self, actor: str, account: str) -> bool:
        """Whether `actor` (a user, with any of their tokens) ever created `account` or set
        its role or credentials, by the audit trail; `account` may be a KMIP client's."""
        if account.startswith("kmip:"):
            with self._db() as s:
                made_by = s.execute(select(KmipClient.created_by).where(
                    KmipClient.name == account[len("kmip:"):])).scalar_one_or_none()
            return made_by is not None and made_by.split("/token:")[0] == actor
        self._audit.flush()  # the latest records too: a reset a moment ago counts
        who = or_(AuditEvent.actor == actor, AuditEvent.actor.startswith(f"{actor}/token:", autoescape=True))
        target = and_(AuditEvent.object_type == "user", AuditEvent.object_id == account,
                      AuditEvent.action.in_(_CONTROL_ACTIONS))
        with self._db() as s:
            rows = s.execute(select(AuditEvent.action, AuditEvent.details).where(
                target, who, AuditEvent.outcome == "allowed")).all()
        return any(action != "user.update" or "role" in (details or {}) for action, details in rows)

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

    def take_grant(self, ctx: RequestContext, *, action: str, target: str,
                   params: dict[str, Any] | None = None) -> bool:
        """Use up an approved grant of `action` on `target` for this caller (one use,
        within GRANT_TTL of its approval; with `params`, only a grant of exactly those);
        False when there is none."""
        now = self._now()
        with self._db.begin() as s:
            grants = s.execute(select(ApprovalRequest).where(
                ApprovalRequest.action == action, ApprovalRequest.target == target,
                ApprovalRequest.requested_by == ctx.principal.name, ApprovalRequest.state == "executed",
                ApprovalRequest.result.is_(None), ApprovalRequest.decided_at > now - GRANT_TTL)
                .order_by(ApprovalRequest.decided_at).with_for_update()).scalars()
            grant = next((g for g in grants if params is None or g.params == params), None)
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
        """The requester's principal as it is now (role changes, disabling and a KMIP
        client's revocation count)."""
        from keyserver.core.permissions import permissions_for
        from keyserver.core.principal import Principal

        if req.requester_user_id is None and req.requested_by.startswith("kmip:"):
            with self._db() as s:
                client = s.execute(select(KmipClient).where(
                    KmipClient.name == req.requested_by[len("kmip:"):])).scalar_one_or_none()
            if client is None or client.revoked_at is not None or client.not_after <= self._now():
                raise Conflict("the requesting KMIP client's certificate is revoked, expired or gone; ask again",
                               code="approval_requester_gone")
            # As kmip_clients.principal_for, less the export permissions whatever the client's
            # setting: no held action that runs needs them (an export is a grant, not run here).
            return Principal(name=req.requested_by, actor_type="host", role=client.role,
                             permissions=permissions_for(client.role) - {Permission.KEYS_EXPORT,
                                                                         Permission.KEYS_EXPORT_WRAPPED},
                             kmip_group=client_group(client))
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
