"""Builds the object graph of the keyserver from its settings: one place, so the API,
the CLI and the tests all run the same real objects."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from hsm import HsmBackend, HsmUnavailable
from hsm.config import HsmConfig
from keyserver.core.approvals import ApprovalService
from keyserver.core.audit import AuditService, CheckpointPolicy
from keyserver.core.audit_sinks import AuditSinks, FileSink, Sink, SyslogSink, WebhookSink
from keyserver.core.ca import CertificateAuthority
from keyserver.core.crypto import CryptoService
from keyserver.core.datakeys import DataKeyService
from keyserver.core.gcm import GcmBudget
from keyserver.core.guardpoints import GuardPointService
from keyserver.core.hosts import HostService
from keyserver.core.identity import IdentityService
from keyserver.core.integrations import DatabaseService
from keyserver.core.kek import KekService
from keyserver.core.keys import KeyService
from keyserver.core.kmip_clients import KmipClientService
from keyserver.core.kmip_grants import KmipGrantService
from keyserver.core.kmip_objects import KmipObjectService
from keyserver.core.policy import Policy
from keyserver.core.principal import RequestContext
from keyserver.core.replicas import ReplicaRegistry
from keyserver.core.retirement import RetirementService
from keyserver.core.scheduler import Scheduler
from keyserver.core.volumes import VolumeService
from keyserver.core.xks import XksService
from keyserver.oidc import OidcClient, OidcConfig
from keyserver.settings import Settings
from keyserver.store import db, notify
from keyserver.store.notify import Notifier

log = logging.getLogger(__name__)


class LazyHsm:
    """Opens the token on first use and again after a failure, at most every few
    seconds, so a missing or locked token makes requests fail with 503 and advice
    (and heals by itself once fixed) instead of stopping the server."""

    RETRY_SECONDS = 5.0

    def __init__(self, config: HsmConfig) -> None:
        self._config = config
        self._backend: HsmBackend | None = None
        self._error: HsmUnavailable | None = None
        self._failed_at = 0.0
        self._lock = threading.Lock()

    def _get(self) -> HsmBackend:
        backend = self._backend
        if backend is not None:
            return backend
        with self._lock:
            if self._backend is not None:
                return self._backend
            if self._error is not None and time.monotonic() - self._failed_at < self.RETRY_SECONDS:
                raise self._error
            from hsm.pkcs11 import open_backend

            try:
                self._backend = open_backend(self._config)
            except HsmUnavailable as exc:
                self._error, self._failed_at = exc, time.monotonic()
                raise
            self._error = None
            return self._backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None


@dataclass
class Services:
    settings: Settings
    engine: Engine
    db: sessionmaker[Session]
    hsm: HsmBackend
    audit: AuditService
    policy: Policy
    keks: KekService
    keys: KeyService
    datakeys: DataKeyService
    identity: IdentityService
    scheduler: Scheduler
    replicas: ReplicaRegistry
    notifier: Notifier
    ca: CertificateAuthority
    kmip_clients: KmipClientService
    kmip_objects: KmipObjectService
    kmip_grants: KmipGrantService
    hosts: HostService
    guard_points: GuardPointService
    volumes: VolumeService
    sinks: AuditSinks
    approvals: ApprovalService
    crypto: CryptoService
    databases: DatabaseService
    xks: XksService
    retirement: RetirementService
    oidc: OidcClient | None = None
    engines: tuple[Engine, ...] = ()
    # Stopped first on close(), e.g. the KMIP listener, so no request outlives the services.
    on_close: list[Callable[[], None]] = field(default_factory=list)
    # The agent port's URL as hosts reach it, once it listens (None: no agent port).
    agent_url: str | None = None

    def initialize(self) -> str | None:
        """First-run set-up: the HSM keys and the first administrator. Returns the
        administrator's one-time password when one was created."""
        self.hsm.ensure_hmac_key(self.settings.audit_hmac_key_id)
        self.audit.public_key_der()  # the checkpoint key, made here before any worker signs
        self.keks.ensure_initialized()
        password = self.identity.bootstrap_admin()
        self.ca.ensure()  # the KMIP CA, so client certificates can be issued from the start
        self.audit.flush()
        return password

    def start_background(self, *, housekeeping: bool = True) -> None:
        """The notification listener (cache invalidation), and with `housekeeping` the
        audit chainer, the sinks and the scheduler. Worker processes leave housekeeping to
        their supervisor, so that chaining never competes with requests for a worker's
        interpreter lock (decision 0012)."""
        self.notifier.start()
        if housekeeping:
            self.audit.start()
            self.sinks.start()
            self.scheduler.start()

    def close(self) -> None:
        while self.on_close:
            self.on_close.pop()()
        self.notifier.stop()
        self.scheduler.stop()
        self.audit.stop()
        self.sinks.stop()  # what is left is delivered from the cursors at the next start
        self.hsm.close()
        for engine in {self.engine, *self.engines}:
            engine.dispose()


