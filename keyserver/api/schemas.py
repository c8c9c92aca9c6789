"""Request and response bodies of the REST API. Key material appears only in
`DataKeyPublic.plaintext` / `DecryptResult.plaintext` (base64), by design."""

from __future__ import annotations

import base64
import binascii
import uuid
from datetime import datetime
from typing import Annotated, Generic, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

T = TypeVar("T")


def _b64(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if not isinstance(value, str):
        raise ValueError("expected a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("not valid base64") from None


Base64Bytes = Annotated[bytes, BeforeValidator(_b64)]
Context = Annotated[dict[str, Annotated[str, Field(max_length=512)]], Field(max_length=32)]


# The largest integer a request may carry: every stored integer is a BIGINT, and one
# past it must be a 422, not a database error (a 500).
MAX_INT = 2**62


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int
    limit: int
    offset: int


# --- auth -------------------------------------------------------------------
class LoginRequest(Strict):
    username: str = Field(min_length=1, max_length=64)
    password: str = Field(min_length=1, max_length=1024)
    totp_code: str | None = Field(default=None, pattern=r"^[0-9]{6}$",
                                  description="the authenticator's code, for users with a second factor")


class TotpEnrollment(BaseModel):
    secret: str = Field(description="base32, for authenticator apps that take it typed in; shown once")
    otpauth_uri: str = Field(description="otpauth://totp/… (a QR code of it is what apps scan)")


class TotpCode(Strict):
    code: str = Field(pattern=r"^[0-9]{6}$")


class Me(BaseModel):
    username: str
    actor_type: str
    role: str | None
    permissions: list[str]
    must_change_password: bool
    second_factor: bool | None = Field(default=None, description="a confirmed TOTP second factor (users only)")


class LoginResponse(BaseModel):
    user: Me
    csrf_token: str
    expires_at: datetime


class PasswordChange(Strict):
    current_password: str = Field(min_length=1, max_length=1024)
    new_password: str = Field(min_length=1, max_length=1024)


# --- keys -------------------------------------------------------------------
KeyStateName = Literal["pre-active", "active", "deactivated", "compromised", "destroyed",
                       "destroyed-compromised"]


KMIP_GROUP_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"  # core/names.py GROUP_RE
KMIP_GROUP_HELP = ("the KMIP tenancy group whose clients see the key (docs/kmip.md \"Tenancy\"): 1 to 64 of "
                   "a-z 0-9 . _ -; none: no KMIP client sees it until it is assigned or granted")


class KeyCreate(Strict):
    name: str = Field(min_length=1, max_length=128, examples=["payments-db"])
    description: str = Field(default="", max_length=2000)
    tags: dict[str, str] = Field(default_factory=dict)
    owner: str | None = Field(default=None, max_length=128)
    activate: bool = True
    activation_date: datetime | None = None
    deactivation_date: datetime | None = None
    rotation_period_days: int | None = Field(default=None, ge=1, le=3650)
    exportable: bool = Field(default=True, description="false: the material never leaves in plaintext (KMIP "
                                                        "Get), only wrapped under another key")
    kmip_group: str | None = Field(default=None, pattern=KMIP_GROUP_PATTERN, description=KMIP_GROUP_HELP)


class KeyUpdate(Strict):
    description: str | None = Field(default=None, max_length=2000)
    tags: dict[str, str] | None = None
    owner: str | None = Field(default=None, max_length=128)
    rotation_period_days: int | None = Field(default=None, ge=1, le=3650,
                                             description="null together with clear_rotation to stop")
    clear_rotation: bool = False
    exportable: bool | None = None
    kmip_group: str | None = Field(default=None, pattern=KMIP_GROUP_PATTERN,
                                   description=KMIP_GROUP_HELP + "; null removes it from every group")


class KeyVersionPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    version: int
    state: KeyStateName
    created_at: datetime
    activation_date: datetime | None
    deactivation_date: datetime | None
    compromise_date: datetime | None
    destroy_date: datetime | None
    revocation_reason: str | None
    revocation_message: str | None
    wrapping_key_id: str | None
    wrapping_mechanism: str | None
    replaces: int | None = None
    replaced_by: int | None = None


class KeyPublic(BaseModel):
    id: uuid.UUID
    name: str
    description: str
    owner: str
    tags: dict[str, str]
    algorithm: str
    length_bits: int
    state: KeyStateName
    current_version: int
    created_at: datetime
    updated_at: datetime
    rotation_period_days: int | None
    next_rotation_at: datetime | None
    exportable: bool
    kmip_group: str | None
    versions: list[KeyVersionPublic]


class RevokeRequest(Strict):
    reason: Literal["unspecified", "key-compromise", "ca-compromise", "affiliation-changed",
                    "superseded", "cessation-of-operation", "privilege-withdrawn"]
    message: str = Field(default="", max_length=1000)
    compromise_date: datetime | None = None


class DestroyRequest(Strict):
    version: int | None = Field(default=None, ge=1, description="omit to destroy every version")
    shred: bool = Field(default=False, description="destroy even while holders still use the version, making "
                                                   "what they hold unreadable (crypto-shredding)")


# --- data keys ----------------------------------------------------------------
class GenerateDataKeyRequest(Strict):
    number_of_bytes: Literal[16, 24, 32, 48, 64] = 32
    context: Context = Field(default_factory=dict,
                             description="encryption context; the same map must be given to decrypt")
    include_plaintext: bool = True


class DataKeyPublic(BaseModel):
    key_id: uuid.UUID
    key_name: str
    key_version: int
    ciphertext_blob: str = Field(description="base64 self-describing blob")
    plaintext: str | None = Field(description="base64 data key; present only when asked for")


class BlobRequest(Strict):
    ciphertext_blob: Base64Bytes = Field(description="base64 blob from generate-data-key")
    context: Context = Field(default_factory=dict)


# --- audit --------------------------------------------------------------------
class AuditEventPublic(BaseModel):
    seq: int
    time: datetime
    actor: str
    actor_type: str
    action: str
    object_type: str | None
    object_id: str | None
    object_name: str | None = Field(default=None, description=(
        "the object's name when it was recorded (a key's name, a host's hostname, a user's username, a guard "
        "point's path …), from `details.object_name`; null for objects without one and records chained before "
        "names were recorded"))
    outcome: str
    source_ip: str | None
    request_id: str | None
    details: dict[str, object]
    prev_hash: str
    hash: str


class AuditPage(BaseModel):
    items: list[AuditEventPublic]
    total: int = Field(description="matching records; with `total_exact` false, at least this many")
    total_exact: bool = Field(description="false when a search by words or prefixes stopped counting at 10,000")
    next_before_seq: int | None


class AuditVerifyProblem(BaseModel):
    seq: int = Field(description="the record the problem is in: the statement's, or the later use's")
    reason: str


class VerifyResultPublic(BaseModel):
    ok: bool
    checked: int = Field(description="records walked by this run")
    head_seq: int
    first_broken_seq: int | None
    reason: str | None
    from_seq: int = Field(default=0, description="the run started after this record (the last verified checkpoint; "
                                         "0 with full=true or on the first run)")
    checkpoint: int | None = Field(default=None, description="the last checkpoint this run confirmed")
    outside_checked: int = Field(default=0, description="checkpoints from the outside copy compared")
    outside_records: int = Field(default=0, description="records from the outside copy compared, one by one")
    outside_seq: int = Field(default=0, description="the newest record the outside copy holds")
    statements: int = Field(default=0, description=(
        "zero-use statements (`key.version_retired`) checked: every one in the chain, whatever range this run "
        "walked (0 when the chain itself breaks: statements are checked on a chain that holds)"))
    problems: list[AuditVerifyProblem] = Field(default_factory=list, description=(
        "each zero-use statement that does not verify and each later use of a version a statement retired, in "
        "chain order; the first is also `first_broken_seq` and `reason`; empty when the chain itself breaks"))


class AuditCheckpointPublic(BaseModel):
    """A signed checkpoint: ECDSA P-256 with SHA-256 over the canonical JSON of the
    other fields (docs/audit.md), by the key whose SHA-256 SPKI fingerprint is `key`."""

    model_config = ConfigDict(extra="ignore")  # a sink's line carries "type" too

    checkpoint: int = Field(ge=1, le=2**62)
    seq: int = Field(ge=1, le=2**62)
    hash: str = Field(min_length=64, max_length=64)
    time: str = Field(max_length=40)
    prev: str = Field(min_length=64, max_length=64)
    key: str = Field(min_length=64, max_length=64)
    signature: str = Field(max_length=200)


class AuditRecordCopy(BaseModel):
    """A record as a sink wrote it (`"type": "record"` and the fields of its MAC), kept as
    sent: it is compared with the database's record of the same sequence number."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["record"]
    seq: int = Field(ge=1, le=2**62)
    time: str = Field(max_length=40)
    actor: str = Field(max_length=1024)
    actor_type: str = Field(max_length=64)
    action: str = Field(max_length=256)
    object_type: str | None = Field(default=None, max_length=256)
    # Whole, as the record holds it (an agent's file path: up to 4,096 characters); the
    # request body's limit bounds it, as it bounds the details.
    object_id: str | None = Field(default=None)
    outcome: str = Field(max_length=32)
    source_ip: str | None = Field(default=None, max_length=64)
    request_id: str | None = Field(default=None, max_length=128)
    details: dict[str, object]
    prev_hash: str = Field(min_length=64, max_length=64)
    hash: str = Field(min_length=64, max_length=64)


class AuditVerifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    full: bool = Field(default=False,
                       description="walk every record, not only those after the last verified checkpoint")
    outside: list[AuditRecordCopy | AuditCheckpointPublic] = Field(
        default_factory=list, max_length=100_000,
        description="a copy kept off the server (a sink's file, the SIEM): its checkpoints, and its records "
                    "(`type: record`), each compared with the database's, so that records after the last "
                    "checkpoint cannot be cut or rewritten unseen; the request body's limit bounds how many "
                    "(the tail after the last checkpoint fits: `keyserver verify-audit --outside FILE` takes "
                    "a whole copy)")


class AuditVerifiedPublic(BaseModel):
    checkpoint: int
    seq: int
    at: str


class ActivityBucket(BaseModel):
    start: datetime
    allowed: int
    denied: int
    error: int


class Ranked(BaseModel):
    name: str
    count: int


class AuditActivity(BaseModel):
    bucket: Literal["hour", "day"]
    buckets: list[ActivityBucket] = Field(description="every bucket of the range, oldest first; empty ones as zeros")
    totals: dict[str, int] = Field(description="allowed, denied and error over the range")
    top_refused_actors: list[Ranked] = Field(description="denied or failed, most first")
    top_refused_actions: list[Ranked]
    top_refusal_reasons: list[Ranked] = Field(description="the refusal's code or missing permission; '' unknown")


class UsageBucket(BaseModel):
    start: datetime
    counts: dict[str, int] = Field(description="operations by action (e.g. datakey.generate); absent ones are zero")


class KeyUsage(BaseModel):
    bucket: Literal["hour", "day"]
    buckets: list[UsageBucket] = Field(description="every bucket of the range, oldest first")
    actions: list[Ranked] = Field(description="operations over the range by action, most first")
    total: int
    top: list[Ranked] = Field(description="for a key: the actors that used it most; for an actor: the keys "
                                          "(UUIDs) it used most")


class AuditStatusPublic(BaseModel):
    head_seq: int
    last_checkpoint: AuditCheckpointPublic | None
    verified: AuditVerifiedPublic | None = Field(description="how far the last verification got")
    key_fingerprint: str
    public_key_pem: str = Field(description="verifies every checkpoint's signature, without the HSM")


# --- users and tokens -------------------------------------------------------
RoleName = Literal["admin", "key-officer", "operator", "auditor", "storage-admin", "kmip-client"]


class UserCreate(Strict):
    username: str = Field(min_length=2, max_length=64)
    full_name: str = Field(default="", max_length=200)
    role: RoleName
    password: str | None = Field(default=None, max_length=1024,
                                 description="omit to get a one-time password")


class UserUpdate(Strict):
    full_name: str | None = Field(default=None, max_length=200)
    role: RoleName | None = None
    disabled: bool | None = None


class UserPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: uuid.UUID
    username: str
    full_name: str
    role: RoleName
    disabled: bool
    must_change_password: bool
    created_at: datetime
    last_login_at: datetime | None
    locked_until: datetime | None


class UserCreated(BaseModel):
    user: UserPublic
    one_time_password: str | None


class PasswordReset(BaseModel):
    one_time_password: str


class PasswordResetRequest(Strict):
    keep_tokens: bool = Field(default=False, description="keep the user's API tokens (they are revoked "
                                                         "by default: a reset usually means a secret leaked)")


class TokenCreate(Strict):
    name: str = Field(min_length=1, max_length=100)
    scopes: list[str] | None = Field(default=None, description="omit for all of the owner's permissions")
    expires_in_days: int | None = Field(default=90, ge=1, le=3650)
    user_id: uuid.UUID | None = Field(default=None, description="admins: issue for another user")


class TokenPublic(BaseModel):
    id: uuid.UUID
    name: str
    owner: str
    scopes: list[str]
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None
    revoked_at: datetime | None
    prefix: str


class TokenCreated(BaseModel):
    token: TokenPublic
    secret: str = Field(description="the token; shown only once")


# --- system -------------------------------------------------------------------
WRAPPED_KINDS = ("key_versions: managed key versions; kmip_objects: KMIP private keys, secret data and opaque "
                 "objects (their DEKs); ca: the internal CA's key (its DEK); totp_secrets: users' TOTP secrets "
                 "(their DEKs)")


class KekPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    kek_id: str
    state: Literal["active", "retiring", "superseded", "retired"] = Field(
        description="active: the current KEK; retiring: a rotation away from it is running (it still serves "
                    "reads); superseded: rotated away from, still in the token; retired: removed from the token")
    created_at: datetime
    superseded_at: datetime | None
    retired_at: datetime | None = Field(description="when it was removed from the token")
    retired_by: str | None = Field(description="who removed it from the token")
    wrapped: dict[str, int] = Field(default_factory=dict,
                                    description=f"per kind, how many stored blobs it wraps ({WRAPPED_KINDS})")
    wrapped_versions: int = Field(default=0, description="wrapped['key_versions']")


class KekRotationProgress(BaseModel):
    done: int
    total: int


class KekRotationPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: uuid.UUID
    from_kek_id: str
    to_kek_id: str
    state: str
    started_at: datetime
    finished_at: datetime | None
    total: int = Field(description="blobs to re-wrap, all kinds together")
    done: int
    progress: dict[str, KekRotationProgress] = Field(description=f"per kind ({WRAPPED_KINDS})")
    error: str | None
    requested_by: str


class KekStatus(BaseModel):
    keks: list[KekPublic]
    last_rotation: KekRotationPublic | None
    hsm: dict[str, object]


class HealthCheck(BaseModel):
    name: Literal["database", "hsm", "audit_sinks"]
    ok: bool
    detail: str = Field(description="'ok', or what is wrong and what to check")
    latency_ms: float | None = Field(description="how long the check took, when it answered")


class SinkHealth(BaseModel):
    name: str
    kind: str
    healthy: bool
    backlog: int = Field(description="chain records not yet delivered to it")
    delivered_seq: int
    delivered_at: str | None
    last_error: str | None


class ReplicaPublic(BaseModel):
    id: str = Field(description="hostname:pid:start time")
    hostname: str
    pid: int
    version: str
    store: str = Field(description="embedded or postgresql")
    started_at: datetime
    last_seen_at: datetime
    live: bool = Field(description="heard from within three scheduler intervals; a replica that stopped or was "
                                   "killed stays listed as not live for a day")
    scheduler_error: str | None = Field(description="what failed in its scheduler's last run (due rotations, KEK "
                                                    "re-wrapping), which it retries each interval; null if it ran")


class SystemHealth(BaseModel):
    status: Literal["ok", "degraded", "unavailable"] = Field(
        description="unavailable: not ready (database or HSM); degraded: ready, but a sink fails")
    version: str
    hostname: str = Field(description="the replica that answered")
    pid: int
    replica_id: str = Field(description="its id in `replicas` (several servers in one process have one pid)")
    started_at: datetime
    store: Literal["embedded", "postgresql"]
    workers: int
    checks: list[HealthCheck]
    audit_head_seq: int
    audit_pending: int = Field(description="records committed but not yet chained")
    audit_last_checkpoint_at: str | None
    audit_verified_seq: int | None
    audit_fail_closed: bool
    sinks: list[SinkHealth]
    active_kek: str | None
    kek_rotation_running: bool
    replicas: list[ReplicaPublic] = Field(description="every key server process heard from in the last day, "
                                                      "newest first")


class Problem(BaseModel):
    type: str
    title: str
    status: int
    detail: str
    code: str
    request_id: str | None = None
    errors: list[dict[str, object]] | None = None


# --- cryptographic services (keys stay in the HSM) -------------------------------
CipherMode = Literal["AES-GCM", "AES-CBC-PAD", "RSA-OAEP"]
SignatureScheme = Literal["RSA-PSS", "RSA-PKCS1-v1_5", "ECDSA"]
HashName = Literal["SHA-1", "SHA-256", "SHA-384", "SHA-512"]


class EncryptRequest(Strict):
    plaintext: Base64Bytes = Field(description="base64, at most 1 MiB")
    mode: CipherMode | None = Field(default=None, description="AES-GCM (default for AES keys), AES-CBC-PAD; "
                                                              "RSA-OAEP for a public key")
    iv: Base64Bytes | None = Field(default=None, description="base64; omit to let the HSM choose (recommended)")
    aad: Base64Bytes = Field(default=b"", description="base64 associated data (GCM)")
    oaep_hash: Literal["SHA-1", "SHA-256"] = "SHA-1"


class EncryptResult(BaseModel):
    key_id: str = Field(description="the object used: a key version's KMIP identifier")
    version: int | None = Field(default=None, description="the managed key's version that encrypted: give it "
                                                          "to decrypt once the key has been rotated")
    ciphertext: str = Field(description="base64")
    iv: str | None = Field(description="base64 IV (AES)")
    tag: str | None = Field(description="base64 GCM tag")


class DecryptRequest(Strict):
    ciphertext: Base64Bytes
    version: int | None = Field(default=None, ge=1, description="the key version that encrypted (default: newest)")
    mode: CipherMode | None = None
    iv: Base64Bytes | None = None
    tag: Base64Bytes = Field(default=b"", description="base64 GCM tag")
    aad: Base64Bytes = b""
    oaep_hash: Literal["SHA-1", "SHA-256"] = "SHA-1"


class DecryptResult(BaseModel):
    plaintext: str = Field(description="base64")


class SignRequest(Strict):
    data: Base64Bytes
    scheme: SignatureScheme | None = Field(default=None, description="default: RSA-PSS for an RSA key, ECDSA "
                                                                      "for an EC key")
    hash: Literal["SHA-256", "SHA-384", "SHA-512"] | None = Field(
        default=None, description="default: SHA-256 (RSA, P-256), SHA-384 (P-384)")


class SignResult(BaseModel):
    signature: str = Field(description="base64")


class VerifyRequest(Strict):
    data: Base64Bytes
    signature: Base64Bytes = Field(description="base64 (ECDSA: DER Ecdsa-Sig-Value)")
    scheme: SignatureScheme | None = Field(default=None, description="as for sign: the key's default")
    hash: Literal["SHA-256", "SHA-384", "SHA-512"] | None = Field(default=None, description="as for sign")


class MacRequest(Strict):
    data: Base64Bytes
    version: int | None = Field(default=None, ge=1)
    mac: Base64Bytes | None = Field(default=None, description="base64 MAC to verify; omit to compute one")


class MacResult(BaseModel):
    mac: str | None = Field(description="base64 HMAC (when computing)")
    valid: bool | None = Field(description="whether `mac` matched (when verifying)")


class VerifyResult(BaseModel):
    valid: bool


class RandomResult(BaseModel):
    random: str = Field(description="base64 bytes from the HSM's RNG")
