from __future__ import annotations

import uuid

from fastapi import APIRouter

from keyserver.api.deps import Ctx, ServicesDep
from keyserver.api.schemas import KekPublic, KekRotationPublic, KekStatus

router = APIRouter(prefix="/system", tags=["system"])


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
