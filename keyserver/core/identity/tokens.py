"""API tokens: issued to a user (their role, narrowed to scopes), stored as a lookup id
and a SHA-256 of the secret, checked in constant time, cached per process until any
revocation anywhere (LISTEN/NOTIFY) clears every replica's cache."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta
from typing import Protocol

from sqlalchemy import select, update

from keyserver.core.errors import Forbidden, InvalidInput, NotFound, Unauthenticated
from keyserver.core.identity.records import (
    IssuedToken,
    Shared,
    check_secret,
    find_user,
    mint_secret,
    sha256_hex,
    split_secret,
    user_principal,
)
from keyserver.core.permissions import Permission, permissions_for
from keyserver.core.principal import Principal, RequestContext
from keyserver.store.models import ApiToken, User
from keyserver.store.notify import Topic

TOKEN_PREFIX = "srk_"  # noqa: S105 - a public prefix, not a secret


class _OwnerView(Protocol):
    @property
    def username(self) -> str: ...


class ApiTokenView(Protocol):
    """An API token as the protocol side reads it (rows satisfy it; see core/views.py):
    its lookup id for the public prefix, never its secret or hash."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def name(self) -> str: ...
    @property
    def lookup_id(self) -> str: ...
    @property
    def user(self) -> _OwnerView: ...
    @property
    def scopes(self) -> list[str]: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def expires_at(self) -> datetime | None: ...
    @property
    def last_used_at(self) -> datetime | None: ...
    @property
    def revoked_at(self) -> datetime | None: ...


