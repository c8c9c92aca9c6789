"""The relational schema. Alembic revisions in `migrations/` are the only way it is
created; this module is what the code maps onto it.

Key material appears only as `wrapped_key` (ciphertext under a KEK) together with the
wrapping key id and mechanism, so every blob says how to undo it.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    Uuid,
)
from sqlalchemy import true as sa_true
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from keyserver.store.types import UTCDateTime

BIGINT = BigInteger().with_variant(Integer, "sqlite")  # SQLite autoincrements INTEGER only


def mapped_here(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """For Alembic's comparisons: what these models describe. The word index of
    audit_search (migration 0019) is each store's own: an expression index on PostgreSQL,
    an FTS5 virtual table with shadow tables of its own on SQLite."""
    return not (name is not None and (name == "ix_audit_search_terms" or name.startswith("audit_search_fts")))


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {datetime: UTCDateTime, dict[str, Any]: JSON, list[str]: JSON}


class ManagedKey(Base):
    __tablename__ = "managed_keys"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    # Not unique (0009): a KMIP Name is a label, and a destroyed key's name is free again.
    # REST keeps one live key per name (KeyService.create) so that /keys/{name} is one key.
    name: Mapped[str] = mapped_column(String(128), index=True)
    description: Mapped[str] = mapped_column(Text, default="")
    owner: Mapped[str] = mapped_column(String(128))
    tags: Mapped[dict[str, Any]] = mapped_column(default=dict)
    algorithm: Mapped[str] = mapped_column(String(16), default="AES")
    length_bits: Mapped[int] = mapped_column(Integer, default=256)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    rotation_period_days: Mapped[int | None] = mapped_column(Integer)
    next_rotation_at: Mapped[datetime | None] = mapped_column(index=True)
    # Bumped on every change so optimistic readers (and the API's ETag) see it.
    revision: Mapped[int] = mapped_column(Integer, default=1)
    # Standard KMIP attributes clients may set (0009): Contact Information, Object Group, Application Specific Info.
    kmip_attributes: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # False: the key's material never leaves in plaintext (KMIP Get), whoever asks; it may
    # still leave wrapped under another key, inside the HSM.
    exportable: Mapped[bool] = mapped_column(Boolean, default=True, server_default=sa_true())
    # KMIP tenancy (0026, docs/kmip.md): its group's clients see it; None: none until assigned or granted.
    kmip_group: Mapped[str | None] = mapped_column(String(64), index=True)

    versions: Mapped[list[KeyVersion]] = relationship(
        back_populates="key", order_by="KeyVersion.version", lazy="selectin"
    )


class KeyVersion(Base):
    __tablename__ = "key_versions"
    __table_args__ = (UniqueConstraint("key_id", "version"),)

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    key_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("managed_keys.id", ondelete="RESTRICT"))
    version: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(32), index=True)
    # Null once destroyed: the material is erased, the metadata stays.
    wrapped_key: Mapped[bytes | None] = mapped_column(LargeBinary)
    wrapping_key_id: Mapped[str | None] = mapped_column(String(128), index=True)
    wrapping_mechanism: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime]
    activation_date: Mapped[datetime | None]
    deactivation_date: Mapped[datetime | None]
    compromise_date: Mapped[datetime | None]
    destroy_date: Mapped[datetime | None]
    revocation_reason: Mapped[str | None] = mapped_column(String(64))
    revocation_message: Mapped[str | None] = mapped_column(Text)

    # AES-GCM encryptions reserved under this version (core/gcm.py: NIST SP 800-38D's 2^32).
    gcm_invocations: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    key: Mapped[ManagedKey] = relationship(back_populates="versions")


class User(Base):
    __tablename__ = "users"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    username: Mapped[str] = mapped_column(String(64), unique=True)
    full_name: Mapped[str] = mapped_column(String(200), default="")
    role: Mapped[str] = mapped_column(String(32))
    password_hash: Mapped[str] = mapped_column(String(255))
    must_change_password: Mapped[bool] = mapped_column(Boolean, default=False)
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime]
    password_changed_at: Mapped[datetime]
    last_login_at: Mapped[datetime | None]
    failed_logins: Mapped[int] = mapped_column(Integer, default=0)
    locked_until: Mapped[datetime | None]
    # A second factor (RFC 6238 TOTP): its secret sealed under a DEK wrapped under the
    # KEK (core/kmip_sealed.py), whether it is confirmed, and the last time step used
    # (a code is accepted once). None: no second factor.
    totp: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)


class BrowserSession(Base):
    __tablename__ = "browser_sessions"

    # SHA-256 of the cookie value: a database reader cannot replay sessions.
    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    csrf_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    last_seen_at: Mapped[datetime]
    source_ip: Mapped[str | None] = mapped_column(String(64))
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    # Public, non-secret part of the token, used to find the row; the secret is hashed.
    lookup_id: Mapped[str] = mapped_column(String(32), unique=True)
    secret_hash: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(100))
    user_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    scopes: Mapped[list[str]] = mapped_column(default=list)
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]

    user: Mapped[User] = relationship(lazy="joined")


class AuditInbox(Base):
    """Records written in the same transaction as the action they describe; the chainer
    moves them into `audit_events` in batches, so no action commits without its record
    and no request waits on the chain head."""

    __tablename__ = "audit_inbox"

    id: Mapped[int] = mapped_column(BIGINT, primary_key=True, autoincrement=True)
    payload: Mapped[dict[str, Any]] = mapped_column()


class AuditEvent(Base):
    __tablename__ = "audit_events"
    __table_args__ = (
        Index("ix_audit_events_time", "time"),
        # A hash index (PostgreSQL): a path of 4,096 bytes is too long for a B-tree entry.
        Index("ix_audit_events_object", "object_id", postgresql_using="hash"),
        Index("ix_audit_events_actor", "actor"),
    )

    seq: Mapped[int] = mapped_column(BIGINT, primary_key=True, autoincrement=False)
    time: Mapped[datetime]
    actor: Mapped[str] = mapped_column(String(300))  # "enrolling:" and a 253-character hostname
    actor_type: Mapped[str] = mapped_column(String(16))
    action: Mapped[str] = mapped_column(String(64), index=True)
    object_type: Mapped[str | None] = mapped_column(String(32))
    object_id: Mapped[str | None] = mapped_column(Text)  # whole: a path is never cut (migration 0023)
    outcome: Mapped[str] = mapped_column(String(16), index=True)
    source_ip: Mapped[str | None] = mapped_column(String(64))
    request_id: Mapped[str | None] = mapped_column(String(64))
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))


class AuditHourly(Base):
    """Chained audit records counted per hour and outcome, kept by the chainer in the
    transaction that chains them: the console's activity chart reads a few rows per hour,
    never the records (docs/audit.md "Activity counts")."""

    __tablename__ = "audit_hourly"

    hour: Mapped[datetime] = mapped_column(primary_key=True)
    outcome: Mapped[str] = mapped_column(String(16), primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger)


class AuditRefusalsHourly(Base):
    """Refused and failed records counted per hour, actor, action and reason (the same
    transaction): who and what was refused most. Allowed traffic, nearly all of the
    records, is not broken down, so these rows stay few."""

    __tablename__ = "audit_refusals_hourly"

    hour: Mapped[datetime] = mapped_column(primary_key=True)
    actor: Mapped[str] = mapped_column(String(300), primary_key=True)
    action: Mapped[str] = mapped_column(String(64), primary_key=True)
    reason: Mapped[str] = mapped_column(String(64), primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger)


class AuditSearch(Base):
    """Each chained record's words, made by the chainer (keyserver.core.audit_search) in
    the transaction that chains it: what the audit log's full-text search matches. The
    word index is the store's own — a GIN index of `to_tsvector('simple', terms)` on
    PostgreSQL, the FTS5 table `audit_search_fts` on SQLite — over the same words, so a
    search finds the same records on both (migration 0019)."""

    __tablename__ = "audit_search"

    seq: Mapped[int] = mapped_column(BIGINT, primary_key=True, autoincrement=False)
    terms: Mapped[str] = mapped_column(Text)


class AuditUsageHourly(Base):
    """Allowed operations on keys counted per hour, key, actor and action (the chainer's
    transaction): the console's usage charts per key and per host or client."""

    __tablename__ = "audit_usage_hourly"
    __table_args__ = (Index("ix_audit_usage_hourly_actor", "actor", "hour"),)

    key_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    hour: Mapped[datetime] = mapped_column(primary_key=True)
    actor: Mapped[str] = mapped_column(String(300), primary_key=True)
    action: Mapped[str] = mapped_column(String(64), primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger)


