"""People and their credentials: users, browser sessions and API tokens.

Secrets (session cookies, CSRF tokens, API token secrets) are stored only as SHA-256
digests and compared in constant time. Passwords are argon2id.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import re
import secrets
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NoReturn

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from cryptography.hazmat.primitives.hashes import SHA1
from cryptography.hazmat.primitives.twofactor import InvalidToken
from cryptography.hazmat.primitives.twofactor.totp import TOTP
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from hsm import HsmBackend, WrappedKey
from keyserver.core.approvals import APPROVER_ROLES, ApprovalService
from keyserver.core.audit import AuditService, utcnow
from keyserver.core.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    RateLimited,
    ServiceUnavailable,
    Unauthenticated,
)
from keyserver.core.kmip_sealed import seal, unseal
from keyserver.core.permissions import Permission, Role, permissions_for
from keyserver.core.policy import Policy
from keyserver.core.principal import Principal, RequestContext, system_context
from keyserver.store.models import ApiToken, BrowserSession, User
from keyserver.store.notify import Notifier, Topic

USERNAME_RE = re.compile(r"^[a-z0-9][a-z0-9._@-]{1,63}$")
MIN_PASSWORD = 12
TOKEN_PREFIX = "srk_"  # noqa: S105 - a public prefix, not a secret
_hasher = PasswordHasher()  # argon2id, RFC 9106 low-memory profile defaults
# Verified against when the user does not exist, so timing does not reveal usernames.
_DUMMY_HASH = _hasher.hash(secrets.token_urlsafe(16))


def sha256_hex(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def generate_password() -> str:
    return secrets.token_urlsafe(15)


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


class _Window:
    """Failures per key in a sliding window (per process)."""

    def __init__(self, limit: int, window: float) -> None:
        self._limit, self._window = limit, window
        self._fails: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def retry_after(self, key: str) -> int | None:
        """Seconds until `key` may try again, or None when it may now."""
        with self._lock:
            q = self._fails.get(key)
            now = time.monotonic()
            while q and q[0] < now - self._window:
                q.popleft()
            if q and len(q) >= self._limit:
                return int(q[0] + self._window - now) + 1
            return None

    def fail(self, key: str) -> None:
        with self._lock:
            self._fails.setdefault(key, deque()).append(time.monotonic())
            if len(self._fails) > 100_000:
                self._fails.clear()


class _Backoff:
    """Failed sign-ins per key (a username and source address), each costing the key an
    exponentially longer wait once `free` of them are used: `base`, twice that, … up to
    `cap`. Per process; bounded (the stalest keys go first)."""

    def __init__(self, free: int, base: float, cap: float, size: int = 100_000) -> None:
        self._free, self._base, self._cap, self._size = free, base, max(cap, base), size
        self._state: OrderedDict[str, tuple[int, float]] = OrderedDict()  # key -> (failures, last at)
        self._lock = threading.Lock()

    def wait(self, key: str) -> int | None:
        """Whole seconds `key` must still wait before its next try, or None."""
        with self._lock:
            failures, at = self._state.get(key, (0, 0.0))
            if failures < self._free:
                return None
            left = at + min(self._base * 2.0 ** (failures - self._free), self._cap) - time.monotonic()
            return math.ceil(left) if left > 0 else None

    def fail(self, key: str) -> None:
        with self._lock:
            failures, _ = self._state.pop(key, (0, 0.0))
            self._state[key] = (failures + 1, time.monotonic())
            while len(self._state) > self._size:
                self._state.popitem(last=False)

    def forget(self, key: str) -> None:
        with self._lock:
            self._state.pop(key, None)


class _LoginThrottle:
    """Slows password guessing without ever locking the owner out (docs/decisions/0015).

    * per username *and* source address: `max_failures` free, then an exponentially
      growing wait (`lockout_seconds`, doubling, at most 15 minutes) — the attacker's address slows
      down, the owner's other addresses do not;
    * per username, over every address: a looser budget (4 times `max_failures`), then the
      same kind of wait — but only for addresses the owner has not signed in from (a
      session from that address in the last 90 days): spread over many addresses, the
      guesses slow down; the owner at their usual address still signs in. Real accounts
      keep this in the database (shared by replicas); unknown usernames here, alike, so
      the answers do not tell which accounts exist;
    * per address: 300 failures in 5 minutes bounds spraying many usernames.

    A refused try is not checked (no password is verified, nothing counts as failed).
    The first refusal of each wait is audited; the others are counted and the count goes
    into the next audited sign-in of that username from that address.
    """

    CAP = 900.0

    def __init__(self, max_failures: int, lockout_seconds: int) -> None:
        self.account_free = 4 * max_failures
        self._pair = _Backoff(max_failures, lockout_seconds, self.CAP)
        self._unknown = _Backoff(self.account_free, lockout_seconds, self.CAP)
        self._address = _Window(300, 300.0)
        self._lockout = lockout_seconds
        self._refused: dict[str, int] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _pair_key(ip: str | None, username: str) -> str:
        return f"{ip}|{username}"

    def source_wait(self, ip: str | None, username: str) -> tuple[str, int] | None:
        """('address' or 'source', seconds) when this address must wait, or None."""
        if ip is not None and (retry := self._address.retry_after(ip)) is not None:
            return "address", retry
        retry = self._pair.wait(self._pair_key(ip, username))
        return None if retry is None else ("source", retry)

    def unknown_wait(self, username: str) -> int | None:
        return self._unknown.wait(username)

    def account_delay(self, failures: int) -> timedelta | None:
        """How long the account's unknown addresses wait after its `failures`-th failure."""
        if failures < self.account_free:
            return None
        return timedelta(seconds=min(self._lockout * 2 ** (failures - self.account_free), max(self.CAP, self._lockout)))

    def refused(self, scope: str, ip: str | None, username: str) -> bool:
        """Count a refusal; True when it is the first of its wait (to be audited)."""
        key = f"{scope}|{ip}" if scope == "address" else f"{scope}|{self._pair_key(ip, username)}"
        with self._lock:
            first = key not in self._refused
            if len(self._refused) > 100_000:
                self._refused.clear()
            self._refused[key] = self._refused.get(key, -1) + 1
            return first

    def uncounted(self, ip: str | None, username: str) -> int:
        """Refusals not yet audited of this username and address (the first of each wait was), reset."""
        pair = self._pair_key(ip, username)
        with self._lock:
            return sum(self._refused.pop(f"{scope}|{k}", 0) for scope, k in
                       (("source", pair), ("account", pair), ("address", str(ip))))

    def fail(self, ip: str | None, username: str, *, known: bool) -> None:
        if ip is not None:
            self._address.fail(ip)
        self._pair.fail(self._pair_key(ip, username))
        if not known:
            self._unknown.fail(username)

    def succeed(self, ip: str | None, username: str) -> None:
        self._pair.forget(self._pair_key(ip, username))