class Tokens:
    def __init__(self, shared: Shared, *, cache_seconds: float, max_days: int) -> None:
        self._x = shared
        self._token_max_days = max_days
        # Validated API tokens by SHA-256 of the whole token. Any revocation anywhere
        # clears every replica's cache at commit (LISTEN/NOTIFY), so the cache saves a
        # database round trip per call without delaying a revocation; the TTL only
        # bounds how stale `last_used_at` gets.
        self._token_ttl = cache_seconds
        self._token_cache: dict[str, tuple[Principal, datetime | None, float]] = {}
        shared.notifier.subscribe(Topic.PRINCIPALS, self._token_cache.clear)

    def create_token(
        self, ctx: RequestContext, *, name: str, scopes: list[str] | None,
        expires_in_days: int | None, user_id: uuid.UUID | None = None,
    ) -> IssuedToken:
        owner_id = user_id or ctx.principal.user_id
        if owner_id is None:
            raise Forbidden("API tokens belong to users")
        perm = Permission.TOKENS_ALL if owner_id != ctx.principal.user_id else Permission.TOKENS_OWN
        self._x.policy.require(ctx, perm, action="token.create", object_type="user", object_id=str(owner_id))
        if ctx.principal.actor_type == "token":
            raise Forbidden("an API token cannot create API tokens; sign in as the user")
        if not 1 <= len(name.strip()) <= 100:
            raise InvalidInput("a token name is 1-100 characters")
        if expires_in_days is not None and not 1 <= expires_in_days <= 3650:
            raise InvalidInput("expires_in_days must be between 1 and 3650")
        if self._token_max_days and (expires_in_days is None or expires_in_days > self._token_max_days):
            raise InvalidInput(f"API tokens on this server expire within {self._token_max_days} days: give "
                               f"expires_in_days from 1 to {self._token_max_days} (STRONGROOM_TOKEN_MAX_DAYS; 0 "
                               "lets tokens live without end)", code="token_lifetime")
        with self._x.db() as s:
            owner = find_user(s, owner_id)
        scopes = self._token_scopes(owner, scopes)
        if owner_id != ctx.principal.user_id and self._x.approvals is not None:
            # Whoever holds a token for another account acts as it: held, and visible to
            # the other approvers (a token never approves anything itself).
            self._x.approvals.hold(ctx, action="token.create", target=owner.username, params={
                "name": name.strip(), "scopes": scopes, "expires_in_days": expires_in_days})
        now = self._x.now()
        with self._x.db.begin() as s:
            owner = find_user(s, owner_id)
            scopes = self._token_scopes(owner, scopes)  # the role as it is now
            minted = mint_secret(TOKEN_PREFIX)
            token = ApiToken(id=uuid.uuid4(), lookup_id=minted.lookup, secret_hash=minted.secret_hash,
                             name=name.strip(), user_id=owner.id, scopes=sorted(set(scopes)), created_at=now,
                             expires_at=now + timedelta(days=expires_in_days) if expires_in_days else None)
            s.add(token)
            self._x.audit.add(s, ctx, action="token.create", object_type="token", object_id=str(token.id),
                              details={"name": token.name, "owner": owner.username, "scopes": token.scopes})
            s.flush()
            s.refresh(token)
        return IssuedToken(token, minted.token)

    @staticmethod
    def _token_scopes(owner: User, scopes: list[str] | None) -> list[str]:
        granted = permissions_for(owner.role)
        if scopes is None:
            return sorted(p.value for p in granted)
        unknown = [x for x in scopes if x not in {p.value for p in Permission}]
        if unknown:
            raise InvalidInput(f"unknown scopes: {', '.join(unknown)}")
        beyond = [x for x in scopes if Permission(x) not in granted]
        if beyond:
            raise InvalidInput(f"the owner's role '{owner.role}' does not grant: {', '.join(beyond)}")
        return sorted(set(scopes))

    def list_tokens(self, ctx: RequestContext, *, all_users: bool = False) -> list[ApiToken]:
        if all_users:
            self._x.policy.require(ctx, Permission.TOKENS_ALL, action="token.list")
        else:
            self._x.policy.require(ctx, Permission.TOKENS_OWN, action="token.list")
        with self._x.db() as s:
            stmt = select(ApiToken).order_by(ApiToken.created_at.desc())
            if not all_users:
                stmt = stmt.where(ApiToken.user_id == ctx.principal.user_id)
            return list(s.execute(stmt).scalars())

    def revoke_token(self, ctx: RequestContext, token_id: uuid.UUID) -> ApiToken:
        with self._x.db() as s:
            token = s.get(ApiToken, token_id)
        if token is None:
            raise NotFound(f"no API token {token_id}", code="token_not_found")
        perm = Permission.TOKENS_OWN if token.user_id == ctx.principal.user_id else Permission.TOKENS_ALL
        self._x.policy.require(ctx, perm, action="token.revoke", object_type="token", object_id=str(token_id))
        with self._x.db.begin() as s:
            t = s.get(ApiToken, token_id)
            assert t is not None
            if t.revoked_at is None:
                t.revoked_at = self._x.now()
            self._x.notifier.publish(s, Topic.PRINCIPALS)
            self._x.audit.add(s, ctx, action="token.revoke", object_type="token", object_id=str(token_id),
                              details={"name": t.name})
        return t

    def cached_token(self, raw: str) -> Principal | None:
        """The principal of a token validated within the cache TTL, without any I/O."""
        if not self._x.notifier.healthy:
            return None
        hit = self._token_cache.get(sha256_hex(raw))
        if hit is None:
            return None
        principal, expires_at, cached_at = hit
        if time.monotonic() - cached_at > self._token_ttl or (expires_at is not None and expires_at <= self._x.now()):
            return None
        return principal

    def authenticate_token(self, raw: str) -> Principal:
        cached = self.cached_token(raw)
        if cached is not None:
            return cached
        parts = split_secret(TOKEN_PREFIX, raw)
        if parts is None:
            raise Unauthenticated("malformed API token", code="token_invalid")
        lookup, secret = parts
        now = self._x.now()
        started = time.monotonic()
        with self._x.db() as s:
            token = s.execute(select(ApiToken).where(ApiToken.lookup_id == lookup)).scalar_one_or_none()
            if not check_secret(secret, token.secret_hash if token else None) or token is None:
                raise Unauthenticated("unknown API token", code="token_invalid")
            if token.revoked_at is not None:
                raise Unauthenticated("this API token was revoked", code="token_revoked")
            if token.expires_at is not None and token.expires_at <= now:
                raise Unauthenticated("this API token has expired; create a new one", code="token_expired")
            if token.user.disabled:
                raise Unauthenticated("the owner of this API token is disabled", code="token_invalid")
            if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
                s.execute(update(ApiToken).where(ApiToken.id == token.id).values(last_used_at=now))
                s.commit()
            principal = user_principal(token.user, token=token)
            if len(self._token_cache) > 10_000:
                self._token_cache.clear()
            self._token_cache[sha256_hex(raw)] = (principal, token.expires_at, started)
            return principal
