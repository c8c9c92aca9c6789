"""KMIP client identities: certificates from the internal CA, each mapped to a role.

A client is known by its certificate serial. The serial is checked on every
connection and on every request, so revoking a client refuses it at once, on every
replica. The lookup is cached per replica the way API tokens are (decision 0004):
revocation executes NOTIFY in its own transaction and every replica drops the cache;
while the notification listener is down, every request reads the database.
"""

from __future__ import annotations

import hmac
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from keyserver.core.audit import AuditService, utcnow
from keyserver.core.ca import CertificateAuthority, fingerprint, serial_hex
from keyserver.core.errors import Conflict, Forbidden, InvalidInput, NotFound, Unauthenticated
from keyserver.core.kmip_groups import client_group
from keyserver.core.names import check_group
from keyserver.core.permissions import Permission, Role, permissions_for
from keyserver.core.policy import Policy
from keyserver.core.principal import Principal, RequestContext
from keyserver.store.models import KmipClient
from keyserver.store.notify import Notifier, Topic

# Also a DNS name: it goes into the certificate's subjectAltName.
CLIENT_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")
MAX_CSR_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class IssuedClient:
    client: KmipClient
    certificate_pem: str
    ca_certificate_pem: str
    # Only when the server generated the key pair (no CSR given); shown once.
    private_key_pem: str | None


# A client's key-export setting narrows what its role may take out (KMIP 1.4 lets a
# server refuse Get of material to a client it does not trust with it; the default is
# KMIP's own behaviour): plaintext, wrapped under another key only, or no material.
KEY_EXPORT: dict[str, frozenset[Permission]] = {
    "plaintext": frozenset(),
    "wrapped": frozenset({Permission.KEYS_EXPORT}),
    "none": frozenset({Permission.KEYS_EXPORT, Permission.KEYS_EXPORT_WRAPPED}),
}


def check_key_export(value: str) -> str:
    if value not in KEY_EXPORT:
        raise InvalidInput(f"key_export must be one of: {', '.join(KEY_EXPORT)}")
    return value


def principal_for(client: KmipClient) -> Principal:
    return Principal(name=f"kmip:{client.name}", actor_type="host", role=client.role,
                     permissions=permissions_for(client.role) - KEY_EXPORT[client.key_export],
                     kmip_group=client_group(client))