class Replica(Base):
    """A key server process, as it reports itself every scheduler interval
    (keyserver.core.replicas): what the System page lists."""

    __tablename__ = "replicas"

    id: Mapped[str] = mapped_column(String(240), primary_key=True)  # hostname:pid:start
    hostname: Mapped[str] = mapped_column(String(253))
    pid: Mapped[int] = mapped_column(Integer)
    version: Mapped[str] = mapped_column(String(64))
    store: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[datetime]
    last_seen_at: Mapped[datetime] = mapped_column(index=True)
    # Its scheduler's last run (due rotations, KEK re-wrapping): when, and what failed.
    scheduler_error: Mapped[str | None] = mapped_column(String(500))


class AuditHead(Base):
    """One row: the chain's last sequence number and hash. Locking it serialises only
    the chainer, never the requests."""

    __tablename__ = "audit_head"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger)
    hash: Mapped[str] = mapped_column(String(64))
    hmac_key_id: Mapped[str] = mapped_column(String(128))


class AuditCheckpoint(Base):
    """A signed statement "the chain held `seq` records, the last with hash `hash`",
    made by the chainer every N records or T seconds and signed inside the HSM with an
    EC key that is not the chain's HMAC key. Checkpoints chain too (`prev_digest`), and
    sinks carry copies off the server: a copy outside detects truncation, wipe and a
    chain re-MACed by someone holding the token (docs/audit.md)."""

    __tablename__ = "audit_checkpoints"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    seq: Mapped[int] = mapped_column(BigInteger)
    hash: Mapped[str] = mapped_column(String(64))
    time: Mapped[datetime]
    prev_digest: Mapped[str] = mapped_column(String(64))
    key_fingerprint: Mapped[str] = mapped_column(String(64))
    signature: Mapped[str] = mapped_column(Text)  # base64 of the DER ECDSA signature


