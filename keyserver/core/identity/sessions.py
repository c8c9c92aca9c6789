"""Browser sessions: password sign-in (throttled, with the second factor), the session
cookie and its CSRF token checked on each request, sign-out, and changing one's own
password (which ends every session and opens a new one)."""

from __future__ import annotations

import hmac
import secrets
import uuid
from datetime import datetime, timedelta
from typing import NoReturn

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from keyserver.core.errors import Forbidden, InvalidInput, RateLimited, Unauthenticated
from keyserver.core.identity.passwords import (
    DUMMY_HASH,
    PasswordRefused,
    check_password,
    hash_password,
    verify_password,
)
from keyserver.core.identity.records import LoginResult, Shared, end_sessions, find_user, sha256_hex, user_principal
from keyserver.core.identity.throttle import (
    ACCOUNT_LOCKED,
    ADDRESS_THROTTLED,
    KNOWN_SOURCE_DAYS,
    SOURCE_THROTTLED,
    LoginThrottle,
)
from keyserver.core.identity.totp import SecondFactor, totp_on
from keyserver.core.principal import Principal, RequestContext
from keyserver.store.models import BrowserSession, User
from keyserver.store.notify import Topic


class Sessions:
    def __init__(self, shared: Shared, totp: SecondFactor, *, session_ttl: timedelta, session_idle: timedelta,
                 max_failures: int, lockout_seconds: int) -> None:
        self._x, self._totp = shared, totp
        self._ttl, self._idle = session_ttl, session_idle
        self._throttle = LoginThrottle(max_failures, lockout_seconds)

    def open_session(self, s: Session, user: User, now: datetime, source_ip: str | None) -> LoginResult:
        """A new browser session (fresh id and CSRF token) in the caller's transaction."""
        session_token, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        expires = now + self._ttl
        s.add(BrowserSession(id_hash=sha256_hex(session_token), user_id=user.id, csrf_hash=sha256_hex(csrf),
                             created_at=now, expires_at=expires, last_seen_at=now, source_ip=source_ip))
        return LoginResult(session_token, csrf, expires, user_principal(user))

    def change_password(self, ctx: RequestContext, *, current: str, new: str) -> LoginResult:
        """Change one's own password. Every session of the user ends (others may have
        been opened with the old password) and the caller gets a new one, with a new id."""
        if ctx.principal.user_id is None or ctx.principal.actor_type != "user":
            raise Forbidden("only a signed-in user can change their own password")
        with self._x.audit.transaction() as s:
            user = find_user(s, ctx.principal.user_id)
            if not verify_password(user.password_hash, current):
                self._x.audit.record_after(s, ctx, action="user.change_password", outcome="denied",
                                           object_type="user", object_id=user.username)
                raise Forbidden("the current password is wrong", code="wrong_password")
            try:
                check_password(new, username=user.username, role=user.role, context=[user.full_name])
            except PasswordRefused as exc:
                self._x.audit.record_after(s, ctx, action="user.change_password", outcome="denied",
                                           object_type="user", object_id=user.username,
                                           details={"reason": exc.reason})
                raise
            if verify_password(user.password_hash, new):
                raise InvalidInput("the new password must differ from the current one", code="password_unchanged")
            user.password_hash = hash_password(new)
            now = self._x.now()
            user.must_change_password, user.password_changed_at = False, now
            ended = end_sessions(s, user.id)
            result = self.open_session(s, user, now, ctx.source_ip)
            self._x.notifier.publish(s, Topic.PRINCIPALS)
            self._x.audit.add(s, ctx, action="user.change_password", object_type="user", object_id=user.username,
                              details={"sessions_ended": ended})
        return result

    def login(self, username: str, password: str, *, source_ip: str | None,
              request_id: str | None, totp_code: str | None = None) -> LoginResult:
        username = username.strip().lower()
        now = self._x.now()
        anon = RequestContext(principal=Principal(name=username or "anonymous", actor_type="user",
                                                  role=None, permissions=frozenset()),
                              source_ip=source_ip, request_id=request_id)
        waiting = self._throttle.source_wait(source_ip, username)
        if waiting is not None:
            scope, retry = waiting
            self._throttled(anon, username, scope, retry)
        with self._x.db() as s:
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
        ok = verify_password(user.password_hash if user else DUMMY_HASH, password)
        second = None
        if user is not None and ok and not user.disabled and totp_on(user):
            if totp_code is None:
                # The password was right: say what else is needed (it counts as no failure).
                raise Unauthenticated("this account has a second factor: send the authenticator's 6-digit code "
                                      "as totp_code", code="totp_required")
            second = self._totp.step(user, totp_code)
            ok = second is not None
        if user is None or not ok or user.disabled:
            self._throttle.fail(source_ip, username, known=user is not None)
            with self._x.db.begin() as s:
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
                self._x.audit.add(s, anon, action="auth.login", outcome="denied", object_type="user",
                                  object_id=username, details=details)
            raise Unauthenticated("wrong username or password", code="bad_credentials")
        with self._x.db.begin() as s:
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
            result = self.open_session(s, u, now, source_ip)
            self._x.audit.add(s, RequestContext(result.principal, source_ip, request_id), action="auth.login",
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
            self._x.audit.record_now(anon, action="auth.login", outcome="denied", object_type="user",
                                     object_id=username, details={"reason": "throttled", "throttle": scope,
                                                                  "retry_after": retry})
        message = {"address": ADDRESS_THROTTLED, "source": SOURCE_THROTTLED}.get(scope, ACCOUNT_LOCKED)
        raise RateLimited(message, retry_after=retry)

    def authenticate_session(self, session_token: str, *, csrf_token: str | None,
                             require_csrf: bool) -> Principal:
        now = self._x.now()
        with self._x.db() as s:
            row = s.execute(select(BrowserSession, User).join(User, User.id == BrowserSession.user_id)
                            .where(BrowserSession.id_hash == sha256_hex(session_token))).first()
            if row is None:
                raise Unauthenticated("your session is not valid; sign in again", code="session_invalid")
            sess, user = row
            if sess.revoked and not user.disabled and sess.created_at < user.password_changed_at:
                # Ended by a password change or reset (every session ends then): "expired"
                # would send the holder looking at timeouts, not at the new password.
                raise Unauthenticated("the password of this account was changed after this session began; sign in "
                                      "again with the new password", code="session_replaced")
            if sess.revoked or user.disabled or sess.expires_at <= now or sess.last_seen_at + self._idle <= now:
                raise Unauthenticated("your session has expired; sign in again", code="session_expired")
            if require_csrf and (csrf_token is None or
                                 not hmac.compare_digest(sha256_hex(csrf_token), sess.csrf_hash)):
                raise Forbidden("missing or wrong X-CSRF-Token header", code="csrf_failed")
            if (now - sess.last_seen_at).total_seconds() > 60:
                s.execute(update(BrowserSession).where(BrowserSession.id_hash == sess.id_hash)
                          .values(last_seen_at=now))
                s.commit()
            return user_principal(user)

    def logout(self, ctx: RequestContext, session_token: str) -> None:
        with self._x.db.begin() as s:
            s.execute(update(BrowserSession).where(BrowserSession.id_hash == sha256_hex(session_token))
                      .values(revoked=True))
            self._x.audit.add(s, ctx, action="auth.logout", object_type="user", object_id=ctx.principal.name)
