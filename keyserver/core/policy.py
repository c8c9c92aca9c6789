"""Authorisation, decided here and only here.

Roles grant permissions; API tokens narrow them to their scopes. Every core service
asks `Policy.require` before acting, and a refusal is audited there, so REST, KMIP and
the scheduler cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING

from keyserver.core.errors import Forbidden, ServiceUnavailable

if TYPE_CHECKING:
    from keyserver.core.audit import AuditService
    from keyserver.core.principal import RequestContext


class Permission(StrEnum):
    KEYS_READ = "keys:read"
    KEYS_CREATE = "keys:create"
    KEYS_UPDATE = "keys:update"
    KEYS_ROTATE = "keys:rotate"
    KEYS_ACTIVATE = "keys:activate"
    KEYS_REVOKE = "keys:revoke"
    KEYS_DESTROY = "keys:destroy"
    KEYS_EXPORT = "keys:export"  # plaintext key material out (KMIP Get without wrapping)
    # Key material out only wrapped under another key, inside the HSM (KMIP Get with a
    # Key Wrapping Specification): what a KMIP client limited to "wrapped" keeps.
    KEYS_EXPORT_WRAPPED = "keys:export-wrapped"
    # Cryptographic services with keys that stay in the HSM (core/crypto.py):
    KEYS_ENCRYPT = "keys:encrypt"  # encrypt, sign, MAC: protect data
    KEYS_DECRYPT = "keys:decrypt"  # decrypt: read protected data
    KEYS_VERIFY = "keys:verify"  # verify signatures and MACs: reveals nothing
    DATAKEYS_GENERATE = "datakeys:generate"
    DATAKEYS_DECRYPT = "datakeys:decrypt"
    AUDIT_READ = "audit:read"
    AUDIT_VERIFY = "audit:verify"
    USERS_READ = "users:read"
    USERS_MANAGE = "users:manage"
    TOKENS_OWN = "tokens:own"
    TOKENS_ALL = "tokens:all"
    SYSTEM_READ = "system:read"
    SYSTEM_KEK = "system:kek"
    KMIP_CLIENTS = "kmip:clients"  # issue and revoke KMIP client certificates
    HOSTS_READ = "hosts:read"
    HOSTS_ENROLL = "hosts:enroll"  # create and revoke enrollment tokens
    HOSTS_REVOKE = "hosts:revoke"
    GUARDPOINTS_MANAGE = "guardpoints:manage"  # protected directories and their access rules


class Role(StrEnum):
    ADMIN = "admin"
    KEY_OFFICER = "key-officer"
    OPERATOR = "operator"
    AUDITOR = "auditor"
    # Hosts, their enrollment and their guard points, without touching or taking keys.
    STORAGE_ADMIN = "storage-admin"
    # A program's identity (a KMIP client, a service account's token): uses and takes
    # keys, including plaintext export, but administers nothing.
    KMIP_CLIENT = "kmip-client"


P = Permission
ROLE_PERMISSIONS: dict[Role, frozenset[Permission]] = {
    Role.ADMIN: frozenset(Permission),
    Role.KEY_OFFICER: frozenset({
        P.KEYS_READ, P.KEYS_CREATE, P.KEYS_UPDATE, P.KEYS_ROTATE, P.KEYS_ACTIVATE,
        P.KEYS_REVOKE, P.KEYS_DESTROY, P.KEYS_EXPORT, P.KEYS_EXPORT_WRAPPED, P.DATAKEYS_GENERATE, P.DATAKEYS_DECRYPT,
        P.KEYS_ENCRYPT, P.KEYS_DECRYPT, P.KEYS_VERIFY, P.AUDIT_READ, P.AUDIT_VERIFY, P.TOKENS_OWN,
        P.SYSTEM_READ, P.HOSTS_READ, P.GUARDPOINTS_MANAGE,
    }),
    # Keys leave to an operator only wrapped under another key: plaintext export is for
    # key officers and programs (kmip-client).
    Role.OPERATOR: frozenset({
        P.KEYS_READ, P.KEYS_ROTATE, P.KEYS_EXPORT_WRAPPED, P.DATAKEYS_GENERATE, P.DATAKEYS_DECRYPT,
        P.KEYS_ENCRYPT, P.KEYS_DECRYPT, P.KEYS_VERIFY, P.TOKENS_OWN, P.SYSTEM_READ, P.HOSTS_READ,
        P.HOSTS_ENROLL, P.HOSTS_REVOKE,
    }),
    Role.STORAGE_ADMIN: frozenset({
        P.KEYS_READ, P.HOSTS_READ, P.HOSTS_ENROLL, P.HOSTS_REVOKE, P.GUARDPOINTS_MANAGE, P.AUDIT_READ,
        P.TOKENS_OWN, P.SYSTEM_READ,
    }),
    Role.KMIP_CLIENT: frozenset({
        P.KEYS_READ, P.KEYS_CREATE, P.KEYS_ACTIVATE, P.KEYS_ROTATE, P.KEYS_REVOKE, P.KEYS_DESTROY, P.KEYS_EXPORT,
        P.KEYS_EXPORT_WRAPPED, P.KEYS_ENCRYPT, P.KEYS_DECRYPT, P.KEYS_VERIFY, P.DATAKEYS_GENERATE,
        P.DATAKEYS_DECRYPT, P.TOKENS_OWN,
    }),
    # Sees everything, changes nothing (its own API tokens aside, for exports).
    Role.AUDITOR: frozenset({
        P.KEYS_READ, P.KEYS_VERIFY, P.AUDIT_READ, P.AUDIT_VERIFY, P.USERS_READ, P.TOKENS_OWN, P.SYSTEM_READ,
        P.HOSTS_READ,
    }),
}


def permissions_for(role: str, scopes: list[str] | None = None) -> frozenset[Permission]:
    """A role's permissions, narrowed to `scopes` for an API token."""
    granted = ROLE_PERMISSIONS[Role(role)]
    if scopes is None:
        return granted
    return granted & frozenset(Permission(s) for s in scopes)


# What waits while the audit trail cannot leave the server (fail-closed audit sinks):
# every use or change of key material. Reads, sign-in and the audit itself stay open.
KEY_OPERATIONS = frozenset({
    P.KEYS_CREATE, P.KEYS_UPDATE, P.KEYS_ROTATE, P.KEYS_ACTIVATE, P.KEYS_REVOKE, P.KEYS_DESTROY, P.KEYS_EXPORT,
    P.KEYS_EXPORT_WRAPPED, P.KEYS_ENCRYPT, P.KEYS_DECRYPT, P.DATAKEYS_GENERATE, P.DATAKEYS_DECRYPT, P.SYSTEM_KEK,
})


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

    def deny(self, ctx: RequestContext, *, action: str, object_type: str | None, object_id: str | None,
             details: dict[str, object], message: str) -> None:
        """Refuse what a per-object policy forbids (the permission alone would allow it):
        audited as denied, answered 403."""
        self._audit.record_now(ctx, action=action, outcome="denied", object_type=object_type, object_id=object_id,
                               details=details)
        raise Forbidden(message)

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
