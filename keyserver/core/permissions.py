"""Permissions and roles: what each role may do and which permissions are key
operations. Data only; `policy.Policy` decides and audits with it."""

from __future__ import annotations

from enum import StrEnum


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
    KMIP_CLIENTS = "kmip:clients"  # issue and revoke KMIP client certificates, their groups and grants
    # A KMIP client whose role holds it sees every object, not only its group's and grants
    # (core/kmip_tenancy.py): admin only, through "admin has every permission".
    KMIP_ALL_OBJECTS = "kmip:all-objects"
    HOSTS_READ = "hosts:read"
    HOSTS_ENROLL = "hosts:enroll"  # create and revoke enrollment tokens
    HOSTS_REVOKE = "hosts:revoke"
    GUARDPOINTS_MANAGE = "guardpoints:manage"  # protected directories and their access rules
    VOLUMES_MANAGE = "volumes:manage"  # revoke and re-key hosts' block volumes
    DATABASES_READ = "databases:read"  # database identities and their key grants (core/integrations.py)
    DATABASES_MANAGE = "databases:manage"  # create, re-token and revoke them; grants need keys:export too
    XKS_READ = "xks:read"  # AWS KMS external key stores and their keys (core/xks.py)
    XKS_MANAGE = "xks:manage"  # create, re-credential and revoke them; grant keys to them


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
        P.SYSTEM_READ, P.HOSTS_READ, P.GUARDPOINTS_MANAGE, P.VOLUMES_MANAGE, P.DATABASES_READ, P.DATABASES_MANAGE,
        P.XKS_READ, P.XKS_MANAGE,
    }),
    # Keys leave to an operator only wrapped under another key: plaintext export is for
    # key officers and programs (kmip-client).
    Role.OPERATOR: frozenset({
        P.KEYS_READ, P.KEYS_ROTATE, P.KEYS_EXPORT_WRAPPED, P.DATAKEYS_GENERATE, P.DATAKEYS_DECRYPT,
        P.KEYS_ENCRYPT, P.KEYS_DECRYPT, P.KEYS_VERIFY, P.TOKENS_OWN, P.SYSTEM_READ, P.HOSTS_READ,
        P.HOSTS_ENROLL, P.HOSTS_REVOKE,
    }),
    Role.STORAGE_ADMIN: frozenset({
        P.KEYS_READ, P.HOSTS_READ, P.HOSTS_ENROLL, P.HOSTS_REVOKE, P.GUARDPOINTS_MANAGE, P.VOLUMES_MANAGE,
        P.AUDIT_READ, P.TOKENS_OWN, P.SYSTEM_READ,
    }),
    Role.KMIP_CLIENT: frozenset({
        P.KEYS_READ, P.KEYS_CREATE, P.KEYS_ACTIVATE, P.KEYS_ROTATE, P.KEYS_REVOKE, P.KEYS_DESTROY, P.KEYS_EXPORT,
        P.KEYS_EXPORT_WRAPPED, P.KEYS_ENCRYPT, P.KEYS_DECRYPT, P.KEYS_VERIFY, P.DATAKEYS_GENERATE,
        P.DATAKEYS_DECRYPT, P.TOKENS_OWN,
    }),
    # Sees everything, changes nothing (its own API tokens aside, for exports).
    Role.AUDITOR: frozenset({
        P.KEYS_READ, P.KEYS_VERIFY, P.AUDIT_READ, P.AUDIT_VERIFY, P.USERS_READ, P.TOKENS_OWN, P.SYSTEM_READ,
        P.HOSTS_READ, P.DATABASES_READ, P.XKS_READ,
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
