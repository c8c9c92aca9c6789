from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query

from keyserver.api.deps import Ctx, ServicesDep
from keyserver.api.schemas import TokenCreate, TokenCreated, TokenPublic
from keyserver.core.identity import TOKEN_PREFIX, ApiTokenView

router = APIRouter(prefix="/tokens", tags=["api tokens"])


def token_public(t: ApiTokenView) -> TokenPublic:
    return TokenPublic(id=t.id, name=t.name, owner=t.user.username, scopes=t.scopes, created_at=t.created_at,
                       expires_at=t.expires_at, last_used_at=t.last_used_at, revoked_at=t.revoked_at,
                       prefix=f"{TOKEN_PREFIX}{t.lookup_id}")


@router.get("", operation_id="listTokens", response_model=list[TokenPublic])
def list_tokens(ctx: Ctx, services: ServicesDep,
                all_users: Annotated[bool, Query(description="admins: every user's tokens")] = False,
                ) -> list[TokenPublic]:
    return [token_public(t) for t in services.identity.list_tokens(ctx, all_users=all_users)]


@router.post("", operation_id="createToken", response_model=TokenCreated, status_code=201)
def create_token(body: TokenCreate, ctx: Ctx, services: ServicesDep) -> TokenCreated:
    issued = services.identity.create_token(ctx, name=body.name, scopes=body.scopes,
                                            expires_in_days=body.expires_in_days, user_id=body.user_id)
    return TokenCreated(token=token_public(issued.token), secret=issued.secret)


@router.delete("/{token_id}", operation_id="revokeToken", response_model=TokenPublic)
def revoke_token(token_id: uuid.UUID, ctx: Ctx, services: ServicesDep) -> TokenPublic:
    return token_public(services.identity.revoke_token(ctx, token_id))
