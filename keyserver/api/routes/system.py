from __future__ import annotations

import os
import socket
import time
import uuid
from datetime import UTC, datetime

from fastapi import APIRouter
from sqlalchemy import text

from hsm import HsmError
from keyserver import product_version
from keyserver.api.deps import Ctx, ServicesDep
from keyserver.api.schemas import (
    HealthCheck,
    KekPublic,
    KekRotationPublic,
    KekStatus,
    ReplicaPublic,
    SinkHealth,
    SystemHealth,
)
from keyserver.core.permissions import Permission
from keyserver.services import Services

router = APIRouter(prefix="/system", tags=["system"])
STARTED_AT = datetime.now(UTC)


def readiness(services: Services) -> tuple[bool, list[HealthCheck]]:
    """The database and the HSM answer now (each timed), and audit records can be
    delivered: what /readyz and /system/health report. A failing sink makes the server
    unready only when key operations wait for it (fail-closed and no sink accepts)."""
    checks: list[HealthCheck] = []
    started = time.perf_counter()
    try:
        with services.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        checks.append(HealthCheck(name="database", ok=True, detail="ok",
                                  latency_ms=round((time.perf_counter() - started) * 1000, 2)))
    except Exception as exc:
        checks.append(HealthCheck(name="database", ok=False, latency_ms=None,
                                  detail=f"unreachable: {type(exc).__name__}; check STRONGROOM_DATABASE_URL"))
    started = time.perf_counter()
    try:
        services.hsm.check()
        checks.append(HealthCheck(name="hsm", ok=True, detail="ok",
                                  latency_ms=round((time.perf_counter() - started) * 1000, 2)))
    except HsmError as exc:
        checks.append(HealthCheck(name="hsm", ok=False, detail=str(exc), latency_ms=None))
    ok = all(c.ok for c in checks)
    if services.sinks.configured:
        refusal = services.sinks.refusal()
        try:
            failing = [f"{d['name']}: {d['last_error']}" for d in services.sinks.describe() if not d["healthy"]]
            detail = refusal or ("ok" if not failing else "failing: " + "; ".join(failing))
        except Exception as exc:
            detail = f"unknown: {type(exc).__name__}"
        checks.append(HealthCheck(name="audit_sinks", ok=detail == "ok", detail=detail, latency_ms=None))
        ok = ok and refusal is None
    return ok, checks


@router.get("/health", operation_id="getSystemHealth", response_model=SystemHealth)
def health(ctx: Ctx, services: ServicesDep) -> SystemHealth:
    """What an operator checks first: this replica's readiness (database and HSM, timed;
    audit sinks), the audit chain's head, backlog and last checkpoint, each sink's
    delivery, the active KEK and a running KEK rotation."""
    services.policy.require(ctx, Permission.SYSTEM_READ, action="system.health")
    ok, checks = readiness(services)
    audit = services.audit.chain_state()
    kek = services.keks.status(ctx)
    rotation = kek["last_rotation"]
    sinks = [SinkHealth(**d) for d in services.sinks.describe()] if services.sinks.configured else []
    degraded = not all(c.ok for c in checks) or any(not s.healthy for s in sinks)
    last = audit["last_checkpoint"]
    return SystemHealth(
        status="unavailable" if not ok else "degraded" if degraded else "ok",
        version=product_version(), hostname=socket.gethostname(), pid=os.getpid(), replica_id=services.replicas.id,
        started_at=STARTED_AT,
        store="embedded" if services.settings.effective_database_url.startswith("sqlite") else "postgresql",
        workers=services.settings.workers, checks=checks,
        audit_head_seq=audit["head_seq"], audit_pending=services.audit.pending(),
        audit_last_checkpoint_at=last["time"] if last else None,
        audit_verified_seq=audit["verified"]["seq"] if audit["verified"] else None,
        audit_fail_closed=services.settings.audit_fail_closed, sinks=sinks,
        active_kek=next((k["kek_id"] for k in kek["keks"] if k["state"] == "active"), None),  # type: ignore[attr-defined]
        kek_rotation_running=rotation is not None and rotation.state == "running",  # type: ignore[attr-defined]
        replicas=[ReplicaPublic(id=r.id, hostname=r.hostname, pid=r.pid, version=r.version, store=r.store,
                                started_at=r.started_at, last_seen_at=r.last_seen_at, live=live,
                                scheduler_error=r.scheduler_error)
                  for r, live in services.replicas.list(ctx)],
    )


@router.get("/kek", operation_id="getKekStatus", response_model=KekStatus)
def kek_status(ctx: Ctx, services: ServicesDep) -> KekStatus:
    st = services.keks.status(ctx)
    caps = services.hsm.capabilities
    rot = st["last_rotation"]
    return KekStatus(
        keks=[KekPublic(**k) for k in st["keks"]],  # type: ignore[attr-defined]
        last_rotation=KekRotationPublic.model_validate(rot) if rot else None,
        hsm={"manufacturer": caps.manufacturer, "model": caps.model, "firmware": caps.firmware,
             "rsa_wrap_mechanism": caps.rsa_wrap_mechanism},
    )


@router.post("/kek/rotate", operation_id="rotateKek", response_model=KekRotationPublic, status_code=202)
def rotate_kek(ctx: Ctx, services: ServicesDep) -> KekRotationPublic:
    rot = services.keks.start_rotation(ctx)
    services.scheduler.kick()
    return KekRotationPublic.model_validate(rot)


@router.post("/keks/{kek_id}/retire", operation_id="retireKek", response_model=KekPublic)
def retire_kek(kek_id: str, ctx: Ctx, services: ServicesDep) -> KekPublic:
    """Remove a superseded KEK from the HSM token for good. Refused (409, the problem's
    `errors` listing per kind the count and the first ids) while anything stored is still
    wrapped under it, while it is the active KEK, or while a rotation runs."""
    return KekPublic.model_validate(services.keks.retire(ctx, kek_id))


@router.get("/kek/rotations/{rotation_id}", operation_id="getKekRotation", response_model=KekRotationPublic)
def get_rotation(rotation_id: uuid.UUID, ctx: Ctx, services: ServicesDep) -> KekRotationPublic:
    return KekRotationPublic.model_validate(services.keks.get_rotation(ctx, rotation_id))
