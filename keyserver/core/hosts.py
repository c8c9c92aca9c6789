"""Storage hosts: enrollment with one-time tokens, their certificates from the internal
CA, revocation, and delivery of keys re-wrapped under each host's own public key.

A host generates its RSA-2048 key pair itself and sends a CSR with its token; the private
key never travels. Tokens are kept as SHA-256 only. A host may receive the keys tagged
`host-group=<its group>` and the keys of the guard points that apply to it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from sqlalchemy import Select, func, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from hsm import HsmBackend, HsmError, WrappedKey
from keyserver.core.audit import AuditService, Outcome, utcnow
from keyserver.core.ca import CertificateAuthority, serial_hex
from keyserver.core.errors import Conflict, Forbidden, InvalidInput, NotFound, Unauthenticated, hsm_failure
from keyserver.core.identity.records import check_secret, mint_secret, split_secret
from keyserver.core.keys import key_filter, require_aes, version_wrapped
from keyserver.core.permissions import Permission
from keyserver.core.policy import Policy
from keyserver.core.principal import ANONYMOUS, Principal, RequestContext
from keyserver.core.states import DECRYPTABLE, DESTROYED_STATES, KeyState
from keyserver.store.db import upsert_counts
from keyserver.store.models import EnrollmentToken, GuardPoint, Host, HostHeartbeatHourly, KeyVersion, ManagedKey
from keyserver.store.notify import Notifier, Topic
from keyserver.store.retirement import VersionRetirement

TOKEN_PREFIX = "sre_"  # noqa: S105 - a public prefix, not a secret
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOSTNAME_RE = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")
GROUP_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
HOST_GROUP_TAG = "host-group"
EVENT_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,30}(\.[a-z][a-z0-9_]{0,30}){0,3}$")
# Events an agent reports when it refused someone: audited as denials.
DENIAL_EVENTS = frozenset({"access.denied"})
# A guard point's data plane answered an application EIO (a file that does not
# authenticate) or ENOKEY (a key version the host does not hold).
ERROR_EVENTS = frozenset({"guardpoint.integrity_error", "guardpoint.key_missing"})


HOST_STATUSES = ("online", "offline", "revoked")


def _guard_point_keys(s: Session, host: Host) -> set[uuid.UUID]:
    return set(s.execute(select(GuardPoint.key_id).where(
        or_(GuardPoint.host_id == host.id, GuardPoint.host_group == host.host_group))).scalars())


def may_receive(s: Session, host: Host, key: ManagedKey) -> bool:
    """A host may use a key tagged for its group, or the key of one of its guard points."""
    return key.tags.get(HOST_GROUP_TAG) == host.host_group or key.id in _guard_point_keys(s, host)
# What a host list can be sorted by (GET /hosts?sort=…).
HOST_SORTABLE: dict[str, Any] = {
    "hostname": Host.hostname, "host_group": Host.host_group, "enrolled_at": Host.enrolled_at,
    "last_heartbeat_at": Host.last_heartbeat_at, "agent_version": Host.agent_version,
}


@dataclass(frozen=True, slots=True)
class HostPage:
    hosts: list[Host]
    total: int
    counts: dict[str, int]  # per status, over the other filters
    groups: list[str]  # every host group that has hosts


@dataclass(frozen=True, slots=True)
class IssuedEnrollmentToken:
    token: EnrollmentToken
    secret: str  # shown once


@dataclass(frozen=True, slots=True)
class Enrollment:
    host: Host
    certificate_pem: bytes
    ca_pem: bytes


@dataclass(frozen=True, slots=True)
class AgentEvent:
    """One event from an agent's spool, validated by the caller's schema."""

    name: str
    time: float
    object_type: str | None
    object_id: str | None
    fields: dict[str, Any]


@dataclass(frozen=True, slots=True)
class DeliveredKey:
    key_id: uuid.UUID
    key_name: str
    version: int
    state: str
    wrapped: WrappedKey


class HostService:
    def __init__(self, session_factory: sessionmaker[Session], hsm: HsmBackend, audit: AuditService,
                 policy: Policy, ca: CertificateAuthority, notifier: Notifier, *, cert_days: int = 365,
                 heartbeat_seconds: int = 30, now: Callable[[], datetime] = utcnow) -> None:
        self._db = session_factory
        self._hsm = hsm
        self._audit = audit
        self._policy = policy
        self._ca = ca
        self._notifier = notifier
        self._cert_days = cert_days
        self.heartbeat_seconds = heartbeat_seconds
        self._offline_after = timedelta(seconds=3 * heartbeat_seconds)
        self._now = now

    # --- enrollment tokens --------------------------------------------------------------
    def create_token(self, ctx: RequestContext, *, host_group: str, max_uses: int = 1,
                     expires_in_hours: int = 24) -> IssuedEnrollmentToken:
        self._policy.require(ctx, Permission.HOSTS_ENROLL, action="enrollment_token.create",
                             object_type="host_group", object_id=host_group)
        if not GROUP_RE.match(host_group):
            raise InvalidInput("a host group is 1-64 characters: lower-case letters, digits and . _ -")
        if not 1 <= max_uses <= 10_000 or not 1 <= expires_in_hours <= 24 * 30:
            raise InvalidInput("max_uses must be 1-10000 and expires_in_hours 1-720")
        now = self._now()
        minted = mint_secret(TOKEN_PREFIX)
        token = EnrollmentToken(id=uuid.uuid4(), lookup_id=minted.lookup, secret_hash=minted.secret_hash,
                                host_group=host_group, max_uses=max_uses, uses=0, created_by=ctx.principal.name,
                                created_at=now, expires_at=now + timedelta(hours=expires_in_hours))
        with self._db.begin() as s:
            s.add(token)
            self._audit.add(s, ctx, action="enrollment_token.create", object_type="enrollment_token",
                            object_id=str(token.id), details={"host_group": host_group, "max_uses": max_uses})
        return IssuedEnrollmentToken(token, minted.token)

    def list_tokens(self, ctx: RequestContext) -> list[EnrollmentToken]:
        self._policy.require(ctx, Permission.HOSTS_READ, action="enrollment_token.list")
        with self._db() as s:
            return list(s.execute(select(EnrollmentToken).order_by(EnrollmentToken.created_at.desc())).scalars())

    def revoke_token(self, ctx: RequestContext, token_id: uuid.UUID) -> EnrollmentToken:
        self._policy.require(ctx, Permission.HOSTS_ENROLL, action="enrollment_token.revoke",
                             object_type="enrollment_token", object_id=str(token_id))
        with self._db.begin() as s:
            token = s.get(EnrollmentToken, token_id)
            if token is None:
                raise NotFound(f"no enrollment token {token_id}", code="enrollment_token_not_found")
            if token.revoked_at is not None:
                raise Conflict("this enrollment token is already revoked", code="enrollment_token_revoked")
            token.revoked_at = self._now()
            self._audit.add(s, ctx, action="enrollment_token.revoke", object_type="enrollment_token",
                            object_id=str(token_id))
        return token

    # --- enrollment ---------------------------------------------------------------------
    def enroll(self, *, token: str, csr_pem: str, hostname: str, os_name: str = "", agent_version: str = "",
               source_ip: str | None = None, request_id: str | None = None) -> Enrollment:
        """Called by a new host with its token and CSR: returns its certificate."""
        ctx = RequestContext(Principal(name=f"enrolling:{hostname}", actor_type="host", role=None,
                                       permissions=frozenset()), source_ip, request_id)

        def refuse(reason: str, message: str, session: Session | None = None) -> Unauthenticated:
            fields: dict[str, Any] = {"action": "host.enroll", "outcome": "denied", "object_type": "host",
                                      "object_id": hostname, "details": {"reason": reason}}
            if session is None:
                self._audit.record_now(ctx, **fields)
            else:
                self._audit.record_after(session, ctx, **fields)
            return Unauthenticated(message, code=f"enrollment_{reason}")

        if not HOSTNAME_RE.match(hostname):
            raise InvalidInput("hostname must be a DNS name (letters, digits, - and .)")
        try:
            csr = x509.load_pem_x509_csr(csr_pem.encode())
        except ValueError:
            raise InvalidInput("csr is not a PEM certificate signing request") from None
        public_key = csr.public_key()
        if not csr.is_signature_valid:
            raise InvalidInput("the CSR's signature does not verify")
        if not isinstance(public_key, rsa.RSAPublicKey) or public_key.key_size < 2048:
            raise InvalidInput("the host key must be RSA with at least 2048 bits")
        parts = split_secret(TOKEN_PREFIX, token)
        if parts is None:
            raise refuse("invalid", "malformed enrollment token")
        lookup, secret = parts
        now = self._now()
        self._ca.ensure()  # before the transaction: it may read the CA's key again (KEK rotation)
        with self._audit.transaction() as s:
            row = s.execute(select(EnrollmentToken).where(EnrollmentToken.lookup_id == lookup)
                            .with_for_update()).scalar_one_or_none()
            if not check_secret(secret, row.secret_hash if row else None) or row is None:
                refusal = ("invalid", "unknown enrollment token; ask an operator for a new one")
            elif row.revoked_at is not None:
                refusal = ("revoked", "this enrollment token was revoked; ask an operator for a new one")
            elif row.expires_at <= now:
                refusal = ("expired", "this enrollment token has expired; ask an operator for a new one")
            elif row.uses >= row.max_uses:
                refusal = ("used", "this enrollment token has been used up; ask an operator for a new one")
            else:
                refusal = None
            if refusal is not None:
                raise refuse(*refusal, session=s)
            assert row is not None
            cert = self._ca.issue_client(name=hostname, public_key=public_key, days=self._cert_days)
            der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
            host = Host(id=uuid.uuid4(), hostname=hostname, host_group=row.host_group, os=os_name[:200],
                        agent_version=agent_version[:64], cert_serial=serial_hex(cert),
                        cert_pem=cert.public_bytes(serialization.Encoding.PEM).decode(), public_key_der=der,
                        state="active", enrolled_at=now, token_id=row.id)
            row.uses += 1
            # Re-enrollment with the same host key replaces the earlier record: one
            # active identity per host key, the old certificate refused from now on.
            replaced = list(s.execute(select(Host.id).where(Host.public_key_der == der, Host.state == "active"))
                            .scalars())
            if replaced:
                s.execute(update(Host).where(Host.id.in_(replaced)).values(state="revoked", revoked_at=now))
            s.add(host)
            self._audit.add(s, ctx, action="host.enroll", object_type="host", object_id=str(host.id),
                            details={"hostname": hostname, "host_group": row.host_group,
                                     "serial": host.cert_serial, "replaces": [str(h) for h in replaced]})
        return Enrollment(host, cert.public_bytes(serialization.Encoding.PEM), self._ca.certificate_pem())

    # --- hosts ----------------------------------------------------------------------------
    def list_hosts(self, ctx: RequestContext, *, q: str | None = None, group: str | None = None,
                   status: str | None = None, sort: str = "hostname", limit: int = 500,
                   offset: int = 0) -> HostPage:
        """A page of hosts: `q` is a substring of the hostname, group, last address or OS
        (any case); `status` online, offline or revoked; `sort` a column of HOST_SORTABLE,
        "-" first for descending (never-seen hosts last, ties by hostname). The counts per
        status are over the other filters, for the status tabs."""
        self._policy.require(ctx, Permission.HOSTS_READ, action="host.list")
        if not 1 <= limit <= 500 or offset < 0:
            raise InvalidInput("limit must be 1-500 and offset >= 0")
        column = HOST_SORTABLE.get(sort.removeprefix("-"))
        if column is None:
            raise InvalidInput(f"sort by one of {', '.join(HOST_SORTABLE)} (with '-' first for descending)")
        if status not in (None, *HOST_STATUSES):
            raise InvalidInput(f"status is one of {', '.join(HOST_STATUSES)}")
        seen_since = self._now() - self._offline_after
        online = (Host.state == "active") & (Host.last_heartbeat_at >= seen_since)
        by_status = {"online": online, "revoked": Host.state == "revoked",
                     "offline": (Host.state == "active") & or_(Host.last_heartbeat_at.is_(None),
                                                                Host.last_heartbeat_at < seen_since)}
        stmt: Select[Any] = select(Host)
        if q:
            like = f"%{q.lower()}%"
            stmt = stmt.where(or_(*(func.lower(c).like(like) for c in (
                Host.hostname, Host.host_group, Host.last_seen_ip, Host.os))))
        if group:
            stmt = stmt.where(Host.host_group == group)
        with self._db() as s:
            counts = {name: int(s.execute(select(func.count()).select_from(stmt.where(cond).subquery()))
                                .scalar_one()) for name, cond in by_status.items()}
            if status:
                stmt = stmt.where(by_status[status])
            total = counts[status] if status else sum(counts.values())
            order = [column.is_(None), column.desc() if sort.startswith("-") else column.asc(), Host.hostname]
            rows = list(s.execute(stmt.order_by(*order).limit(limit).offset(offset)).scalars())
            groups = list(s.execute(select(Host.host_group).distinct().order_by(Host.host_group)).scalars())
        return HostPage(rows, total, counts, groups)

    def get_host(self, ctx: RequestContext, host_id: uuid.UUID) -> Host:
        self._policy.require(ctx, Permission.HOSTS_READ, action="host.read", object_type="host",
                             object_id=str(host_id))
        with self._db() as s:
            host = s.get(Host, host_id)
        if host is None:
            raise NotFound(f"no host {host_id}", code="host_not_found")
        return host

    def revoke_host(self, ctx: RequestContext, host_id: uuid.UUID) -> Host:
        """The host's certificate is refused from its next call on (serial checked on
        every call); the agent drops its cached keys when it is told so."""
        self._policy.require(ctx, Permission.HOSTS_REVOKE, action="host.revoke", object_type="host",
                             object_id=str(host_id))
        with self._db.begin() as s:
            host = s.get(Host, host_id)
            if host is None:
                raise NotFound(f"no host {host_id}", code="host_not_found")
            if host.state == "revoked":
                raise Conflict(f"host {host.hostname} is already revoked", code="host_revoked")
            host.state, host.revoked_at = "revoked", self._now()
            self._notifier.publish(s, Topic.PRINCIPALS)
            self._audit.add(s, ctx, action="host.revoke", object_type="host", object_id=str(host.id),
                            details={"hostname": host.hostname, "serial": host.cert_serial})
        return host

    def authenticate(self, cert_serial: str, *, source_ip: str | None = None,
                     request_id: str | None = None) -> tuple[RequestContext, Host]:
        """The host behind a verified client certificate; refused once revoked."""
        with self._db() as s:
            host = s.execute(select(Host).where(Host.cert_serial == cert_serial)).scalar_one_or_none()
        # A certificate we issued names its host, revoked or not: the refusal is the host's.
        principal = ANONYMOUS if host is None else Principal(
            name=f"host:{host.hostname}", actor_type="host", role=None, permissions=frozenset())
        if host is None or host.state != "active":
            self._audit.record_now(RequestContext(principal, source_ip, request_id), action="host.authenticate",
                                   outcome="denied", object_type="host",
                                   object_id=str(host.id) if host else cert_serial,
                                   details={"reason": "revoked" if host else "unknown"})
            raise Unauthenticated("this host's certificate is revoked or unknown; re-enroll the host",
                                  code="host_revoked" if host else "host_unknown")
        return RequestContext(principal, source_ip, request_id), host

    def heartbeat(self, host: Host, *, os_name: str, agent_version: str, guard_points: list[dict[str, Any]] | None,
                  source_ip: str | None) -> Host:
        """What the agent reports about itself; its last heartbeat makes it online."""
        values: dict[str, Any] = {"last_heartbeat_at": self._now(), "os": os_name[:200],
                                  "agent_version": agent_version[:64], "last_seen_ip": source_ip}
        if guard_points is not None:
            values["guard_points"] = guard_points
        hour = values["last_heartbeat_at"].replace(minute=0, second=0, microsecond=0)
        with self._db.begin() as s:
            s.execute(update(Host).where(Host.id == host.id).values(**values))
            upsert_counts(s, HostHeartbeatHourly, ["host_id", "hour"], {(host.id, hour): 1})
            fresh = s.get(Host, host.id)
            assert fresh is not None
        return fresh

    def heartbeats(self, ctx: RequestContext, host_id: uuid.UUID, *, since: datetime,
                   until: datetime) -> list[tuple[datetime, int]]:
        """The host's heartbeats per hour over [since, until), every hour listed (an hour
        with none: the host was not heard from)."""
        host = self.get_host(ctx, host_id)
        if since.tzinfo is None or until.tzinfo is None:
            raise InvalidInput("since and until need a time zone (e.g. 2026-11-25T10:00:00Z)")
        start = since.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        if not start < until or until - start > timedelta(days=31):
            raise InvalidInput("until must be after since, and at most 31 days later")
        with self._db() as s:
            seen = {h.astimezone(UTC): int(n) for h, n in s.execute(
                select(HostHeartbeatHourly.hour, HostHeartbeatHourly.count).where(
                    HostHeartbeatHourly.host_id == host.id, HostHeartbeatHourly.hour >= start,
                    HostHeartbeatHourly.hour < until))}
        hours = []
        at = start
        while at < until:
            hours.append((at, seen.get(at, 0)))
            at += timedelta(hours=1)
        return hours

    def is_online(self, host: Host) -> bool:
        seen = host.last_heartbeat_at
        return host.state == "active" and seen is not None and self._now() - seen <= self._offline_after

    def allowed_keys(self, host: Host) -> list[tuple[ManagedKey, int | None, list[int], list[int]]]:
        """The keys this host may receive (tagged for its group, or of its guard points),
        each with its Active version (None if none), the versions being retired, which
        the agent moves its guard points and volumes off (decision 0024), and the
        destroyed ones, which it wipes from its caches and data planes: a destroyed
        version must stop decrypting on hosts too, not only on the server."""
        with self._db() as s:
            keys = list(s.execute(select(ManagedKey).where(or_(
                ManagedKey.tags[HOST_GROUP_TAG].as_string() == host.host_group,
                ManagedKey.id.in_(_guard_point_keys(s, host)))).order_by(ManagedKey.name)).scalars())
            active: dict[uuid.UUID, int] = {}
            destroyed: dict[uuid.UUID, list[int]] = {}
            for key_id, version, state in s.execute(
                    select(KeyVersion.key_id, KeyVersion.version, KeyVersion.state).where(
                        KeyVersion.key_id.in_([k.id for k in keys]),
                        KeyVersion.state.in_([KeyState.ACTIVE.value, *(st.value for st in DESTROYED_STATES)]))
                    .order_by(KeyVersion.version)):
                if state == KeyState.ACTIVE.value:
                    active[key_id] = version
                else:
                    destroyed.setdefault(key_id, []).append(version)
            retiring: dict[uuid.UUID, list[int]] = {}
            for key_id, version in s.execute(select(VersionRetirement.key_id, VersionRetirement.version).where(
                    VersionRetirement.key_id.in_([k.id for k in keys]), VersionRetirement.state == "running")
                    .order_by(VersionRetirement.version)):
                retiring.setdefault(key_id, []).append(version)
        return [(k, active.get(k.id), retiring.get(k.id, []), destroyed.get(k.id, [])) for k in keys]

    def record_events(self, ctx: RequestContext, host: Host, events: list[AgentEvent]) -> int:
        """A batch of the agent's own events, as audit records of this host, in one
        transaction: a batch is recorded whole or not at all, so the agent's spool can
        resend it after a failure without gaps."""
        with self._db.begin() as s:
            for e in events:
                outcome: Outcome = "denied" if e.name in DENIAL_EVENTS else (
                    "error" if e.name.endswith("_failed") or e.name in ERROR_EVENTS else "allowed")
                details = {**e.fields, "host": str(host.id),
                           "reported_at": datetime.fromtimestamp(e.time, UTC).isoformat()}
                self._audit.add(s, ctx, action=f"agent.{e.name}", outcome=outcome, object_type=e.object_type,
                                object_id=e.object_id, details=details)
        return len(events)

    def deliver_key(self, ctx: RequestContext, host: Host, key_ref: str, version: int | None = None) -> DeliveredKey:
        """A key version re-wrapped inside the HSM under the host's public key."""
        with self._db() as s:
            key = s.execute(select(ManagedKey).where(key_filter(key_ref))).scalar_one_or_none()
            if key is None:
                raise NotFound(f"no key named or with id '{key_ref}'", code="key_not_found")
            require_aes(key, "delivery to a host")
            rows = s.execute(select(KeyVersion).where(KeyVersion.key_id == key.id)).scalars()
            versions = {v.version: v for v in rows}
            allowed = may_receive(s, host, key)
        if not allowed:
            self._audit.record_now(ctx, action="key.deliver", outcome="denied", object_type="key",
                                   object_id=str(key.id), details={"host": str(host.id), "name": key.name})
            raise Forbidden(f"host group '{host.host_group}' may not receive key '{key.name}'", code="forbidden")
        if version is None:
            active = [v for v in versions.values() if v.state == KeyState.ACTIVE.value]
            if not active:
                raise Conflict(f"key '{key.name}' has no active version", code="illegal_state")
            v = active[0]
        else:
            found = versions.get(version)
            if found is None:
                raise NotFound(f"key '{key.name}' has no version {version}", code="version_not_found")
            v = found
        if KeyState(v.state) not in DECRYPTABLE:
            self._audit.record_now(ctx, action="key.deliver", outcome="denied", object_type="key",
                                   object_id=str(key.id), details={"version": v.version, "state": v.state})
            raise Conflict(f"version {v.version} of '{key.name}' is {v.state}", code="illegal_state")
        try:
            wrapped = self._hsm.rewrap_for_public_key(version_wrapped(v), public_key_der=host.public_key_der)
        except HsmError as exc:
            raise hsm_failure("re-wrap the key for the host", exc) from exc
        self._audit.record_now(ctx, action="key.deliver", outcome="allowed", object_type="key",
                               object_id=str(key.id), details={"name": key.name, "host": str(host.id),
                                                               "version": v.version})
        return DeliveredKey(key.id, key.name, v.version, v.state, wrapped)
