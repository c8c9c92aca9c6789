"""Authorisation, decided here and only here.

Roles grant permissions; API tokens narrow them to their scopes. Every core service
asks `Policy.require` before acting, and a refusal is audited there, so REST, KMIP and
the scheduler cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable

from keyserver.core.audit import AuditService
from keyserver.core.errors import Forbidden, Hidden, ServiceUnavailable
from keyserver.core.permissions import KEY_OPERATIONS, Permission
from keyserver.core.principal import RequestContext


class Policy:
    def __init__(self, audit: AuditService, *, refusal: Callable[[], str | None] | None = None) -> None:
        self._audit = audit
        # Why key operations must wait right now (None: they need not): the audit sinks'.
        self._refusal = refusal

    def require(
        self,
        ctx: RequestContext,
        permission: Permission,
        *,
        action: str,
        object_type: str | None = None,
        object_id: str | None = None,
    ) -> None:
        if permission in ctx.principal.permissions:
            self.gate(ctx, permission, action=action, object_type=object_type, object_id=object_id)
            return
        self._audit.record_now(
            ctx,
            action=action,
            outcome="denied",
            object_type=object_type,
            object_id=object_id,
            details={"missing_permission": permission.value},
        )
        raise Forbidden(
            f"'{ctx.principal.name}' lacks the permission '{permission.value}' for {action}; "
            "ask an administrator for a role, token scope or KMIP client setting that grants it"
        )

    def permits(self, ctx: RequestContext, permission: Permission) -> bool:
        """`require` would pass without recording anything: the caller holds the
        permission and key operations are not waiting for the audit sinks. For hot paths
        that must not block; when False they take the ordinary path, which refuses and
        audits."""
        if permission not in ctx.principal.permissions:
            return False
        return self._refusal is None or permission not in KEY_OPERATIONS or self._refusal() is None

    def deny(self, ctx: RequestContext, *, action: str, object_type: str | None, object_id: str | None,
             details: dict[str, object], message: str, code: str | None = None) -> None:
        """Refuse what a per-object policy forbids (the permission alone would allow it):
        audited as denied, answered 403."""
        self._audit.record_now(ctx, action=action, outcome="denied", object_type=object_type, object_id=object_id,
                               details=details)
        raise Forbidden(message, code=code)

    def hide(self, ctx: RequestContext, *, action: str, object_type: str | None, object_id: str | None,
             details: dict[str, object], message: str, code: str) -> None:
        """Refuse an object the caller may not even see (KMIP tenancy): audited as denied,
        answered exactly as for an object that does not exist, so that the answer tells
        nothing of other tenants' objects."""
        self._audit.record_now(ctx, action=action, outcome="denied", object_type=object_type, object_id=object_id,
                               details=details)
        raise Hidden(message, code=code)

    def gate(self, ctx: RequestContext, permission: Permission, *, action: str, object_type: str | None = None,
             object_id: str | None = None) -> None:
        """Refuse a permitted key operation while the audit trail cannot leave the
        server (fail-closed sinks): 503, audited as an error."""
        if self._refusal is None or permission not in KEY_OPERATIONS:
            return
        reason = self._refusal()
        if reason is None:
            return
        self._audit.record_now(ctx, action=action, outcome="error", object_type=object_type, object_id=object_id,
                               details={"refused": "audit sinks unavailable (fail-closed)"})
        raise ServiceUnavailable(reason, code="audit_unavailable")
