"""The second factor: RFC 6238 TOTP as authenticator apps implement it, its secret
sealed under the KEK like KMIP secret data (core/kmip_sealed.py)."""

from __future__ import annotations

import base64
import re
import uuid
from collections.abc import Callable
from typing import Any

from cryptography.hazmat.primitives.hashes import SHA1
from cryptography.hazmat.primitives.twofactor import InvalidToken
from cryptography.hazmat.primitives.twofactor.totp import TOTP

from hsm import HsmBackend, WrappedKey
from keyserver.core.errors import Conflict, Forbidden, ServiceUnavailable
from keyserver.core.identity.records import Shared, end_sessions, find_user
from keyserver.core.identity.users import Users
from keyserver.core.kmip_sealed import seal, unseal
from keyserver.core.permissions import Permission
from keyserver.core.principal import RequestContext
from keyserver.store.models import User
from keyserver.store.notify import Topic

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


def totp_on(user: User) -> bool:
    return bool(user.totp and user.totp.get("confirmed"))


class SecondFactor:
    def __init__(self, shared: Shared, users: Users, *, hsm: HsmBackend | None,
                 current_kek: Callable[[], str] | None) -> None:
        self._x, self._users = shared, users
        self._hsm, self._current_kek = hsm, current_kek

    def _totp_key(self, user: User) -> bytes:
        t = user.totp or {}
        assert self._hsm is not None
        return unseal(self._hsm, totp_dek(t), base64.b64decode(t["secret"]), mechanism=t["mechanism"], der=False)

    def step(self, user: User, code: str, *, confirmed_only: bool = True) -> int | None:
        """The time step `code` belongs to (the current one or one either side, for
        clocks that drift), if it is right and newer than the last one used; else None."""
        if not TOTP_CODE_RE.match(code or ""):
            return None
        key = self._totp_key(user)
        now = self._x.now().timestamp()
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
        with self._x.db() as s:
            return totp_on(find_user(s, ctx.principal.user_id))

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
        with self._x.db.begin() as s:
            user = find_user(s, ctx.principal.user_id)
            if totp_on(user):
                raise Conflict("a second factor is set up already; an administrator can reset it",
                               code="totp_exists")
            user.totp = with_totp_dek({"mechanism": sealed.mechanism, "confirmed": False,
                                       "secret": base64.b64encode(sealed.material).decode()}, sealed.dek)
            self._x.audit.add(s, ctx, action="user.totp_enroll", object_type="user", object_id=user.username)
            username = user.username
        b32 = base64.b32encode(secret).decode().rstrip("=")
        uri = _totp(secret).get_provisioning_uri(username, issuer="Strongroom")
        return b32, uri

    def confirm_totp(self, ctx: RequestContext, code: str) -> None:
        """Turn the pending secret on, proving the authenticator has it."""
        if ctx.principal.user_id is None or ctx.principal.actor_type != "user":
            raise Forbidden("only a signed-in user can set up their own second factor")
        with self._x.audit.transaction() as s:
            user = find_user(s, ctx.principal.user_id)
            if not user.totp or user.totp.get("confirmed"):
                raise Conflict("no second factor is waiting for confirmation; start with POST /auth/totp",
                               code="totp_not_pending")
            step = self.step(user, code)
            if step is None:
                self._x.audit.record_after(s, ctx, action="user.totp_confirm", outcome="denied", object_type="user",
                                           object_id=user.username)
                raise Forbidden("that code is not the authenticator's current one; check the device's clock "
                                "and try the next code", code="totp_wrong")
            user.totp = {**user.totp, "confirmed": True, "last_step": step}
            self._x.notifier.publish(s, Topic.PRINCIPALS)
            self._x.audit.add(s, ctx, action="user.totp_confirm", object_type="user", object_id=user.username)

    def reset_totp(self, ctx: RequestContext, user_id: uuid.UUID) -> None:
        """An administrator removes a user's second factor (a lost device); the user's
        sessions end, so the next sign-in is with the password alone, then re-enrolment."""
        self._x.policy.require(ctx, Permission.USERS_MANAGE, action="user.totp_reset", object_type="user",
                               object_id=str(user_id))
        self._users.hold_credentials(ctx, user_id, action="user.totp", params={"user_id": str(user_id)})
        with self._x.db.begin() as s:
            user = find_user(s, user_id)
            had = user.totp is not None
            user.totp = None
            end_sessions(s, user.id)
            self._x.notifier.publish(s, Topic.PRINCIPALS)
            self._x.audit.add(s, ctx, action="user.totp_reset", object_type="user", object_id=user.username,
                              details={"had_second_factor": had})