ACCOUNT_LOCKED = "too many failed sign-ins for this account; try again later"
SOURCE_THROTTLED = "too many failed sign-ins for this account from this address; try again later"
ADDRESS_THROTTLED = "too many failed sign-ins from this address; try again later"
KNOWN_SOURCE_DAYS = 90
# The password hash of accounts the identity provider signs in: no password matches it.
EXTERNAL_PASSWORD = "!external"  # noqa: S105 - not a password: a hash nothing verifies against
# RFC 6238 as authenticator apps implement it: HMAC-SHA-1, 6 digits, 30-second steps.
TOTP_STEP = 30
TOTP_SECRET_BYTES = 20
TOTP_CODE_RE = re.compile(r"^[0-9]{6}$")


def _totp(key: bytes) -> TOTP:
    # HMAC-SHA-1 is RFC 6238's default and the one every authenticator app implements;
    # HMAC's security does not rest on SHA-1's collision resistance.
    return TOTP(key, 6, SHA1(), TOTP_STEP, enforce_key_length=False)  # noqa: S303


def totp_dek(totp: dict[str, Any]) -> WrappedKey:
    """The KEK-wrapped DEK a TOTP secret is sealed under (a KEK rotation re-wraps it)."""
    return WrappedKey(totp["dek_kek"], totp["dek_mechanism"], base64.b64decode(totp["dek"]))


def with_totp_dek(totp: dict[str, Any], dek: WrappedKey) -> dict[str, Any]:
    return {**totp, "dek_kek": dek.wrapping_key_id, "dek_mechanism": dek.mechanism,
            "dek": base64.b64encode(dek.ciphertext).decode()}


def _totp_on(user: User) -> bool:
    return bool(user.totp and user.totp.get("confirmed"))


def _count(result: Any) -> int:
    """Rows an UPDATE changed."""
    return int(result.rowcount)


