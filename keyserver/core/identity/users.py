"""User accounts: the first administrator, listing, creating, changing roles, disabling,
and an administrator's password reset."""

from __future__ import annotations

import re
import uuid
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from keyserver.core.approvals import APPROVER_ROLES
from keyserver.core.errors import Conflict, InvalidInput
from keyserver.core.identity.passwords import PasswordRefused, check_password, generate_password, hash_password
from keyserver.core.identity.records import Shared, check_role, end_sessions, find_user, revoke_tokens
from keyserver.core.permissions import Permission, Role
from keyserver.core.principal import RequestContext, system_context
from keyserver.store.models import User
from keyserver.store.notify import Topic

USERNAME_MAX = 64  # the column's width (store/models.py)
USERNAME_RE = re.compile(r"^[a-z0-9][a-z0-9._@-]{1,63}$")
FULL_NAME_MAX = 200


class Users:
    def __init__(self, shared: Shared) -> None:
        self._x = shared

    def bootstrap_admin(self, username: str = "admin") -> str | None:
        """Create the first administrator with a one-time password; None if users exist."""
        x = self._x
        with x.db.begin() as s:
            if s.execute(select(func.count()).select_from(User)).scalar_one() > 0:
                return None
            password = generate_password()
            now = x.now()
            s.add(User(id=uuid.uuid4(), username=username, full_name="Administrator", role=Role.ADMIN.value,
                       password_hash=hash_password(password), must_change_password=True,
                       created_at=now, password_changed_at=now))
            x.audit.add(s, system_context("bootstrap"), action="user.create", object_type="user",
                        object_id=username, details={"role": "admin", "bootstrap": True})
        return password

    def list_users(self, ctx: RequestContext) -> list[User]:
        self._x.policy.require(ctx, Permission.USERS_READ, action="user.list")
        with self._x.db() as s:
            return list(s.execute(select(User).order_by(User.username)).scalars())

    def get_user(self, ctx: RequestContext, user_id: uuid.UUID) -> User:
        self._x.policy.require(ctx, Permission.USERS_READ, action="user.read", object_type="user",
                               object_id=str(user_id))
        with self._x.db() as s:
            return find_user(s, user_id)

    def create_user(
        self, ctx: RequestContext, *, username: str, role: str, full_name: str = "",
        password: str | None = None,
    ) -> tuple[User, str | None]:
        """Returns the user and, when no password was given, a one-time password."""
        self._x.policy.require(ctx, Permission.USERS_MANAGE, action="user.create", object_type="user",
                               object_id=username)
        username = username.strip().lower()
        if len(username) > USERNAME_MAX:
            raise InvalidInput(f"a username is at most {USERNAME_MAX} characters; this one has {len(username)}",
                               code="username_too_long")
        if not USERNAME_RE.match(username):
            raise InvalidInput("a username is 2-64 characters: lower-case letters, digits and . _ @ -")
        check_role(role)
        if password is not None:
            try:
                check_password(password, username=username, role=role, context=[full_name])
            except PasswordRefused as exc:
                self._x.audit.record_now(ctx, action="user.create", outcome="denied", object_type="user",
                                         object_id=username, details={"reason": exc.reason, "role": role})
                raise
        with self._x.db() as s:
            if s.execute(select(User.id).where(User.username == username)).first():
                raise Conflict(f"user '{username}' exists already", code="user_exists")
        if self._x.approvals is not None and role in APPROVER_ROLES:
            # A new approver is a second vote its creator controls (they know its first password).
            self._x.approvals.hold(ctx, action="user.create", target=username,
                                   params={"role": role, "full_name": full_name})
        temporary = password is None
        if password is None:
            password = generate_password()
        now = self._x.now()
        with self._x.db.begin() as s:
            if s.execute(select(User.id).where(User.username == username)).first():
                raise Conflict(f"user '{username}' exists already", code="user_exists")
            # A password someone else chose is known to them: the user changes it at first
            # sign-in. Only the system (the CLI on the server, first-run set-up) sets final ones.
            user = User(id=uuid.uuid4(), username=username, full_name=full_name, role=role,
                        password_hash=hash_password(password),
                        must_change_password=temporary or ctx.principal.actor_type != "system",
                        created_at=now, password_changed_at=now)
            s.add(user)
            self._x.audit.add(s, ctx, action="user.create", object_type="user", object_id=username,
                              details={"role": role})
        return user, password if temporary else None

    def update_user(
        self, ctx: RequestContext, user_id: uuid.UUID, *, role: str | None = None,
        full_name: str | None = None, disabled: bool | None = None,
    ) -> User:
        self._x.policy.require(ctx, Permission.USERS_MANAGE, action="user.update", object_type="user",
                               object_id=str(user_id))
        if role is not None:
            check_role(role)
            if self._x.approvals is not None:
                with self._x.db() as s:
                    current = find_user(s, user_id)
                if current.role != role and (current.role in APPROVER_ROLES or role in APPROVER_ROLES):
                    self._x.approvals.hold(ctx, action="user.role", target=current.username,
                                           params={"user_id": str(user_id), "role": role})
        with self._x.db.begin() as s:
            user = find_user(s, user_id)
            losing_admin = user.role == Role.ADMIN and not user.disabled and (
                (role is not None and role != Role.ADMIN) or disabled is True)
            if losing_admin and self._enabled_admins(s) <= 1:
                raise Conflict("this is the last enabled administrator; create another one first",
                               code="last_admin")
            changes: dict[str, object] = {}
            self._x.notifier.publish(s, Topic.PRINCIPALS)
            if role is not None and role != user.role:
                user.role, changes["role"] = role, role
                end_sessions(s, user.id)  # a privilege change: the next session has a new id
            if full_name is not None:
                user.full_name, changes["full_name"] = full_name, True
            if disabled is not None:
                user.disabled, changes["disabled"] = disabled, disabled
                if disabled:
                    end_sessions(s, user.id)
                    revoke_tokens(s, user.id, self._x.now())
            self._x.audit.add(s, ctx, action="user.update", object_type="user", object_id=user.username,
                              details=changes)
        return user

    @staticmethod
    def _enabled_admins(s: Session) -> int:
        return int(s.execute(select(func.count()).select_from(User).where(
            User.role == Role.ADMIN.value, User.disabled.is_(False))).scalar_one())

    def reset_password(self, ctx: RequestContext, user_id: uuid.UUID, *, keep_tokens: bool = False) -> str:
        """A one-time password; every session of the user ends, and so do their API
        tokens unless `keep_tokens` (a reset usually means the old secret leaked)."""
        self._x.policy.require(ctx, Permission.USERS_MANAGE, action="user.reset_password",
                               object_type="user", object_id=str(user_id))
        self.hold_credentials(ctx, user_id, action="user.password", params={"keep_tokens": keep_tokens})
        password = generate_password()
        with self._x.db.begin() as s:
            user = find_user(s, user_id)
            user.password_hash = hash_password(password)
            user.must_change_password, user.password_changed_at = True, self._x.now()
            user.failed_logins, user.locked_until = 0, None
            self._x.notifier.publish(s, Topic.PRINCIPALS)
            end_sessions(s, user.id)
            revoked = 0 if keep_tokens else revoke_tokens(s, user.id, self._x.now())
            self._x.audit.add(s, ctx, action="user.reset_password", object_type="user", object_id=user.username,
                              details={"tokens_revoked": revoked, "tokens_kept": keep_tokens})
        return password

    def hold_credentials(self, ctx: RequestContext, user_id: uuid.UUID, *, action: str,
                          params: dict[str, Any]) -> None:
        """Someone else's credentials reset by whoever knows the new ones is that person's
        vote: held when the account may approve."""
        if self._x.approvals is None or user_id == ctx.principal.user_id:
            return
        with self._x.db() as s:
            user = find_user(s, user_id)
        if user.role in APPROVER_ROLES:
            self._x.approvals.hold(ctx, action=action, target=user.username, params=params)