class AuditVerified(Base):
    """One row: how far `verify-audit` has checked the chain (its checkpoint, record and
    when), so the next run starts there and the console shows it without re-walking."""

    __tablename__ = "audit_verified"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    checkpoint: Mapped[int] = mapped_column(BigInteger)
    seq: Mapped[int] = mapped_column(BigInteger)
    hash: Mapped[str] = mapped_column(String(64))
    verified_at: Mapped[datetime]
    # HMAC under the chain's HSM key over (checkpoint, seq, hash): a row without a valid
    # one is not trusted, and the next run walks every record (migration 0022).
    mac: Mapped[str | None] = mapped_column(String(64))


class AuditSinkCursor(Base):
    """How far a sink has accepted the chain: the delivery spool is the chain itself
    (core/audit_sinks.py). One row per configured sink, shared by the replicas."""

    __tablename__ = "audit_sink_cursors"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger)
    checkpoint: Mapped[int] = mapped_column(BigInteger)
    delivered_at: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)
    failing_since: Mapped[datetime | None]


class ApprovalRequest(Base):
    """An action held for approval by other people (core/approvals.py)."""

    __tablename__ = "approval_requests"
    __table_args__ = (Index("ix_approval_requests_created_at", "created_at"),)

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    action: Mapped[str] = mapped_column(String(32))
    target: Mapped[str] = mapped_column(String(200))
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    requested_by: Mapped[str] = mapped_column(String(200))
    requester_user_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    required: Mapped[int] = mapped_column(Integer)
    approvals: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    # pending → approved → executed | failed; pending → rejected | expired
    state: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    decided_at: Mapped[datetime | None]
    result: Mapped[str | None] = mapped_column(Text)


class ChangeCounter(Base):
    """One row, bumped by every change that must drop cached credentials or key states
    in other processes: on SQLite they poll it, as PostgreSQL's LISTEN/NOTIFY tells
    replicas (keyserver/store/notify.py)."""

    __tablename__ = "change_counter"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger)


class Kek(Base):
    """Which HSM key-encryption key is current. The key itself never leaves the HSM.

    active: the current one. retiring: a rotation away from it is running (it still
    serves reads). superseded: the rotation finished; it is still in the token.
    retired: removed from the token (`keyserver retire-kek`), when and by whom.
    """

    __tablename__ = "keks"

    kek_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))  # active | retiring | superseded | retired
    created_at: Mapped[datetime]
    superseded_at: Mapped[datetime | None]
    retired_at: Mapped[datetime | None]
    retired_by: Mapped[str | None] = mapped_column(String(200))


class KekRotation(Base):
    __tablename__ = "kek_rotations"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    from_kek_id: Mapped[str] = mapped_column(String(128))
    to_kek_id: Mapped[str] = mapped_column(String(128))
    state: Mapped[str] = mapped_column(String(16))  # running | completed | failed
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    total: Mapped[int] = mapped_column(Integer, default=0)
    done: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    requested_by: Mapped[str] = mapped_column(String(200))
    # Per kind of wrapped thing (core/kek.py KINDS): {"done": n, "total": m}; total and
    # done above are their sums.
    progress: Mapped[dict[str, Any]] = mapped_column(default=dict, server_default="{}")


