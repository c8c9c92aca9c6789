from __future__ import annotations

import uuid

from fastapi import APIRouter, Response

from keyserver.api.deps import Ctx, ServicesDep
from keyserver.api.schemas import (
    PasswordReset,
    PasswordResetRequest,
    UserCreate,
    UserCreated,
    UserPublic,
    UserUpdate,
)

router = APIRouter(prefix="/users", tags=["users"])


@router.get("", operation_id="listUsers", response_model=list[UserPublic])
def list_users(ctx: Ctx, services: ServicesDep) -> list[UserPublic]:
    return [UserPublic.model_validate(u) for u in services.identity.list_users(ctx)]


@router.post("", operation_id="createUser", response_model=UserCreated, status_code=201)
def create_user(body: UserCreate, ctx: Ctx, services: ServicesDep) -> UserCreated:
    user, otp = services.identity.create_user(ctx, username=body.username, role=body.role,
                                              full_name=body.full_name, password=body.password)
    return UserCreated(user=UserPublic.model_validate(user), one_time_password=otp)


@router.get("/{user_id}", operation_id="getUser", response_model=UserPublic)
def get_user(user_id: uuid.UUID, ctx: Ctx, services: ServicesDep) -> UserPublic:
    return UserPublic.model_validate(services.identity.get_user(ctx, user_id))


@router.patch("/{user_id}", operation_id="updateUser", response_model=UserPublic)
def update_user(user_id: uuid.UUID, body: UserUpdate, ctx: Ctx, services: ServicesDep) -> UserPublic:
    return UserPublic.model_validate(services.identity.update_user(
        ctx, user_id, role=body.role, full_name=body.full_name, disabled=body.disabled))


@router.post("/{user_id}/reset-password", operation_id="resetPassword", response_model=PasswordReset)
def reset_password(user_id: uuid.UUID, ctx: Ctx, services: ServicesDep,
                   body: PasswordResetRequest | None = None) -> PasswordReset:
    """A one-time password; the user's sessions end, and their API tokens too unless
    `keep_tokens`."""
    keep = body.keep_tokens if body is not None else False
    return PasswordReset(one_time_password=services.identity.reset_password(ctx, user_id, keep_tokens=keep))


@router.delete("/{user_id}/totp", operation_id="resetTotp", status_code=204)
def reset_totp(user_id: uuid.UUID, ctx: Ctx, services: ServicesDep) -> Response:
    """Remove a user's second factor (a lost device); their sessions end."""
    services.identity.reset_totp(ctx, user_id)
    return Response(status_code=204)
