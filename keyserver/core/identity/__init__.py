"""People and their credentials: users, browser sessions and API tokens.

Secrets (session cookies, CSRF tokens, API token secrets) are stored only as SHA-256
digests and compared in constant time. Passwords are argon2id.

One room per concern, `IdentityService` the one door callers use:

| module | what |
|---|---|
| `records.py` | the shared collaborators, `LoginResult`, `IssuedToken`, row helpers, bearer secrets |
| `passwords.py` | hashing, one-time passwords, what a chosen password must be |
| `throttle.py` | sign-in throttling (decision 0015) |
| `users.py` | accounts: first administrator, create, update, reset password |
| `totp.py` | the second factor (RFC 6238), sealed under the KEK |
| `sessions.py` | password sign-in, the session cookie, sign-out, password change |
| `external.py` | sign-in by the organisation's identity provider (OIDC) |
| `tokens.py` | API tokens and their per-process cache |

Imports go one way: `__init__ → external → sessions → totp → users → passwords, records`;
`tokens → records`; `throttle` imports nothing of ours.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from hsm import HsmBackend
from keyserver.core.approvals import ApprovalService
from keyserver.core.audit import AuditService, utcnow
from keyserver.core.identity.external import ExternalSignIn
from keyserver.core.identity.passwords import MIN_PASSWORD, generate_password
from keyserver.core.identity.records import IssuedToken, LoginResult, Shared, sha256_hex
from keyserver.core.identity.sessions import Sessions
from keyserver.core.identity.tokens import TOKEN_PREFIX, ApiTokenView, Tokens
from keyserver.core.identity.totp import TOTP_STEP, SecondFactor, totp_dek, with_totp_dek
from keyserver.core.identity.users import FULL_NAME_MAX, USERNAME_MAX, USERNAME_RE, Users
from keyserver.core.policy import Policy
from keyserver.core.principal import Principal, RequestContext
from keyserver.store.models import ApiToken, User
from keyserver.store.notify import Notifier

__all__ = [
    "FULL_NAME_MAX", "MIN_PASSWORD", "TOKEN_PREFIX", "TOTP_STEP", "USERNAME_MAX", "USERNAME_RE",
    "ApiTokenView", "IdentityService", "IssuedToken", "LoginResult", "generate_password", "sha256_hex", "totp_dek",
    "with_totp_dek",
]


class IdentityService:
    """The facade over the identity rooms: each method hands over to the room that owns it."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        audit: AuditService,
        policy: Policy,
        *,
        session_ttl: timedelta,
        session_idle: timedelta,
        max_failures: int,
        lockout_seconds: int,
        notifier: Notifier,
        token_cache_seconds: float = 30.0,
        token_max_days: int = 365,
        hsm: HsmBackend | None = None,
        current_kek: Callable[[], str] | None = None,
        approvals: ApprovalService | None = None,
        now: Callable[[], datetime] = utcnow,
    ) -> None:
        self._now = now
        # Every room reads the time through here, so moving `_now` (tests do) moves them all.
        shared = Shared(db=session_factory, audit=audit, policy=policy, notifier=notifier, approvals=approvals,
                        now=lambda: self._now())
        self._users = Users(shared)
        self._totp = SecondFactor(shared, self._users, hsm=hsm, current_kek=current_kek)
        self._sessions = Sessions(shared, self._totp, session_ttl=session_ttl, session_idle=session_idle,
                                  max_failures=max_failures, lockout_seconds=lockout_seconds)
        self._external = ExternalSignIn(shared, self._sessions)
        self._tokens = Tokens(shared, cache_seconds=token_cache_seconds, max_days=token_max_days)
        if approvals is not None:
            approvals.register("user.totp", lambda ctx, p: self.reset_totp(ctx, uuid.UUID(p["user_id"])))

    # --- users ------------------------------------------------------------------
    def bootstrap_admin(self, username: str = "admin") -> str | None:
        return self._users.bootstrap_admin(username)

    def list_users(self, ctx: RequestContext) -> list[User]:
        return self._users.list_users(ctx)

    def get_user(self, ctx: RequestContext, user_id: uuid.UUID) -> User:
        return self._users.get_user(ctx, user_id)

    def create_user(self, ctx: RequestContext, *, username: str, role: str, full_name: str = "",
                    password: str | None = None) -> tuple[User, str | None]:
        return self._users.create_user(ctx, username=username, role=role, full_name=full_name, password=password)

    def update_user(self, ctx: RequestContext, user_id: uuid.UUID, *, role: str | None = None,
                    full_name: str | None = None, disabled: bool | None = None) -> User:
        return self._users.update_user(ctx, user_id, role=role, full_name=full_name, disabled=disabled)

    def reset_password(self, ctx: RequestContext, user_id: uuid.UUID, *, keep_tokens: bool = False) -> str:
        return self._users.reset_password(ctx, user_id, keep_tokens=keep_tokens)

    # --- sign-in and sessions ---------------------------------------------------------
    def login(self, username: str, password: str, *, source_ip: str | None, request_id: str | None,
              totp_code: str | None = None) -> LoginResult:
        return self._sessions.login(username, password, source_ip=source_ip, request_id=request_id,
                                    totp_code=totp_code)

    def external_login(self, *, username: str, full_name: str, role: str, issuer: str, subject: str,
                       source_ip: str | None, request_id: str | None) -> LoginResult:
        return self._external.external_login(username=username, full_name=full_name, role=role, issuer=issuer,
                                             subject=subject, source_ip=source_ip, request_id=request_id)

    def authenticate_session(self, session_token: str, *, csrf_token: str | None,
                             require_csrf: bool) -> Principal:
        return self._sessions.authenticate_session(session_token, csrf_token=csrf_token, require_csrf=require_csrf)

    def logout(self, ctx: RequestContext, session_token: str) -> None:
        self._sessions.logout(ctx, session_token)

    def change_password(self, ctx: RequestContext, *, current: str, new: str) -> LoginResult:
        return self._sessions.change_password(ctx, current=current, new=new)

    # --- second factor ------------------------------------------------------------
    def has_second_factor(self, ctx: RequestContext) -> bool | None:
        return self._totp.has_second_factor(ctx)

    def enroll_totp(self, ctx: RequestContext) -> tuple[str, str]:
        return self._totp.enroll_totp(ctx)

    def confirm_totp(self, ctx: RequestContext, code: str) -> None:
        self._totp.confirm_totp(ctx, code)

    def reset_totp(self, ctx: RequestContext, user_id: uuid.UUID) -> None:
        self._totp.reset_totp(ctx, user_id)

    # --- API tokens -----------------------------------------------------------------
    def create_token(self, ctx: RequestContext, *, name: str, scopes: list[str] | None,
                     expires_in_days: int | None, user_id: uuid.UUID | None = None) -> IssuedToken:
        return self._tokens.create_token(ctx, name=name, scopes=scopes, expires_in_days=expires_in_days,
                                         user_id=user_id)

    def list_tokens(self, ctx: RequestContext, *, all_users: bool = False) -> list[ApiToken]:
        return self._tokens.list_tokens(ctx, all_users=all_users)

    def revoke_token(self, ctx: RequestContext, token_id: uuid.UUID) -> ApiToken:
        return self._tokens.revoke_token(ctx, token_id)

    def cached_token(self, raw: str) -> Principal | None:
        return self._tokens.cached_token(raw)

    def authenticate_token(self, raw: str) -> Principal:
        return self._tokens.authenticate_token(raw)
