"""Who may and who may not: every route, every role, through a real HTTP server.

The matrix must name every operation of the OpenAPI document, so a new route cannot
land without saying who may call it."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from keyserver.core.permissions import ROLE_PERMISSIONS, Permission, Role
from keyserver.services import Services
from keyserver.store.models import Host
from tests import https
from tests.conftest import Actor, unique

P = Permission
ROLES = ("admin", "key-officer", "operator", "auditor")


@dataclass
class Case:
    method: str
    path: str
    needs: tuple[Permission, ...]
    body: dict[str, Any] | None = None
    ok: tuple[int, ...] = (200,)
    # Builds the path parameters (fresh objects per call, so allowed calls succeed).
    setup: Callable[[Services, httpx.Client, Actor], dict[str, str]] | None = None
    # Finishes what an allowed call started and nothing in this session finishes (the
    # session's server runs no scheduler), so later tests do not meet it half done.
    finish: Callable[[Services], object] | None = None


def no_approval(*_: Any) -> dict[str, str]:
    """The session's server holds nothing (no STRONGROOM_APPROVALS): who may look gets a
    404, who may not a 403 (tests/api/test_approvals.py runs the rule itself)."""
    return {"approval": "00000000-0000-4000-8000-000000000000"}


def fresh_key(_: Services, admin: httpx.Client, __: Actor, **extra: Any) -> dict[str, str]:
    r = admin.post("/api/v1/keys", json={"name": unique("authz"), **extra})
    assert r.status_code == 201, r.text
    return {"key": r.json()["name"]}


def ciphertext(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    from keyserver.core.principal import system_context

    key = fresh_key(s, admin, a)["key"]
    out = s.crypto.encrypt(system_context("tests"), s.kmip_objects.uid_of(key), b"authz")
    return {"key": key, "ct": base64.b64encode(out.data).decode(), "iv": base64.b64encode(out.iv).decode(),
            "tag": base64.b64encode(out.tag).decode()}


def key_pair(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    from keyserver.core.principal import system_context

    ctx = system_context("tests")
    pair = s.kmip_objects.create_key_pair(ctx, bits=2048, private_name=None, public_name=None,
                                          activation_date=None)
    for uid in (pair.private.id, pair.public.id):
        s.kmip_objects.transition(ctx, str(uid), operation="activate")
    signature = s.crypto.sign(ctx, str(pair.private.id), b"authz")
    return {"private": str(pair.private.id), "public": str(pair.public.id),
            "sig": base64.b64encode(signature).decode()}


def hmac_key(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    from keyserver.core.keys import KeySpec
    from keyserver.core.principal import system_context

    key = s.keys.create(system_context("tests"), KeySpec(name=unique("authz-hmac"), algorithm="HMAC-SHA256"))
    return {"key": key.name}


def pre_active_key(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    return fresh_key(s, admin, a, activate=False)


def revoked_key(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    k = fresh_key(s, admin, a)
    assert admin.post(f"/api/v1/keys/{k['key']}/revoke", json={"reason": "superseded"}).status_code == 200
    return k


def rotated_key(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    k = fresh_key(s, admin, a)
    assert admin.post(f"/api/v1/keys/{k['key']}/rotate", json={}).status_code == 200
    return k


def retiring_key(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    """A key whose v1 is being retired and stays so: a data key is still under it."""
    r = admin.post("/api/v1/keys", json={"name": unique("authz-retiring")})
    assert r.status_code == 201, r.text
    name = r.json()["name"]
    assert admin.post(f"/api/v1/keys/{name}/generate-data-key", json={}).status_code == 200
    assert admin.post(f"/api/v1/keys/{name}/rotate", json={}).status_code == 200
    assert admin.post(f"/api/v1/keys/{name}/versions/1/retire", json={}).status_code == 201
    return {"key": name}


def end_retirements(s: Services) -> None:
    """What a refused caller left running, cancelled (the session's server runs no scheduler)."""
    from keyserver.core.principal import system_context

    ctx = system_context("tests")
    for r in s.retirement.list(ctx, state="running"):
        if str(r["key"]).startswith("authz-retiring"):
            s.retirement.cancel(ctx, r["key_id"], r["version"])


def blob(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    k = fresh_key(s, admin, a)
    r = admin.post(f"/api/v1/keys/{k['key']}/generate-data-key", json={})
    return {**k, "blob": r.json()["ciphertext_blob"]}


def some_user(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    r = admin.post("/api/v1/users", json={"username": unique("u"), "role": "operator"})
    assert r.status_code == 201, r.text
    return {"user": r.json()["user"]["id"]}


def own_token(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    r = a.session.post("/api/v1/tokens", json={"name": unique("t")})
    assert r.status_code == 201, r.text
    return {"token": r.json()["token"]["id"]}


def audit_seq(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    s.audit.flush()
    r = admin.get("/api/v1/audit/events", params={"limit": 1})
    return {"seq": str(r.json()["items"][0]["seq"])}


def rotation(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    st = admin.get("/api/v1/system/kek").json()
    if st["last_rotation"] is None:
        r = admin.post("/api/v1/system/kek/rotate")
        assert r.status_code == 202, r.text
        s.keks.resume_rotations()
        return {"rotation": r.json()["id"]}
    return {"rotation": st["last_rotation"]["id"]}


def kmip_client(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    r = admin.post("/api/v1/kmip/clients", json={"name": unique("kc"), "role": "auditor"})
    assert r.status_code == 201, r.text
    return {"client": r.json()["client"]["id"]}


def kmip_grantee(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    r = admin.post("/api/v1/kmip/clients", json={"name": unique("kg"), "role": "kmip-client"})
    assert r.status_code == 201, r.text
    return {"grantee": "client:" + r.json()["client"]["name"], **fresh_key(s, admin, a)}


def kmip_grant(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    made = kmip_grantee(s, admin, a)
    r = admin.post("/api/v1/kmip/grants", json={"grantee": made["grantee"], "key": made["key"], "rights": ["read"]})
    assert r.status_code == 201, r.text
    return {"grant": r.json()["id"]}


def enrollment_token(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    from keyserver.core.principal import system_context

    return {"etoken": str(s.hosts.create_token(system_context("tests"), host_group="authz").token.id)}


def guard_point(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    key = fresh_key(s, admin, a)["key"]
    r = admin.post("/api/v1/guard-points", json={"host_group": unique("authz"), "path": "/srv/authz", "key": key})
    assert r.status_code == 201, r.text
    return {"gp": r.json()["id"], "key": key}


def guard_point_off(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    key = fresh_key(s, admin, a)["key"]
    r = admin.post("/api/v1/guard-points", json={"host_group": unique("authz"), "path": "/srv/authz", "key": key,
                                                 "mode": "off"})
    assert r.status_code == 201, r.text
    return {"gp": r.json()["id"], "key": key}


def enrolled_host(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    import tempfile
    from pathlib import Path

    from agents.keyclient.identity import HostIdentity
    from keyserver.core.principal import system_context

    ident = HostIdentity.load_or_create(Path(tempfile.mkdtemp()) / "state")
    secret = s.hosts.create_token(system_context("tests"), host_group="authz").secret
    host = s.hosts.enroll(token=secret, csr_pem=ident.csr("authz.example").decode(), hostname="authz.example").host
    return {"host": str(host.id)}


def volume(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    from keyserver.core.volumes import VolumeSpec

    host_id = uuid.UUID(enrolled_host(s, admin, a)["host"])
    key = fresh_key(s, admin, a, tags={"host-group": "authz"})["key"]
    with s.db() as session:
        host = session.get(Host, host_id)
    assert host is not None
    ctx, host = s.hosts.authenticate(host.cert_serial)
    vol, _ = s.volumes.create(ctx, host, VolumeSpec(name=unique("vol"), path="/dev/sdz", key=key))
    return {"volume": str(vol.id)}


def database(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    r = admin.post("/api/v1/databases", json={"name": unique("authz-db")})
    assert r.status_code == 201, r.text
    return {"db": r.json()["database"]["name"], **fresh_key(s, admin, a)}


def xks_store(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    r = admin.post("/api/v1/xks/stores", json={"name": unique("authz-xks"), "region": "eu-west-1"})
    assert r.status_code == 201, r.text
    return {"xks": r.json()["store"]["name"], **fresh_key(s, admin, a)}


def xks_rotated(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    made = xks_store(s, admin, a)
    r = admin.post(f"/api/v1/xks/stores/{made['xks']}/credential")
    assert r.status_code == 200, r.text
    return made


def xks_key(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    made = xks_store(s, admin, a)
    r = admin.post(f"/api/v1/xks/stores/{made['xks']}/keys", json={"key": made["key"], "external_id": "k1"})
    assert r.status_code == 201, r.text
    return made


def database_grant(s: Services, admin: httpx.Client, a: Actor) -> dict[str, str]:
    made = database(s, admin, a)
    r = admin.post(f"/api/v1/databases/{made['db']}/grants", json={"key": made["key"], "key_id": 1})
    assert r.status_code == 201, r.text
    return made


CASES: dict[str, Case] = {
    "getMe": Case("GET", "/api/v1/auth/me", ()),
    "checkPermission": Case("GET", "/api/v1/auth/can?permission=keys:read", ()),
    "listKeys": Case("GET", "/api/v1/keys", (P.KEYS_READ,)),
    "createKey": Case("POST", "/api/v1/keys", (P.KEYS_CREATE,), body={"name": "{new}"}, ok=(201,)),
    "getKey": Case("GET", "/api/v1/keys/{key}", (P.KEYS_READ,), setup=fresh_key),
    "updateKey": Case("PATCH", "/api/v1/keys/{key}", (P.KEYS_UPDATE,), body={"description": "x"},
                      setup=fresh_key),
    "rotateKey": Case("POST", "/api/v1/keys/{key}/rotate", (P.KEYS_ROTATE,), setup=fresh_key),
    "activateKey": Case("POST", "/api/v1/keys/{key}/activate", (P.KEYS_ACTIVATE,), setup=pre_active_key),
    "deactivateKey": Case("POST", "/api/v1/keys/{key}/deactivate", (P.KEYS_REVOKE,), setup=fresh_key),
    "revokeKey": Case("POST", "/api/v1/keys/{key}/revoke", (P.KEYS_REVOKE,),
                      body={"reason": "superseded"}, setup=fresh_key),
    "destroyKey": Case("POST", "/api/v1/keys/{key}/destroy", (P.KEYS_DESTROY,), body={},
                       setup=revoked_key),
    "getVersionInventory": Case("GET", "/api/v1/keys/{key}/versions/1/inventory", (P.KEYS_READ,), setup=fresh_key),
    "retireVersion": Case("POST", "/api/v1/keys/{key}/versions/1/retire", (P.KEYS_DESTROY,),
                          body={"reason": "authz"}, ok=(201,), setup=rotated_key),
    "cancelRetirement": Case("DELETE", "/api/v1/keys/{key}/versions/1/retire", (P.KEYS_DESTROY,),
                             setup=retiring_key, finish=end_retirements),
    "excludeRetirementHolder": Case("POST", "/api/v1/keys/{key}/versions/1/retire/exclusions", (P.KEYS_DESTROY,),
                                    body={"kind": "data_keys", "holder": "applications", "reason": "authz"},
                                    ok=(201,), setup=retiring_key, finish=end_retirements),
    "listRetirements": Case("GET", "/api/v1/retirements", (P.KEYS_READ,)),
    "generateDataKey": Case("POST", "/api/v1/keys/{key}/generate-data-key", (P.DATAKEYS_GENERATE,),
                            body={}, setup=fresh_key),
    "decryptDataKey": Case("POST", "/api/v1/datakeys/decrypt", (P.DATAKEYS_DECRYPT,),
                           body={"ciphertext_blob": "{blob}"}, setup=blob),
    "reencryptDataKey": Case("POST", "/api/v1/datakeys/reencrypt",
                             (P.DATAKEYS_DECRYPT, P.DATAKEYS_GENERATE),
                             body={"ciphertext_blob": "{blob}"}, setup=blob),
    "encryptWithKey": Case("POST", "/api/v1/keys/{key}/encrypt", (P.KEYS_ENCRYPT,), body={"plaintext": "aGk="},
                           setup=fresh_key),
    "decryptWithKey": Case("POST", "/api/v1/keys/{key}/decrypt", (P.KEYS_DECRYPT,), setup=ciphertext,
                           body={"ciphertext": "{ct}", "iv": "{iv}", "tag": "{tag}"}),
    "signWithKey": Case("POST", "/api/v1/keys/{private}/sign", (P.KEYS_ENCRYPT,), body={"data": "aGk="},
                        setup=key_pair),
    "verifyWithKey": Case("POST", "/api/v1/keys/{public}/verify", (P.KEYS_VERIFY,), setup=key_pair,
                          body={"data": "YXV0aHo=", "signature": "{sig}"}),
    "macWithKey": Case("POST", "/api/v1/keys/{key}/mac", (P.KEYS_ENCRYPT,), body={"data": "aGk="}, setup=hmac_key),
    "getRandom": Case("GET", "/api/v1/random?bytes=16", (P.KEYS_READ,)),
    "listAuditEvents": Case("GET", "/api/v1/audit/events", (P.AUDIT_READ,)),
    "getAuditEvent": Case("GET", "/api/v1/audit/events/{seq}", (P.AUDIT_READ,), setup=audit_seq),
    "exportAudit": Case("GET", "/api/v1/audit/export?since=2999-01-01T00:00:00Z", (P.AUDIT_READ,)),
    "verifyAudit": Case("POST", "/api/v1/audit/verify", (P.AUDIT_VERIFY,)),
    "getAuditStatus": Case("GET", "/api/v1/audit/status", (P.AUDIT_READ,)),
    "getAuditActivity": Case("GET", "/api/v1/audit/activity?since=2026-11-01T00:00:00Z&until=2026-11-02T00:00:00Z",
                             (P.AUDIT_READ,)),
    "getKeyUsage": Case("GET", "/api/v1/audit/usage?since=2026-11-01T00:00:00Z&until=2026-11-02T00:00:00Z"
                        "&actor=host:authz", (P.AUDIT_READ,)),
    "listAuditCheckpoints": Case("GET", "/api/v1/audit/checkpoints", (P.AUDIT_READ,)),
    "listUsers": Case("GET", "/api/v1/users", (P.USERS_READ,)),
    "createUser": Case("POST", "/api/v1/users", (P.USERS_MANAGE,),
                       body={"username": "{new}", "role": "auditor"}, ok=(201,)),
    "getUser": Case("GET", "/api/v1/users/{user}", (P.USERS_READ,), setup=some_user),
    "updateUser": Case("PATCH", "/api/v1/users/{user}", (P.USERS_MANAGE,), body={"full_name": "X"},
                       setup=some_user),
    "resetPassword": Case("POST", "/api/v1/users/{user}/reset-password", (P.USERS_MANAGE,),
                          setup=some_user),
    "listApprovals": Case("GET", "/api/v1/approvals", (P.AUDIT_READ,)),
    "getApproval": Case("GET", "/api/v1/approvals/{approval}", (P.AUDIT_READ,), setup=no_approval, ok=(404,)),
    "approveRequest": Case("POST", "/api/v1/approvals/{approval}/approve", (P.KEYS_DESTROY,), setup=no_approval,
                           ok=(404,)),
    "rejectRequest": Case("POST", "/api/v1/approvals/{approval}/reject", (P.KEYS_DESTROY,), setup=no_approval,
                          ok=(404,)),
    "resetTotp": Case("DELETE", "/api/v1/users/{user}/totp", (P.USERS_MANAGE,), setup=some_user, ok=(204,)),
    "listTokens": Case("GET", "/api/v1/tokens", (P.TOKENS_OWN,)),
    "createToken": Case("POST", "/api/v1/tokens", (P.TOKENS_OWN,), body={"name": "x"}, ok=(201,)),
    "revokeToken": Case("DELETE", "/api/v1/tokens/{token}", (P.TOKENS_OWN,), setup=own_token),
    "getKekStatus": Case("GET", "/api/v1/system/kek", (P.SYSTEM_READ,)),
    "getSystemHealth": Case("GET", "/api/v1/system/health", (P.SYSTEM_READ,)),
    "rotateKek": Case("POST", "/api/v1/system/kek/rotate", (P.SYSTEM_KEK,), ok=(202, 409),
                      finish=lambda s: s.keks.resume_rotations()),
    # The active KEK: who may is refused for that (409 kek_active, nothing changes).
    "retireKek": Case("POST", "/api/v1/system/keks/{kek}/retire", (P.SYSTEM_KEK,), ok=(409,),
                      setup=lambda s, *_: {"kek": s.keks.current()}),
    "getKekRotation": Case("GET", "/api/v1/system/kek/rotations/{rotation}", (P.SYSTEM_READ,),
                           setup=rotation),
    "metrics": Case("GET", "/metrics", (P.SYSTEM_READ,)),
    "createEnrollmentToken": Case("POST", "/api/v1/enrollment-tokens", (P.HOSTS_ENROLL,),
                                  body={"host_group": "authz"}, ok=(201,)),
    "listEnrollmentTokens": Case("GET", "/api/v1/enrollment-tokens", (P.HOSTS_READ,)),
    "revokeEnrollmentToken": Case("DELETE", "/api/v1/enrollment-tokens/{etoken}", (P.HOSTS_ENROLL,),
                                  setup=enrollment_token),
    "listHosts": Case("GET", "/api/v1/hosts", (P.HOSTS_READ,)),
    "getHost": Case("GET", "/api/v1/hosts/{host}", (P.HOSTS_READ,), setup=enrolled_host),
    "getHostHeartbeats": Case("GET", "/api/v1/hosts/{host}/heartbeats?since=2026-11-01T00:00:00Z"
                              "&until=2026-11-02T00:00:00Z", (P.HOSTS_READ,), setup=enrolled_host),
    "revokeHost": Case("POST", "/api/v1/hosts/{host}/revoke", (P.HOSTS_REVOKE,), setup=enrolled_host),
    "listVolumes": Case("GET", "/api/v1/volumes", (P.HOSTS_READ,)),
    "getVolume": Case("GET", "/api/v1/volumes/{volume}", (P.HOSTS_READ,), setup=volume),
    "revokeVolume": Case("POST", "/api/v1/volumes/{volume}/revoke", (P.VOLUMES_MANAGE,), setup=volume),
    "setVolumePolicy": Case("PUT", "/api/v1/volumes/{volume}/policy", (P.VOLUMES_MANAGE,), setup=volume,
                            body={"grace_seconds": 60}),
    "rekeyVolume": Case("POST", "/api/v1/volumes/{volume}/rekey", (P.VOLUMES_MANAGE,), setup=volume, ok=(202,)),
    "listKmipClients": Case("GET", "/api/v1/kmip/clients", (P.KMIP_CLIENTS,)),
    "createKmipClient": Case("POST", "/api/v1/kmip/clients", (P.KMIP_CLIENTS,),
                             body={"name": "{new}", "role": "auditor"}, ok=(201,)),
    "updateKmipClient": Case("PATCH", "/api/v1/kmip/clients/{client}", (P.KMIP_CLIENTS,), setup=kmip_client,
                             body={"key_export": "wrapped"}),
    "revokeKmipClient": Case("DELETE", "/api/v1/kmip/clients/{client}", (P.KMIP_CLIENTS,), setup=kmip_client),
    "listKmipGroups": Case("GET", "/api/v1/kmip/groups", (P.KEYS_READ,)),
    "listKmipGrants": Case("GET", "/api/v1/kmip/grants", (P.KEYS_READ,)),
    "createKmipGrant": Case("POST", "/api/v1/kmip/grants", (P.KMIP_CLIENTS, P.KEYS_EXPORT), setup=kmip_grantee,
                            body={"grantee": "{grantee}", "key": "{key}", "rights": ["read", "export"]}, ok=(201,)),
    "deleteKmipGrant": Case("DELETE", "/api/v1/kmip/grants/{grant}", (P.KMIP_CLIENTS,), setup=kmip_grant,
                            ok=(204,)),
    "getEnrollmentInfo": Case("GET", "/api/v1/enrollment-info", (P.HOSTS_READ,)),
    "listGuardPoints": Case("GET", "/api/v1/guard-points", (P.HOSTS_READ,)),
    "getGuardPoint": Case("GET", "/api/v1/guard-points/{gp}", (P.HOSTS_READ,), setup=guard_point),
    "createGuardPoint": Case("POST", "/api/v1/guard-points", (P.GUARDPOINTS_MANAGE,), setup=guard_point,
                             body={"host_group": "{new}", "path": "/srv/new", "key": "{key}"}, ok=(201,)),
    "updateGuardPoint": Case("PUT", "/api/v1/guard-points/{gp}", (P.GUARDPOINTS_MANAGE,), setup=guard_point,
                             body={"host_group": "{new}", "path": "/srv/authz", "key": "{key}", "mode": "learn"}),
    "rekeyGuardPoint": Case("POST", "/api/v1/guard-points/{gp}/rekey", (P.GUARDPOINTS_MANAGE,), setup=guard_point,
                            ok=(202,)),
    "unprotectGuardPoint": Case("POST", "/api/v1/guard-points/{gp}/unprotect", (P.GUARDPOINTS_MANAGE,),
                                setup=guard_point_off, ok=(202,)),
    "listDatabases": Case("GET", "/api/v1/databases", (P.DATABASES_READ,)),
    "createDatabase": Case("POST", "/api/v1/databases", (P.DATABASES_MANAGE,), body={"name": "{new}"}, ok=(201,)),
    "getDatabase": Case("GET", "/api/v1/databases/{db}", (P.DATABASES_READ,), setup=database),
    "reissueDatabaseToken": Case("POST", "/api/v1/databases/{db}/token", (P.DATABASES_MANAGE,), setup=database),
    "revokeDatabase": Case("POST", "/api/v1/databases/{db}/revoke", (P.DATABASES_MANAGE,), setup=database),
    "grantDatabaseKey": Case("POST", "/api/v1/databases/{db}/grants", (P.DATABASES_MANAGE, P.KEYS_EXPORT),
                             body={"key": "{key}", "key_id": 1}, setup=database, ok=(201,)),
    "revokeDatabaseGrant": Case("DELETE", "/api/v1/databases/{db}/grants/1", (P.DATABASES_MANAGE,),
                                setup=database_grant, ok=(204,)),
    "listXksStores": Case("GET", "/api/v1/xks/stores", (P.XKS_READ,)),
    "createXksStore": Case("POST", "/api/v1/xks/stores", (P.XKS_MANAGE,), body={"name": "{new}", "region": "eu-west-1"},
                           ok=(201,)),
    "getXksStore": Case("GET", "/api/v1/xks/stores/{xks}", (P.XKS_READ,), setup=xks_store),
    "updateXksStore": Case("PATCH", "/api/v1/xks/stores/{xks}", (P.XKS_MANAGE,),
                           body={"client_cert_subject": "cks.kms.eu-west-1.amazonaws.com"}, setup=xks_store),
    "rotateXksCredential": Case("POST", "/api/v1/xks/stores/{xks}/credential", (P.XKS_MANAGE,), setup=xks_store),
    "retireXksPreviousCredential": Case("DELETE", "/api/v1/xks/stores/{xks}/credential/previous", (P.XKS_MANAGE,),
                                        setup=xks_rotated),
    "revokeXksStore": Case("POST", "/api/v1/xks/stores/{xks}/revoke", (P.XKS_MANAGE,), setup=xks_store),
    "grantXksKey": Case("POST", "/api/v1/xks/stores/{xks}/keys", (P.XKS_MANAGE,), body={"key": "{key}"},
                        setup=xks_store, ok=(201,)),
    "removeXksKey": Case("DELETE", "/api/v1/xks/stores/{xks}/keys/k1", (P.XKS_MANAGE,), setup=xks_key, ok=(204,)),
    "listKeyConsumers": Case("GET", "/api/v1/keys/{key}/consumers", (P.KEYS_READ,), setup=fresh_key),
    "deleteGuardPoint": Case("DELETE", "/api/v1/guard-points/{gp}", (P.GUARDPOINTS_MANAGE,), setup=guard_point,
                             ok=(204,)),
}
# Reachable without a session (or acting only on the caller's own session).
PUBLIC = {"login", "logout", "changePassword", "enrollTotp", "confirmTotp", "healthz", "readyz",
          "authMethods", "oidcLogin", "oidcCallback",  # single sign-on (tests/api/test_oidc.py)
          "enrollHost",  # authenticated by its one-time enrollment token
          "getCaCertificate", "getAgentInstaller", "downloadAgent"}  # what a host needs before enrollment
# Enrolled hosts only, by their client certificate on the agent port (tests/agents/test_agent_port.py).
HOST_CERTIFICATE = {"agentHeartbeat", "listAgentKeys", "getAgentKey", "reportAgentEvents", "listAgentGuardPoints",
                    "listAgentVolumes", "createAgentVolume", "unsealAgentVolume", "resealAgentVolume",
                    "reportAgentVolume", "recordAgentVolumeRecovery"}
# Databases only, by their KV token in X-Vault-Token (tests/integrations/test_databases_api.py).
DATABASE_TOKEN = {"vaultMountTune", "vaultReadSecret"}
# AWS KMS only, by SigV4 under a key store's credential (tests/integrations/test_xks.py).
XKS_SIGV4 = {"xksKeyOperation", "xksHealth"}


def test_matrix_names_every_operation(admin: httpx.Client) -> None:
    spec = admin.get("/api/v1/openapi.json").json()
    ops = {op["operationId"] for path in spec["paths"].values() for op in path.values()}
    unnamed = ops - set(CASES) - PUBLIC - HOST_CERTIFICATE - DATABASE_TOKEN - XKS_SIGV4
    assert unnamed == set(), "routes without an authorisation case"
    assert set(CASES) - ops == set(), "cases for routes that no longer exist"


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("op", sorted(CASES))
def test_route_authorisation(op: str, role: str, actors: dict[str, Actor], services: Services) -> None:
    case = CASES[op]
    actor = actors[role]
    params = case.setup(services, actors["admin"].client, actor) if case.setup else {}
    params["new"] = unique("n")
    path = case.path.format(**params)
    body = ({k: (v.format(**params) if isinstance(v, str) else v) for k, v in case.body.items()}
            if case.body is not None else None)
    r = actor.session.request(case.method, path, json=body)
    if case.finish:
        case.finish(services)
    allowed = all(p in ROLE_PERMISSIONS[Role(role)] for p in case.needs)
    if allowed:
        assert r.status_code in case.ok, f"{role} {op}: {r.status_code} {r.text}"
    else:
        assert r.status_code == 403, f"{role} {op} should be refused: {r.status_code} {r.text}"
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["code"] == "forbidden"


@pytest.mark.parametrize("role", ROLES)
def test_host_routes_refuse_users(role: str, actors: dict[str, Actor]) -> None:
    """No role reaches the agent routes: they need a host certificate, which users lack."""
    for method, path in (("POST", "/api/v1/agent/heartbeat"), ("GET", "/api/v1/agent/keys"),
                         ("GET", "/api/v1/agent/keys/any"), ("POST", "/api/v1/agent/events"),
                         ("GET", "/api/v1/agent/guard-points"), ("GET", "/api/v1/agent/volumes"),
                         ("POST", "/api/v1/agent/volumes"),
                         ("POST", f"/api/v1/agent/volumes/{uuid.uuid4()}/unseal")):
        r = actors[role].client.request(method, path, json={} if method == "POST" else None)
        assert r.status_code == 401 and r.json()["code"] == "client_certificate_required", (path, r.text)


@pytest.mark.parametrize("role", ROLES)
def test_database_routes_refuse_users(role: str, actors: dict[str, Actor]) -> None:
    """No role reaches the KV front: it takes a database's token, which users lack."""
    for path in ("/v1/sys/mounts/strongroom/tune", "/v1/strongroom/data/1"):
        for c in (actors[role].client, actors[role].session):
            r = c.get(path)
            assert r.status_code == 403 and r.json() == {"errors": ["permission denied"]}, (path, r.text)


def test_refusals_are_audited(actors: dict[str, Actor], services: Services) -> None:
    auditor = actors["auditor"]
    r = auditor.client.post("/api/v1/keys", json={"name": unique("nope")})
    assert r.status_code == 403
    rid = r.headers["x-request-id"]
    services.audit.flush()
    events = actors["admin"].client.get("/api/v1/audit/events",
                                        params={"actor": f"{auditor.username}/token:tests"}).json()["items"]
    denied = [e for e in events if e["request_id"] == rid]
    assert len(denied) == 1
    assert denied[0]["outcome"] == "denied" and denied[0]["action"] == "key.create"
    assert denied[0]["details"] == {"missing_permission": "keys:create"}


def test_token_scopes_narrow_the_role(actors: dict[str, Actor], new_key: dict[str, Any]) -> None:
    admin = actors["admin"]
    r = admin.session.post("/api/v1/tokens", json={"name": "read-only", "scopes": ["keys:read"]})
    assert r.status_code == 201
    with https.client(base_url=str(admin.client.base_url),
                      headers={"Authorization": f"Bearer {r.json()['secret']}"}) as c:
        assert c.get(f"/api/v1/keys/{new_key['name']}").status_code == 200
        assert c.post(f"/api/v1/keys/{new_key['name']}/rotate").status_code == 403


def test_scopes_cannot_exceed_the_role(actors: dict[str, Actor]) -> None:
    r = actors["operator"].session.post("/api/v1/tokens", json={"name": "x", "scopes": ["keys:destroy"]})
    assert r.status_code == 400
    assert "does not grant" in r.json()["detail"]


def test_blob_route_with_decoded_body(actors: dict[str, Actor]) -> None:
    # The data-key routes take base64; a non-base64 body is a 422 before any policy check.
    r = actors["operator"].client.post("/api/v1/datakeys/decrypt",
                                       json={"ciphertext_blob": base64.b64encode(b"x").decode() + "!"})
    assert r.status_code == 422


def test_the_permission_table_in_docs_is_the_policy() -> None:
    """docs/api.md's table, cell by cell, against ROLE_PERMISSIONS."""
    import re

    from keyserver.core.permissions import ROLE_PERMISSIONS, Role
    from tests.conftest import REPO

    doc = (REPO / "docs" / "api.md").read_text()
    table = doc[doc.index("| permission |"):]
    header, _, *rows = table.split("\n\n")[0].splitlines()
    roles = [Role(c.strip()) for c in header.strip("|").split("|")[1:]]
    assert set(roles) == set(Role), "every role has a column"
    seen = set()
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        for p in re.findall(r"[a-z]+:[a-z-]+", re.sub(r"\([^)]*\)", "", cells[0])):
            seen.add(P(p))
            for role, cell in zip(roles, cells[1:], strict=True):
                assert (P(p) in ROLE_PERMISSIONS[role]) == (cell == "✓"), f"{p} for {role}: docs say {cell!r}"
    assert seen == set(P), f"permissions missing from the table: {set(P) - seen}"