class KmipCa(Base):
    """The internal CA of the KMIP listener (one row). Its private key is stored only
    as AES-256-GCM ciphertext made inside the HSM under a data-encryption key that is
    itself wrapped under a KEK (docs/decisions/0005-kmip-internal-ca.md)."""

    __tablename__ = "kmip_ca"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    certificate_pem: Mapped[str] = mapped_column(Text)
    sealed_private_key: Mapped[bytes] = mapped_column(LargeBinary)
    dek_wrapped: Mapped[bytes] = mapped_column(LargeBinary)
    dek_wrapping_key_id: Mapped[str] = mapped_column(String(128))
    dek_mechanism: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime]


class KmipClient(Base):
    """A KMIP client identity: a certificate from the internal CA mapped to a role.
    `serial` is checked on every connection and every request."""

    __tablename__ = "kmip_clients"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(32))
    serial: Mapped[str] = mapped_column(String(64), unique=True)
    fingerprint_sha256: Mapped[str] = mapped_column(String(64))
    not_after: Mapped[datetime]
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(200))
    revoked_at: Mapped[datetime | None]
    # What key material may leave to this client (core/kmip_clients.py KEY_EXPORT):
    # "plaintext" (KMIP's behaviour), "wrapped" (only under another key) or "none".
    key_export: Mapped[str] = mapped_column(String(16), default="plaintext", server_default="plaintext")
    group: Mapped[str | None] = mapped_column(String(64), index=True)  # KMIP tenancy (0026); None: its name


class KmipPublicKey(Base):
    """An RSA public key registered over KMIP, usable to wrap keys delivered by Get."""

    __tablename__ = "kmip_public_keys"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    name: Mapped[str | None] = mapped_column(String(128), index=True)
    owner: Mapped[str] = mapped_column(String(200))
    der: Mapped[bytes] = mapped_column(LargeBinary)
    length_bits: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime]
    # Added in 0005: the public half of a pair made by CreateKeyPair, and a lifecycle of
    # its own (registered public keys are Active from the start).
    private_key_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    activation_date: Mapped[datetime | None]
    deactivation_date: Mapped[datetime | None]
    compromise_date: Mapped[datetime | None]
    destroy_date: Mapped[datetime | None]
    revocation_reason: Mapped[str | None] = mapped_column(String(64))
    kmip_attributes: Mapped[dict[str, Any]] = mapped_column(default=dict)  # as ManagedKey's (0009)
    kmip_group: Mapped[str | None] = mapped_column(String(64), index=True)


class KmipSealedObject(Base):
    """A KMIP object that is not a managed AES key: a private key (generated in the HSM by
    CreateKeyPair, or registered), secret data, or a certificate.

    Secret material (private keys, secret data) is stored only sealed: `material` is
    RFC 5649 AES Key Wrap with Padding (`mechanism` = AES-KWP) under a per-object AES-256
    key, `dek_*`, that exists outside the HSM only wrapped under a KEK. Certificates are
    public: their DER is stored as it is (`mechanism` NULL). Destroy clears material and key.
    """

    __tablename__ = "kmip_sealed_objects"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    object_type: Mapped[str] = mapped_column(String(32), index=True)  # private-key | secret-data | certificate
    name: Mapped[str | None] = mapped_column(String(128), index=True)
    owner: Mapped[str] = mapped_column(String(200))
    algorithm: Mapped[str | None] = mapped_column(String(16))  # RSA for private keys
    length_bits: Mapped[int | None] = mapped_column(Integer)
    # The KMIP sub-type: Secret Data Type (password, seed) or Certificate Type (x509).
    data_type: Mapped[str | None] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(32))
    public_key_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    dek_wrapping_key_id: Mapped[str | None] = mapped_column(String(128))
    dek_mechanism: Mapped[str | None] = mapped_column(String(32))
    dek_ciphertext: Mapped[bytes | None] = mapped_column(LargeBinary)
    mechanism: Mapped[str | None] = mapped_column(String(32))
    material: Mapped[bytes | None] = mapped_column(LargeBinary)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    activation_date: Mapped[datetime | None]
    deactivation_date: Mapped[datetime | None]
    compromise_date: Mapped[datetime | None]
    destroy_date: Mapped[datetime | None]
    revocation_reason: Mapped[str | None] = mapped_column(String(64))
    kmip_attributes: Mapped[dict[str, Any]] = mapped_column(default=dict)  # as ManagedKey's (0009)
    kmip_group: Mapped[str | None] = mapped_column(String(64), index=True)