class IdentityService:
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
        self._approvals = approvals
        if approvals is not None:
            approvals.register("user.totp", lambda ctx, p: self.reset_totp(ctx, uuid.UUID(p["user_id"])))
        # TOTP secrets are sealed under the KEK like KMIP secret data (core/kmip_sealed.py).
        self._hsm, self._current_kek = hsm, current_kek
        self._db = session_factory
        self._audit = audit
        self._policy = policy
        self._ttl = session_ttl
        self._idle = session_idle
        self._max_failures = max_failures
        self._lockout = lockout_seconds
        self._now = now
        self._throttle = _LoginThrottle(max_failures, lockout_seconds)
        self._token_max_days = token_max_days
        # Validated API tokens by SHA-256 of the whole token. Any revocation anywhere
        # clears every replica's cache at commit (LISTEN/NOTIFY), so the cache saves a
        # database round trip per call without delaying a revocation; the TTL only
        # bounds how stale `last_used_at` gets.
        self._notifier = notifier
        self._token_ttl = token_cache_seconds
        self._token_cache: dict[str, tuple[Principal, datetime | None, float]] = {}
        notifier.subscribe(Topic.PRINCIPALS, self._token_cache.clear)

    # --- bootstrap --------------------------------------------------------------
    def bootstrap_admin(self, username: str = "admin") -> str | None:
        """Create the first administrator with a one-time password; None if users exist."""
        with self._db.begin() as s:
            if s.execute(select(func.count()).select_from(User)).scalar_one() > 0:
                return None
            password = generate_password()
            now = self._now()
            s.add(User(id=uuid.uuid4(), username=username, full_name="Administrator", role=Role.ADMIN.value,
                       password_hash=_hasher.hash(password), must_change_password=True,
                       created_at=now, password_changed_at=now))
            self._audit.add(s, system_context("bootstrap"), action="user.create", object_type="user",
                            object_id=username, details={"role": "admin", "bootstrap": True})
        return password

    # --- users --------------------------------------------------------------
    def list_users(self, ctx: RequestContext) -> list[User]:
        self._policy.require(ctx, Permission.USERS_READ, action="user.list")
        with self._db() as s:
            return list(s.execute(select(User).order_by(User.username)).scalars())

    def get_user(self, ctx: RequestContext, user_id: uuid.UUID) -> User:
        self._policy.require(ctx, Permission.USERS_READ, action="user.read", object_type="user",
                             object_id=str(user_id))
        with self._db() as s:
            return self._user(s, user_id)

    @staticmethod
    def _user(s: Session, user_id: uuid.UUID) -> User:
        user = s.get(User, user_id)
        if user is None:
            raise NotFound(f"no user {user_id}", code="user_not_found")
        return user

    def create_user(
        self, ctx: RequestContext, *, username: str, role: str, full_name: str = "",
        password: str | None = None,
    ) -> tuple[User, str | None]:
        """Returns the user and, when no password was given, a one-time password."""
        self._policy.require(ctx, Permission.USERS_MANAGE, action="user.create", object_type="user",
                             object_id=username)
        username = username.strip().lower()
        if not USERNAME_RE.match(username):
            raise InvalidInput("a username is 2-64 characters: lower-case letters, digits and . _ @ -")
        self._check_role(role)
        with self._db() as s:
            if s.execute(select(User.id).where(User.username == username)).first():
                raise Conflict(f"user '{username}' exists already", code="user_exists")
        if self._approvals is not None and role in APPROVER_ROLES:
            # A new approver is a second vote its creator controls (they know its first password).
            self._approvals.hold(ctx, action="user.create", target=username,
                                 params={"role": role, "full_name": full_name})
        temporary = password is None
        if password is None:
            password = generate_password()
        else:
            self._check_password(password, username)
        now = self._now()
        with self._db.begin() as s:
            if s.execute(select(User.id).where(User.username == username)).first():
                raise Conflict(f"user '{username}' exists already", code="user_exists")
            # A password someone else chose is known to them: the user changes it at first
            # sign-in. Only the system (the CLI on the server, first-run set-up) sets final ones.
            user = User(id=uuid.uuid4(), username=username, full_name=full_name, role=role,
                        password_hash=_hasher.hash(password),
                        must_change_password=temporary or ctx.principal.actor_type != "system",
                        created_at=now, password_changed_at=now)
            s.add(user)
            self._audit.add(s, ctx, action="user.create", object_type="user", object_id=username,
                            details={"role": role})
        return user, password if temporary else None

    def update_user(
        self, ctx: RequestContext, user_id: uuid.UUID, *, role: str | None = None,
        full_name: str | None = None, disabled: bool | None = None,
    ) -> User:
        self._policy.require(ctx, Permission.USERS_MANAGE, action="user.update", object_type="user",
                             object_id=str(user_id))
        if role is not None:
            self._check_role(role)
            if self._approvals is not None:
                with self._db() as s:
                    current = self._user(s, user_id)
                if current.role != role and (current.role in APPROVER_ROLES or role in APPROVER_ROLES):
                    self._approvals.hold(ctx, action="user.role", target=current.username,
                                         params={"user_id": str(user_id), "role": role})
        with self._db.begin() as s:
            user = self._user(s, user_id)
            losing_admin = user.role == Role.ADMIN and not user.disabled and (
                (role is not None and role != Role.ADMIN) or disabled is True)
            if losing_admin and self._enabled_admins(s) <= 1:
                raise Conflict("this is the last enabled administrator; create another one first",
                               code="last_admin")
            changes: dict[str, object] = {}
            self._notifier.publish(s, Topic.PRINCIPALS)
            if role is not None and role != user.role:
                user.role, changes["role"] = role, role
                self._end_sessions(s, user.id)  # a privilege change: the next session has a new id
            if full_name is not None:
                user.full_name, changes["full_name"] = full_name, True
            if disabled is not None:
                user.disabled, changes["disabled"] = disabled, disabled
                if disabled:
                    self._revoke_credentials(s, user.id)
            self._audit.add(s, ctx, action="user.update", object_type="user", object_id=user.username,
                            details=changes)
        return user

    @staticmethod
    def _enabled_admins(s: Session) -> int:
        return int(s.execute(select(func.count()).select_from(User).where(
            User.role == Role.ADMIN.value, User.disabled.is_(False))).scalar_one())

    def _revoke_credentials(self, s: Session, user_id: uuid.UUID) -> None:
        self._end_sessions(s, user_id)
        self._revoke_tokens(s, user_id)

    @staticmethod
    def _end_sessions(s: Session, user_id: uuid.UUID) -> int:
        """End every open browser session of the user; how many there were."""
        return _count(s.execute(update(BrowserSession).where(BrowserSession.user_id == user_id,
                                                             BrowserSession.revoked.is_(False))
                                .values(revoked=True)))

    def _revoke_tokens(self, s: Session, user_id: uuid.UUID) -> int:
        return _count(s.execute(update(ApiToken).where(ApiToken.user_id == user_id, ApiToken.revoked_at.is_(None))
                                .values(revoked_at=self._now())))

    def _open_session(self, s: Session, user: User, now: datetime, source_ip: str | None) -> LoginResult:
        """A new browser session (fresh id and CSRF token) in the caller's transaction."""
        session_token, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        expires = now + self._ttl
        s.add(BrowserSession(id_hash=sha256_hex(session_token), user_id=user.id, csrf_hash=sha256_hex(csrf),
                             created_at=now, expires_at=expires, last_seen_at=now, source_ip=source_ip))
        return LoginResult(session_token, csrf, expires, self._user_principal(user))

    def reset_password(self, ctx: RequestContext, user_id: uuid.UUID, *, keep_tokens: bool = False) -> str:
        """A one-time password; every session of the user ends, and so do their API
        tokens unless `keep_tokens` (a reset usually means the old secret leaked)."""
        self._policy.require(ctx, Permission.USERS_MANAGE, action="user.reset_password",
                             object_type="user", object_id=str(user_id))
        self._hold_credentials(ctx, user_id, action="user.password", params={"keep_tokens": keep_tokens})
        password = generate_password()
        with self._db.begin() as s:
            user = self._user(s, user_id)
            user.password_hash = _hasher.hash(password)
            user.must_change_password, user.password_changed_at = True, self._now()
            user.failed_logins, user.locked_until = 0, None
            self._notifier.publish(s, Topic.PRINCIPALS)
            self._end_sessions(s, user.id)
            revoked = 0 if keep_tokens else self._revoke_tokens(s, user.id)
            self._audit.add(s, ctx, action="user.reset_password", object_type="user", object_id=user.username,
                            details={"tokens_revoked": revoked, "tokens_kept": keep_tokens})
        return password

    def _hold_credentials(self, ctx: RequestContext, user_id: uuid.UUID, *, action: str,
                          params: dict[str, Any]) -> None:
        """Someone else's credentials reset by whoever knows the new ones is that person's
        vote: held when the account may approve."""
        if self._approvals is None or user_id == ctx.principal.user_id:
            return
        with self._db() as s:
            user = self._user(s, user_id)
        if user.role in APPROVER_ROLES:
            self._approvals.hold(ctx, action=action, target=user.username, params=params)

    def change_password(self, ctx: RequestContext, *, current: str, new: str) -> LoginResult:
        """Change one's own password. Every session of the user ends (others may have
        been opened with the old password) and the caller gets a new one, with a new id."""
        if ctx.principal.user_id is None or ctx.principal.actor_type != "user":
            raise Forbidden("only a signed-in user can change their own password")
        with self._audit.transaction() as s:
            user = self._user(s, ctx.principal.user_id)
            if not self._verify(user.password_hash, current):
                self._audit.record_after(s, ctx, action="user.change_password", outcome="denied",
                                         object_type="user", object_id=user.username)
                raise Forbidden("the current password is wrong", code="wrong_password")
            self._check_password(new, user.username)
            if self._verify(user.password_hash, new):
                raise InvalidInput("the new password must differ from the current one")
            user.password_hash = _hasher.hash(new)
            now = self._now()
            user.must_change_password, user.password_changed_at = False, now
            ended = self._end_sessions(s, user.id)
            result = self._open_session(s, user, now, ctx.source_ip)
            self._notifier.publish(s, Topic.PRINCIPALS)
            self._audit.add(s, ctx, action="user.change_password", object_type="user", object_id=user.username,
                            details={"sessions_ended": ended})
        return result

    @staticmethod
    def _check_role(role: str) -> None:
        if role not in {r.value for r in Role}:
            raise InvalidInput(f"role must be one of: {', '.join(r.value for r in Role)}")

    @staticmethod
    def _check_password(password: str, username: str) -> None:
        if len(password) < MIN_PASSWORD or len(password) > 1024:
            raise InvalidInput(f"a password has at least {MIN_PASSWORD} characters")
        if username.lower() in password.lower():
            raise InvalidInput("a password must not contain the username")

    @staticmethod
    def _verify(password_hash: str, password: str) -> bool:
        try:
            return _hasher.verify(password_hash, password)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return False

    # --- sign-in and sessions --------------------------------------------------
    def login(self, username: str, password: str, *, source_ip: str | None,
              request_id: str | None, totp_code: str | None = None) -> LoginResult:
        username = username.strip().lower()
        now = self._now()
        anon = RequestContext(principal=Principal(name=username or "anonymous", actor_type="user",
                                                  role=None, permissions=frozenset()),
                              source_ip=source_ip, request_id=request_id)
        waiting = self._throttle.source_wait(source_ip, username)
        if waiting is not None:
            scope, retry = waiting
            self._throttled(anon, username, scope, retry)
        with self._db() as s:
            user = s.execute(select(User).where(User.username == username)).scalar_one_or_none()
            if user is None:
                retry_account = self._throttle.unknown_wait(username)
            elif user.locked_until is not None and user.locked_until > now and \
                    not self._known_source(s, user.id, source_ip, now):
                retry_account = int((user.locked_until - now).total_seconds()) + 1
            else:
                retry_account = None
        if retry_account is not None:
            self._throttled(anon, username, "account", retry_account)
        refused = self._throttle.uncounted(source_ip, username)
        ok = self._verify(user.password_hash if user else _DUMMY_HASH, password)
        second = None
        if user is not None and ok and not user.disabled and _totp_on(user):
            if totp_code is None:
                # The password was right: say what else is needed (it counts as no failure).
                raise Unauthenticated("this account has a second factor: send the authenticator's 6-digit code "
                                      "as totp_code", code="totp_required")
            second = self._totp_step(user, totp_code)
            ok = second is not None
        if user is None or not ok or user.disabled:
            self._throttle.fail(source_ip, username, known=user is not None)
            with self._db.begin() as s:
                details: dict[str, object] = {"reason": "disabled" if user and ok else "bad_credentials"}
                if refused:
                    details["refused_while_throttled"] = refused
                if user is not None and not ok:
                    u = s.get(User, user.id, with_for_update=True)
                    assert u is not None
                    u.failed_logins += 1
                    # A wait for the addresses the owner has not used, never a lock (decision 0015).
                    delay = self._throttle.account_delay(u.failed_logins)
                    if delay is not None:
                        u.locked_until = now + delay
                        details["unknown_addresses_wait_until"] = u.locked_until.isoformat()
                self._audit.add(s, anon, action="auth.login", outcome="denied", object_type="user",
                                object_id=username, details=details)
            raise Unauthenticated("wrong username or password", code="bad_credentials")
        with self._db.begin() as s:
            u = s.get(User, user.id, with_for_update=True)
            assert u is not None
            if second is not None:
                # Each code opens one session: checked again under the row lock, so two
                # sign-ins racing with one code cannot both pass.
                if second <= int((u.totp or {}).get("last_step", -1)):
                    raise Unauthenticated("wrong username or password", code="bad_credentials")
                u.totp = {**(u.totp or {}), "last_step": second}
            if u.locked_until is None or u.locked_until <= now:
                # While a wait is on, the owner's sign-in does not end it: it would give the
                # attacker's other addresses a fresh budget each time.
                u.failed_logins, u.locked_until = 0, None
            u.last_login_at = now
            result = self._open_session(s, u, now, source_ip)
            self._audit.add(s, RequestContext(result.principal, source_ip, request_id), action="auth.login",
                            object_type="user", object_id=u.username,
                            details={"refused_while_throttled": refused} if refused else None)
        self._throttle.succeed(source_ip, username)
        return result

    @staticmethod
    def _known_source(s: Session, user_id: uuid.UUID, source_ip: str | None, now: datetime) -> bool:
        """Whether the user signed in from this address lately: the owner's, most likely."""
        if source_ip is None:
            return False
        return s.execute(select(BrowserSession.id_hash).where(
            BrowserSession.user_id == user_id, BrowserSession.source_ip == source_ip,
            BrowserSession.created_at > now - timedelta(days=KNOWN_SOURCE_DAYS)).limit(1)).first() is not None

    def _throttled(self, anon: RequestContext, username: str, scope: str, retry: int) -> NoReturn:
        """Refuse a try that must wait; only the first refusal of each wait is audited."""
        if self._throttle.refused(scope, anon.source_ip, username):
            self._audit.record_now(anon, action="auth.login", outcome="denied", object_type="user",
                                   object_id=username, details={"reason": "throttled", "throttle": scope,
                                                                "retry_after": retry})
        message = {"address": ADDRESS_THROTTLED, "source": SOURCE_THROTTLED}.get(scope, ACCOUNT_LOCKED)
        raise RateLimited(message, retry_after=retry)

    def external_login(self, *, username: str, full_name: str, role: str, issuer: str, subject: str,
                       source_ip: str | None, request_id: str | None) -> LoginResult:
        """A session for someone the organisation's identity provider signed in (OIDC).
        Their account here is made on first sign-in, with no usable password; their role
        follows the provider's claims at every sign-in (a change is audited)."""
        self._check_role(role)
        now = self._now()
        anon = RequestContext(principal=Principal(name=username, actor_type="user", role=None,
                                                  permissions=frozenset()), source_ip=source_ip, request_id=request_id)
        with self._audit.transaction() as s:
            user = s.execute(select(User).where(User.username == username).with_for_update()).scalar_one_or_none()
            details: dict[str, object] = {"method": "oidc", "issuer": issuer, "subject": subject, "role": role}
            if user is None:
                user = User(id=uuid.uuid4(), username=username, full_name=full_name, role=role,
                            password_hash=EXTERNAL_PASSWORD, must_change_password=False, created_at=now,
                            password_changed_at=now)
                s.add(user)
                details["created"] = True
            elif user.password_hash != EXTERNAL_PASSWORD:
                self._audit.record_after(s, anon, action="auth.login", outcome="denied", object_type="user",
                                         object_id=username, details={**details, "reason": "local_account"})
                raise Forbidden(f"'{username}' is a local account here; sign in with its password",
                                code="oidc_local_account")
            elif user.disabled:
                self._audit.record_after(s, anon, action="auth.login", outcome="denied", object_type="user",
                                         object_id=username, details={**details, "reason": "disabled"})
                raise Forbidden(f"'{username}' is disabled here; ask an administrator", code="account_disabled")
            elif user.role != role:
                details["role_was"] = user.role
                user.role = role
                self._notifier.publish(s, Topic.PRINCIPALS)
            user.last_login_at, user.full_name = now, full_name or user.full_name
            s.flush()  # a new user's row before its session's
            result = self._open_session(s, user, now, source_ip)
            self._audit.add(s, RequestContext(result.principal, source_ip, request_id), action="auth.login",
                            object_type="user", object_id=username, details=details)
        return result

    @staticmethod
    def _user_principal(user: User, *, token: ApiToken | None = None) -> Principal:
        if token is None:
            return Principal(name=user.username, actor_type="user", role=user.role,
                             permissions=permissions_for(user.role), user_id=user.id,
                             must_change_password=user.must_change_password)
        return Principal(name=f"{user.username}/token:{token.name}", actor_type="token", role=user.role,
                         permissions=permissions_for(user.role, token.scopes), user_id=user.id,
                         token_id=token.id)

    def authenticate_session(self, session_token: str, *, csrf_token: str | None,
                             require_csrf: bool) -> Principal:
        now = self._now()
        with self._db() as s:
            row = s.execute(select(BrowserSession, User).join(User, User.id == BrowserSession.user_id)
                            .where(BrowserSession.id_hash == sha256_hex(session_token))).first()
            if row is None:
                raise Unauthenticated("your session is not valid; sign in again", code="session_invalid")
            sess, user = row
            if sess.revoked or user.disabled or sess.expires_at <= now or sess.last_seen_at + self._idle <= now:
                raise Unauthenticated("your session has expired; sign in again", code="session_expired")
            if require_csrf and (csrf_token is None or
                                 not hmac.compare_digest(sha256_hex(csrf_token), sess.csrf_hash)):
                raise Forbidden("missing or wrong X-CSRF-Token header", code="csrf_failed")
            if (now - sess.last_seen_at).total_seconds() > 60:
                s.execute(update(BrowserSession).where(BrowserSession.id_hash == sess.id_hash)
                          .values(last_seen_at=now))
                s.commit()
            return self._user_principal(user)

    def logout(self, ctx: RequestContext, session_token: str) -> None:
        with self._db.begin() as s:
            s.execute(update(BrowserSession).where(BrowserSession.id_hash == sha256_hex(session_token))
                      .values(revoked=True))
            self._audit.add(s, ctx, action="auth.logout", object_type="user", object_id=ctx.principal.name)

    # --- second factor (RFC 6238 TOTP) --------------------------------------------
    def _totp_key(self, user: User) -> bytes:
        t = user.totp or {}
        assert self._hsm is not None
        return unseal(self._hsm, totp_dek(t), base64.b64decode(t["secret"]), mechanism=t["mechanism"], der=False)

    def _totp_step(self, user: User, code: str, *, confirmed_only: bool = True) -> int | None:
        """The time step `code` belongs to (the current one or one either side, for
        clocks that drift), if it is right and newer than the last one used; else None."""
        if not TOTP_CODE_RE.match(code or ""):
            return None
        key = self._totp_key(user)
        now = self._now().timestamp()
        last = int((user.totp or {}).get("last_step", -1))
        for drift in (0, -1, 1):
            step = int(now // TOTP_STEP) + drift
            try:
                _totp(key).verify(code.encode(), step * TOTP_STEP)
            except InvalidToken:
                continue
            return step if step > last else None
        return None

    def has_second_factor(self, ctx: RequestContext) -> bool | None:
        """Whether the signed-in user has a confirmed second factor; None for anyone else."""
        if ctx.principal.user_id is None or ctx.principal.actor_type != "user":
            return None
        with self._db() as s:
            return _totp_on(self._user(s, ctx.principal.user_id))

    def enroll_totp(self, ctx: RequestContext) -> tuple[str, str]:
        """A new TOTP secret for the signed-in user, pending until confirmed with a code
        (replacing a pending one; a confirmed one is removed by an administrator only)."""
        if ctx.principal.user_id is None or ctx.principal.actor_type != "user":
            raise Forbidden("only a signed-in user can set up their own second factor")
        if self._hsm is None or self._current_kek is None:
            raise ServiceUnavailable("this server was built without the HSM's KEK; no second factor")
        # Sealed before the transaction opens: the KEK lookup is a read of its own (one
        # transaction per thread, decision 0010).
        secret = self._hsm.random(TOTP_SECRET_BYTES)
        sealed = seal(self._hsm, secret, kek_id=self._current_kek())
        with self._db.begin() as s:
            user = self._user(s, ctx.principal.user_id)
            if _totp_on(user):
                raise Conflict("a second factor is set up already; an administrator can reset it",
                               code="totp_exists")
            user.totp = with_totp_dek({"mechanism": sealed.mechanism, "confirmed": False,
                                       "secret": base64.b64encode(sealed.material).decode()}, sealed.dek)
            self._audit.add(s, ctx, action="user.totp_enroll", object_type="user", object_id=user.username)
            username = user.username
        b32 = base64.b32encode(secret).decode().rstrip("=")
        uri = _totp(secret).get_provisioning_uri(username, issuer="Strongroom")
        return b32, uri

    def confirm_totp(self, ctx: RequestContext, code: str) -> None:
        """Turn the pending secret on, proving the authenticator has it."""
        if ctx.principal.user_id is None or ctx.principal.actor_type != "user":
            raise Forbidden("only a signed-in user can set up their own second factor")
        with self._audit.transaction() as s:
            user = self._user(s, ctx.principal.user_id)
            if not user.totp or user.totp.get("confirmed"):
                raise Conflict("no second factor is waiting for confirmation; start with POST /auth/totp",
                               code="totp_not_pending")
            step = self._totp_step(user, code)
            if step is None:
                self._audit.record_after(s, ctx, action="user.totp_confirm", outcome="denied", object_type="user",
                                         object_id=user.username)
                raise Forbidden("that code is not the authenticator's current one; check the device's clock "
                                "and try the next code", code="totp_wrong")
            user.totp = {**user.totp, "confirmed": True, "last_step": step}
            self._notifier.publish(s, Topic.PRINCIPALS)
            self._audit.add(s, ctx, action="user.totp_confirm", object_type="user", object_id=user.username)

    def reset_totp(self, ctx: RequestContext, user_id: uuid.UUID) -> None:
        """An administrator removes a user's second factor (a lost device); the user's
        sessions end, so the next sign-in is with the password alone, then re-enrolment."""
        self._policy.require(ctx, Permission.USERS_MANAGE, action="user.totp_reset", object_type="user",
                             object_id=str(user_id))
        self._hold_credentials(ctx, user_id, action="user.totp", params={"user_id": str(user_id)})
        with self._db.begin() as s:
            user = self._user(s, user_id)
            had = user.totp is not None
            user.totp = None
            self._end_sessions(s, user.id)
            self._notifier.publish(s, Topic.PRINCIPALS)
            self._audit.add(s, ctx, action="user.totp_reset", object_type="user", object_id=user.username,
                            details={"had_second_factor": had})

    # --- API tokens ------------------------------------------------------------
    def create_token(
        self, ctx: RequestContext, *, name: str, scopes: list[str] | None,
        expires_in_days: int | None, user_id: uuid.UUID | None = None,
    ) -> IssuedToken:
        owner_id = user_id or ctx.principal.user_id
        if owner_id is None:
            raise Forbidden("API tokens belong to users")
        perm = Permission.TOKENS_ALL if owner_id != ctx.principal.user_id else Permission.TOKENS_OWN
        self._policy.require(ctx, perm, action="token.create", object_type="user", object_id=str(owner_id))
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
        with self._db() as s:
            owner = self._user(s, owner_id)
        scopes = self._token_scopes(owner, scopes)
        if owner_id != ctx.principal.user_id and self._approvals is not None:
            # Whoever holds a token for another account acts as it: held, and visible to
            # the other approvers (a token never approves anything itself).
            self._approvals.hold(ctx, action="token.create", target=owner.username, params={
                "name": name.strip(), "scopes": scopes, "expires_in_days": expires_in_days})
        now = self._now()
        with self._db.begin() as s:
            owner = self._user(s, owner_id)
            scopes = self._token_scopes(owner, scopes)  # the role as it is now
            lookup = base64.b32encode(secrets.token_bytes(10)).decode().lower()
            secret = secrets.token_urlsafe(32)
            token = ApiToken(id=uuid.uuid4(), lookup_id=lookup, secret_hash=sha256_hex(secret),
                             name=name.strip(), user_id=owner.id, scopes=sorted(set(scopes)), created_at=now,
                             expires_at=now + timedelta(days=expires_in_days) if expires_in_days else None)
            s.add(token)
            self._audit.add(s, ctx, action="token.create", object_type="token", object_id=str(token.id),
                            details={"name": token.name, "owner": owner.username, "scopes": token.scopes})
            s.flush()
            s.refresh(token)
        return IssuedToken(token, f"{TOKEN_PREFIX}{lookup}_{secret}")

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
            self._policy.require(ctx, Permission.TOKENS_ALL, action="token.list")
        else:
            self._policy.require(ctx, Permission.TOKENS_OWN, action="token.list")
        with self._db() as s:
            stmt = select(ApiToken).order_by(ApiToken.created_at.desc())
            if not all_users:
                stmt = stmt.where(ApiToken.user_id == ctx.principal.user_id)
            return list(s.execute(stmt).scalars())

    def revoke_token(self, ctx: RequestContext, token_id: uuid.UUID) -> ApiToken:
        with self._db() as s:
            token = s.get(ApiToken, token_id)
        if token is None:
            raise NotFound(f"no API token {token_id}", code="token_not_found")
        perm = Permission.TOKENS_OWN if token.user_id == ctx.principal.user_id else Permission.TOKENS_ALL
        self._policy.require(ctx, perm, action="token.revoke", object_type="token", object_id=str(token_id))
        with self._db.begin() as s:
            t = s.get(ApiToken, token_id)
            assert t is not None
            if t.revoked_at is None:
                t.revoked_at = self._now()
            self._notifier.publish(s, Topic.PRINCIPALS)
            self._audit.add(s, ctx, action="token.revoke", object_type="token", object_id=str(token_id),
                            details={"name": t.name})
        return t

    def cached_token(self, raw: str) -> Principal | None:
        """The principal of a token validated within the cache TTL, without any I/O."""
        if not self._notifier.healthy:
            return None
        hit = self._token_cache.get(sha256_hex(raw))
        if hit is None:
            return None
        principal, expires_at, cached_at = hit
        if time.monotonic() - cached_at > self._token_ttl or (expires_at is not None and expires_at <= self._now()):
            return None
        return principal

    def authenticate_token(self, raw: str) -> Principal:
        cached = self.cached_token(raw)
        if cached is not None:
            return cached
        if not raw.startswith(TOKEN_PREFIX) or raw.count("_") < 2:
            raise Unauthenticated("malformed API token", code="token_invalid")
        lookup, _, secret = raw[len(TOKEN_PREFIX):].partition("_")
        now = self._now()
        started = time.monotonic()
        with self._db() as s:
            token = s.execute(select(ApiToken).where(ApiToken.lookup_id == lookup)).scalar_one_or_none()
            # Compare even when the token is unknown, so timing says nothing.
            expected = token.secret_hash if token else sha256_hex("")
            if not hmac.compare_digest(sha256_hex(secret), expected) or token is None:
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
            principal = self._user_principal(token.user, token=token)
            if len(self._token_cache) > 10_000:
                self._token_cache.clear()
            self._token_cache[sha256_hex(raw)] = (principal, token.expires_at, started)
            return principal