class KmipClientService:
    def __init__(
        self,
        session_factory: sessionmaker[Session],
        audit: AuditService,
        policy: Policy,
        ca: CertificateAuthority,
        *,
        cert_days: int = 365,
        read_session_factory: sessionmaker[Session] | None = None,
        notifier: Notifier | None = None,
        cache_seconds: float = 30.0,
        now: Callable[[], datetime] = utcnow,
    ) -> None:
        self._db = session_factory
        # The per-request revocation lookup runs in autocommit: one round trip, no BEGIN/ROLLBACK.
        self._read = read_session_factory or session_factory
        self._audit = audit
        self._policy = policy
        self._ca = ca
        self._cert_days = cert_days
        self._now = now
        # Known, unrevoked clients by certificate DER: (principal, cached_at).
        # Without a notifier (no way to hear another replica's revocation) nothing is cached.
        self._notifier = notifier
        self._cache_seconds = cache_seconds
        self._cache: dict[bytes, tuple[Principal, float]] = {}
        self._cache_lock = threading.Lock()
        # Bumped by every invalidation: a lookup that started before one must not cache
        # what it read, or a revocation racing it would be forgotten for the whole TTL.
        self._generation = 0
        if notifier is not None:
            notifier.subscribe(Topic.PRINCIPALS, self._clear_cache)

    def _clear_cache(self) -> None:
        with self._cache_lock:
            self._generation += 1
            self._cache.clear()

    def create(self, ctx: RequestContext, *, name: str, role: str, csr_pem: str | None = None,
               key_export: str = "plaintext", group: str | None = None) -> IssuedClient:
        """`group`: its KMIP tenancy group (core/kmip_tenancy.py), by default its own name."""
        self._policy.require(ctx, Permission.KMIP_CLIENTS, action="kmip_client.create",
                             object_type="kmip_client", object_id=name)
        check_key_export(key_export)
        check_group(group)
        if len(name) > 64 or not CLIENT_NAME_RE.match(name):
            raise InvalidInput("a KMIP client name is a DNS name (lower-case letters, digits, '-' "
                               "and '.'), at most 64 characters")
        try:
            Role(role)
        except ValueError:
            raise InvalidInput(f"role must be one of: {', '.join(r.value for r in Role)}") from None
        private_pem: str | None = None
        public_key: ec.EllipticCurvePublicKey | rsa.RSAPublicKey
        if csr_pem is not None:
            public_key = self._csr_key(csr_pem)
        else:
            # RSA-2048 as the design names for host identities; the key leaves only in this response.
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            public_key = key.public_key()
            private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption()).decode()
        with self._db() as s:
            if s.execute(select(KmipClient.id).where(KmipClient.name == name)).first():
                raise Conflict(f"a KMIP client named '{name}' exists already", code="kmip_client_exists")
        self._ca.ensure()  # it may read the CA's key again (KEK rotation)
        cert = self._ca.issue_client(name=name, public_key=public_key, days=self._cert_days)
        now = self._now()
        client = KmipClient(id=uuid.uuid4(), name=name, role=role, serial=serial_hex(cert),
                            fingerprint_sha256=fingerprint(cert), not_after=cert.not_valid_after_utc,
                            created_at=now, created_by=ctx.principal.name, revoked_at=None, key_export=key_export,
                            group=group or name)
        with self._db.begin() as s:
            s.add(client)
            self._audit.add(s, ctx, action="kmip_client.create", object_type="kmip_client",
                            object_id=str(client.id),
                            details={"name": name, "role": role, "serial": client.serial, "key_export": key_export,
                                     "group": client.group,
                                     "key_generated_by": "server" if csr_pem is None else "client"})
        return IssuedClient(client=client, certificate_pem=cert.public_bytes(serialization.Encoding.PEM).decode(),
                            ca_certificate_pem=self._ca.certificate_pem().decode(), private_key_pem=private_pem)

    @staticmethod
    def _csr_key(csr_pem: str) -> ec.EllipticCurvePublicKey | rsa.RSAPublicKey:
        if len(csr_pem) > MAX_CSR_BYTES:
            raise InvalidInput("the CSR is too large")
        try:
            csr = x509.load_pem_x509_csr(csr_pem.encode())
        except ValueError:
            raise InvalidInput("csr must be a PEM-encoded PKCS#10 certificate signing request") from None
        if not csr.is_signature_valid:
            raise InvalidInput("the CSR's signature does not verify")
        key = csr.public_key()
        if isinstance(key, rsa.RSAPublicKey) and key.key_size >= 2048:
            return key
        if isinstance(key, ec.EllipticCurvePublicKey) and key.curve.key_size >= 256:
            return key
        raise InvalidInput("the CSR's key must be RSA (>= 2048 bits) or EC (P-256 or larger)")

    def list(self, ctx: RequestContext) -> list[KmipClient]:
        self._policy.require(ctx, Permission.KMIP_CLIENTS, action="kmip_client.list")
        with self._db() as s:
            return list(s.execute(select(KmipClient).order_by(KmipClient.name)).scalars())

    def update(self, ctx: RequestContext, client_id: uuid.UUID, *, key_export: str | None = None,
               group: str | None = None) -> KmipClient:
        """Change what key material may leave to the client and/or its tenancy group; every
        replica applies it to the client's next request (its cached principal is dropped)."""
        self._policy.require(ctx, Permission.KMIP_CLIENTS, action="kmip_client.update",
                             object_type="kmip_client", object_id=str(client_id))
        if key_export is None and group is None:
            raise InvalidInput("give key_export, group or both")
        if key_export is not None:
            check_key_export(key_export)
        check_group(group)
        with self._db.begin() as s:
            client = s.get(KmipClient, client_id, with_for_update=True)
            if client is None:
                raise NotFound(f"no KMIP client with id '{client_id}'", code="kmip_client_not_found")
            details: dict[str, object] = {}
            if key_export is not None and client.key_export != key_export:
                details.update(key_export=key_export, was=client.key_export)
                client.key_export = key_export
            if group is not None and client_group(client) != group:
                details.update(group=group, group_was=client_group(client))
                client.group = group
            if details:
                if self._notifier is not None:
                    self._notifier.publish(s, Topic.PRINCIPALS)
                self._audit.add(s, ctx, action="kmip_client.update", object_type="kmip_client",
                                object_id=str(client.id), details={"name": client.name, **details})
        return client

    def revoke(self, ctx: RequestContext, client_id: uuid.UUID) -> KmipClient:
        self._policy.require(ctx, Permission.KMIP_CLIENTS, action="kmip_client.revoke",
                             object_type="kmip_client", object_id=str(client_id))
        with self._db.begin() as s:
            client = s.get(KmipClient, client_id, with_for_update=True)
            if client is None:
                raise NotFound(f"no KMIP client with id '{client_id}'", code="kmip_client_not_found")
            if client.revoked_at is None:
                client.revoked_at = self._now()
                if self._notifier is not None:
                    self._notifier.publish(s, Topic.PRINCIPALS)  # every replica drops its cached principals
                self._audit.add(s, ctx, action="kmip_client.revoke", object_type="kmip_client",
                                object_id=str(client.id), details={"name": client.name, "serial": client.serial})
        return client

    def authenticate(self, cert: x509.Certificate, *, source_ip: str | None = None) -> Principal:
        """The principal behind a TLS client certificate (already chain-verified by the
        TLS layer against our CA). Unknown or revoked → refused, and revoked is audited."""
        der = cert.public_bytes(serialization.Encoding.DER)
        notifier = self._notifier
        # Only while this process hears revocations made by the others.
        if notifier is not None and notifier.healthy:
            hit = self._cache.get(der)
            if hit is not None and time.monotonic() - hit[1] < self._cache_seconds:
                return hit[0]
        started, generation = time.monotonic(), self._generation
        serial = serial_hex(cert)
        with self._read() as s:
            client = s.execute(select(KmipClient).where(KmipClient.serial == serial)).scalar_one_or_none()
        if client is None or not hmac.compare_digest(client.fingerprint_sha256, fingerprint(cert)):
            raise Unauthenticated("unknown client certificate", code="kmip_client_unknown")
        if client.revoked_at is not None:
            from keyserver.core.principal import ANONYMOUS

            self._audit.record_now(RequestContext(ANONYMOUS, source_ip), action="kmip.reject", outcome="denied",
                                   object_type="kmip_client", object_id=str(client.id),
                                   details={"name": client.name, "reason": "revoked"})
            raise Forbidden(f"KMIP client '{client.name}' is revoked", code="kmip_client_revoked")
        principal = principal_for(client)
        if notifier is not None:
            with self._cache_lock:
                if generation == self._generation:
                    if len(self._cache) > 10_000:
                        self._cache.clear()
                    # Keyed by the whole certificate: a hit is exactly the certificate checked above.
                    self._cache[der] = (principal, started)
        return principal