class EnrollmentToken(Base):
    """A one-time (or N-use) secret with which a new host enrolls. Only its hash is kept."""

    __tablename__ = "enrollment_tokens"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    lookup_id: Mapped[str] = mapped_column(String(32), unique=True)
    secret_hash: Mapped[str] = mapped_column(String(64))
    host_group: Mapped[str] = mapped_column(String(64), index=True)
    max_uses: Mapped[int] = mapped_column(Integer, default=1)
    uses: Mapped[int] = mapped_column(Integer, default=0)
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]


class Host(Base):
    """An enrolled storage host: its certificate (from the internal CA) and its public key,
    under which keys are delivered."""

    __tablename__ = "hosts"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    hostname: Mapped[str] = mapped_column(String(253), index=True)
    host_group: Mapped[str] = mapped_column(String(64), index=True)
    os: Mapped[str] = mapped_column(String(200), default="")
    agent_version: Mapped[str] = mapped_column(String(64), default="")
    cert_serial: Mapped[str] = mapped_column(String(64), unique=True)
    cert_pem: Mapped[str] = mapped_column(Text)
    public_key_der: Mapped[bytes] = mapped_column(LargeBinary)
    state: Mapped[str] = mapped_column(String(16), default="active")  # active | revoked
    enrolled_at: Mapped[datetime]
    last_heartbeat_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    token_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("enrollment_tokens.id", ondelete="SET NULL"))
    # As the agent last reported them (heartbeat): where it calls from, its guard points.
    last_seen_ip: Mapped[str | None] = mapped_column(String(64))
    guard_points: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list, server_default="[]")


class HostHeartbeatHourly(Base):
    """Heartbeats per host and hour: the host's online timeline (an hour with none is an
    hour the host was not heard from)."""

    __tablename__ = "host_heartbeats_hourly"

    host_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"), primary_key=True)
    hour: Mapped[datetime] = mapped_column(primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger)


class GuardPoint(Base):
    """A protected directory on a host or on every host of a group: its key, chunk
    size, mode and ordered access rules (docs/guardpoints.md)."""

    __tablename__ = "guard_points"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    host_group: Mapped[str | None] = mapped_column(String(64), index=True)
    host_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"), index=True)
    path: Mapped[str] = mapped_column(String(1024))
    backing_path: Mapped[str] = mapped_column(String(1024))
    key_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("managed_keys.id", ondelete="RESTRICT"))
    chunk_size: Mapped[int] = mapped_column(Integer)
    mode: Mapped[str] = mapped_column(String(16))  # enforce | learn | off
    rules: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    default_effect: Mapped[str] = mapped_column(String(8))  # permit | deny
    revision: Mapped[int] = mapped_column(Integer)
    # Bumped by a re-key request: hosts re-encrypt every file that existed before it.
    rekey_generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    unprotect_generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class Volume(Base):
    """A LUKS2 block volume on a host, unlocked only through the key server: its keyslot
    passphrase is a data key sealed under `key_id`'s version `key_version`, kept in the
    volume's own header (docs/volumes.md). Who may open it: the host that made it, or
    every host of its group when `scope` is `group` (shared SAN storage)."""

    __tablename__ = "volumes"
    __table_args__ = (UniqueConstraint("host_id", "name", name="uq_volumes_host_name"),)

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    host_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("hosts.id", ondelete="CASCADE"), index=True)
    host_group: Mapped[str] = mapped_column(String(64), index=True)
    scope: Mapped[str] = mapped_column(String(8), default="host")  # host | group
    name: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(String(1024))
    key_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("managed_keys.id", ondelete="RESTRICT"), index=True)
    key_version: Mapped[int] = mapped_column(Integer)
    luks_uuid: Mapped[str | None] = mapped_column(String(36))
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    sector_size: Mapped[int] = mapped_column(Integer, default=4096)
    # created | open | closed | rekeying | revoked
    state: Mapped[str] = mapped_column(String(16), default="created", index=True)
    opened_by: Mapped[str | None] = mapped_column(String(16))  # userspace | dm-crypt: how it is open
    # A re-key asked for (generation up) and how far the host has got with it.
    rekey_generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    rekey_applied: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    rekey_progress: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    recovery_created_at: Mapped[datetime | None]
    # How long a host may open the volume without the server after its last unseal
    # (0: never, fail closed). Set by people with volumes:manage; docs/volumes.md.
    grace_seconds: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    revoked_at: Mapped[datetime | None]
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    last_opened_at: Mapped[datetime | None]