def build_services(settings: Settings, *, hsm: HsmBackend | None = None, migrate: bool = True) -> Services:
    url = settings.effective_database_url
    if url.startswith("sqlite"):
        settings.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    if migrate:
        db.upgrade(url)
    engine = db.make_engine(url, pool_size=settings.database_pool_size)
    session_factory = db.make_session_factory(engine)
    autocommit = db.make_autocommit_engine(engine, pool_size=settings.database_pool_size)
    notifier = Notifier(engine)

    @event.listens_for(session_factory, "after_commit")
    def _local_notify(session: Session) -> None:
        topics = session.info.pop(notify.LOCAL, None)
        if topics:
            notifier.fire_local(topics)
    backend: HsmBackend = hsm if hsm is not None else LazyHsm(settings.hsm_config())
    audit = AuditService(session_factory, backend, hmac_key_id=settings.audit_hmac_key_id,
                         checkpoints=CheckpointPolicy(records=settings.audit_checkpoint_records,
                                                      seconds=settings.audit_checkpoint_seconds,
                                                      key_id=settings.audit_checkpoint_key_id),
                         autocommit_engine=autocommit)
    sinks = AuditSinks(session_factory, build_sinks(settings), fail_closed=settings.audit_fail_closed)
    policy = Policy(audit, refusal=sinks.refusal)
    approvals = ApprovalService(session_factory, audit, policy, required=settings.approvals,
                                ttl=timedelta(hours=settings.approval_ttl_hours))
    keks = KekService(session_factory, backend, audit, policy, notifier, batch=settings.kek_rewrap_batch,
                      approvals=approvals)
    keys = KeyService(session_factory, backend, audit, policy, keks, notifier, approvals=approvals)
    ca = CertificateAuthority(session_factory, backend, keks, notifier=notifier)
    gcm = GcmBudget(autocommit)  # shared by every AES-GCM encryption under managed key versions
    replicas = ReplicaRegistry(session_factory, policy, interval_seconds=settings.scheduler_interval_seconds,
                               store="embedded" if url.startswith("sqlite") else "postgresql")
    objects = KmipObjectService(session_factory, backend, audit, policy, autocommit_engine=autocommit,
                                notifier=notifier, current_kek=keks.current, approvals=approvals)
    datakeys = DataKeyService(session_factory, backend, audit, policy, notifier, autocommit_engine=autocommit,
                              gcm=gcm)
    crypto = CryptoService(objects, backend, gcm)
    guard_points = GuardPointService(session_factory, audit, policy)
    retirement = RetirementService(session_factory, audit, policy, notifier, guard_points, approvals=approvals)
    services = Services(
        settings=settings,
        engine=engine,
        db=session_factory,
        hsm=backend,
        audit=audit,
        policy=policy,
        keks=keks,
        keys=keys,
        datakeys=datakeys,
        identity=IdentityService(
            session_factory, audit, policy,
            session_ttl=timedelta(minutes=settings.session_ttl_minutes),
            session_idle=timedelta(minutes=settings.session_idle_minutes),
            max_failures=settings.login_max_failures,
            lockout_seconds=settings.login_lockout_seconds,
            notifier=notifier,
            token_max_days=settings.token_max_days,
            hsm=backend,
            current_kek=keks.current,
            approvals=approvals,
        ),
        scheduler=Scheduler(keys, keks, interval_seconds=settings.scheduler_interval_seconds, replicas=replicas,
                            retirement=retirement),
        replicas=replicas,
        notifier=notifier,
        ca=ca,
        kmip_clients=KmipClientService(session_factory, audit, policy, ca,
                                       cert_days=settings.kmip_client_cert_days,
                                       read_session_factory=db.make_session_factory(autocommit),
                                       notifier=notifier),
        kmip_objects=objects,
        kmip_grants=KmipGrantService(session_factory, audit, policy),
        crypto=crypto,
        guard_points=guard_points,
        volumes=VolumeService(session_factory, audit, policy, datakeys),
        hosts=HostService(session_factory, backend, audit, policy, ca, notifier,
                          cert_days=settings.kmip_client_cert_days,
                          heartbeat_seconds=settings.agent_heartbeat_seconds),
        engines=(autocommit,),
        sinks=sinks,
        approvals=approvals,
        databases=DatabaseService(session_factory, backend, audit, policy, approvals=approvals),
        xks=XksService(session_factory, backend, audit, policy, crypto, keks.current, notifier=notifier,
                       autocommit_engine=autocommit),
        retirement=retirement,
        oidc=build_oidc(settings),
    )
    # What an approved request runs, as its requester (core/approvals.py).
    approvals.register("key.destroy", lambda ctx, p: services.keys.destroy(ctx, p["key"], version=p.get("version"),
                                                                           shred=bool(p.get("shred"))))
    def rotate_kek(ctx: RequestContext, _params: dict[str, Any]) -> object:
        rotation = services.keks.start_rotation(ctx)
        services.scheduler.kick()
        return rotation

    approvals.register("kek.rotate", rotate_kek)
    approvals.register("key.retire", lambda ctx, p: services.retirement.retire(
        ctx, p["key"], int(p["version"]), reason=str(p.get("reason", "")), contents=bool(p.get("contents"))))
    approvals.register("key.retire_exclude", lambda ctx, p: services.retirement.exclude(
        ctx, p["key"], int(p["version"]), kind=p["kind"], holder=p["holder"], reason=p["reason"]))
    approvals.register("kek.retire", lambda ctx, p: services.keks.retire(ctx, p["kek_id"]))
    approvals.register("database.grant", lambda ctx, p: services.databases.grant(
        ctx, p["database"], key=p["key"], key_id=p["key_id"]))
    approvals.register("user.role", lambda ctx, p: services.identity.update_user(ctx, uuid.UUID(p["user_id"]),
                                                                                 role=p["role"]))
    return services


