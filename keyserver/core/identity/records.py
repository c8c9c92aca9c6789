"""What every identity room shares: the collaborators, the values handed to callers,
the few row operations more than one room performs, and the one way a bearer secret
(API, enrollment and database tokens) is minted and checked."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from keyserver.core.approvals import ApprovalService
from keyserver.core.audit import AuditService
from keyserver.core.errors import InvalidInput, NotFound
from keyserver.core.permissions import Role, permissions_for
from keyserver.core.policy import Policy
from keyserver.core.principal import Principal
from keyserver.store.models import ApiToken, BrowserSession, User
from keyserver.store.notify import Notifier


def sha256_hex(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class MintedSecret:
    lookup: str  # stored in the clear: finds the row without scanning digests
    secret_hash: str  # stored: the SHA-256 of the secret part, hex
    token: str  # shown once, never stored


def mint_secret(prefix: str) -> MintedSecret:
    """A bearer credential `<prefix><lookup>_<secret>`: API tokens (srk_), enrollment
    tokens (sre_) and database tokens (srdb_) are all this shape, and rows written before
    this function existed hold the same lookup and digest, so it must not change."""
    lookup = base64.b32encode(secrets.token_bytes(10)).decode().lower()
    secret = secrets.token_urlsafe(32)
    return MintedSecret(lookup, sha256_hex(secret), f"{prefix}{lookup}_{secret}")


def split_secret(prefix: str, token: str | None) -> tuple[str, str] | None:
    """(lookup, secret) of a credential minted with `prefix`; None when it is not one."""
    if not token or not token.startswith(prefix) or "_" not in token[len(prefix):]:
        return None
    lookup, _, secret = token[len(prefix):].partition("_")
    return lookup, secret


def check_secret(secret: str, secret_hash: str | None) -> bool:
    """Whether `secret` is the one behind `secret_hash` (None: no row had the lookup).
    The digest is compared even then, so the time taken says nothing of which lookups
    exist."""
    expected = secret_hash if secret_hash is not None else sha256_hex("")
    return hmac.compare_digest(sha256_hex(secret), expected) and secret_hash is not None


@dataclass(frozen=True, slots=True)
class Shared:
    """The collaborators of every room. `now` is read at each use, so a test that moves
    the facade's clock moves every room's."""

    db: sessionmaker[Session]
    audit: AuditService
    policy: Policy
    notifier: Notifier
    approvals: ApprovalService | None
    now: Callable[[], datetime]


@dataclass(frozen=True, slots=True)
class LoginResult:
    session_token: str
    csrf_token: str
    expires_at: datetime
    principal: Principal


@dataclass(frozen=True, slots=True)
class IssuedToken:
    token: ApiToken
    secret: str  # shown once


def find_user(s: Session, user_id: uuid.UUID) -> User:
    user = s.get(User, user_id)
    if user is None:
        raise NotFound(f"no user {user_id}", code="user_not_found")
    return user


def user_principal(user: User, *, token: ApiToken | None = None) -> Principal:
    if token is None:
        return Principal(name=user.username, actor_type="user", role=user.role,
                         permissions=permissions_for(user.role), user_id=user.id,
                         must_change_password=user.must_change_password)
    return Principal(name=f"{user.username}/token:{token.name}", actor_type="token", role=user.role,
                     permissions=permissions_for(user.role, token.scopes), user_id=user.id,
                     token_id=token.id)


def check_role(role: str) -> None:
    if role not in {r.value for r in Role}:
        raise InvalidInput(f"role must be one of: {', '.join(r.value for r in Role)}")


def _count(result: Any) -> int:
    """Rows an UPDATE changed."""
    return int(result.rowcount)


def end_sessions(s: Session, user_id: uuid.UUID) -> int:
    """End every open browser session of the user; how many there were."""
    return _count(s.execute(update(BrowserSession).where(BrowserSession.user_id == user_id,
                                                         BrowserSession.revoked.is_(False))
                            .values(revoked=True)))


def revoke_tokens(s: Session, user_id: uuid.UUID, now: datetime) -> int:
    return _count(s.execute(update(ApiToken).where(ApiToken.user_id == user_id, ApiToken.revoked_at.is_(None))
                            .values(revoked_at=now)))