def build_oidc(settings: Settings) -> OidcClient | None:
    """The identity provider's client when OIDC sign-in is configured (all three of issuer,
    client id and secret), else None."""
    if not (settings.oidc_issuer and settings.oidc_client_id and settings.oidc_client_secret):
        return None
    base = (settings.public_url or f"https://{settings.host}:{settings.port}").rstrip("/")
    return OidcClient(OidcConfig(
        issuer=settings.oidc_issuer, client_id=settings.oidc_client_id, client_secret=settings.oidc_client_secret,
        redirect_uri=settings.oidc_redirect_url or f"{base}/api/v1/auth/oidc/callback",
        role_claim=settings.oidc_role_claim, role_map=dict(settings.oidc_role_map), scopes=settings.oidc_scopes,
        ca_file=str(settings.oidc_ca_file) if settings.oidc_ca_file else None))


def build_sinks(settings: Settings) -> list[Sink]:
    out: list[Sink] = []
    for c in settings.audit_sinks:
        if c.type == "file":
            assert c.path is not None
            out.append(FileSink(c.name, c.path, max_bytes=c.max_bytes, keep=c.keep))
        elif c.type == "syslog":
            assert c.host is not None
            out.append(SyslogSink(c.name, c.host, c.port, ca_file=c.ca_file, server_name=c.server_name))
        else:
            assert c.url is not None
            out.append(WebhookSink(c.name, c.url, ca_file=c.ca_file))
    return out
