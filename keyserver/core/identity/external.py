"""Sign-in through the organisation's identity provider (OIDC): the account here is made
at the first sign-in, with no usable password, and its role follows the provider's
claims. The protocol itself (keyserver/oidc.py) stays outside core."""

from __future__ import annotations

import uuid

from sqlalchemy import select

from keyserver.core.errors import Forbidden, InvalidInput
from keyserver.core.identity.passwords import EXTERNAL_PASSWORD
from keyserver.core.identity.records import LoginResult, Shared, check_role
from keyserver.core.identity.sessions import Sessions
from keyserver.core.identity.users import FULL_NAME_MAX, USERNAME_MAX
from keyserver.core.principal import Principal, RequestContext
from keyserver.store.models import User
from keyserver.store.notify import Topic


class ExternalSignIn:
    def __init__(self, shared: Shared, sessions: Sessions) -> None:
        self._x, self._sessions = shared, sessions

    def external_login(self, *, username: str, full_name: str, role: str, issuer: str, subject: str,
                       source_ip: str | None, request_id: str | None) -> LoginResult:
        """A session for someone the organisation's identity provider signed in (OIDC).
        Their account here is made on first sign-in, with no usable password; their role
        follows the provider's claims at every sign-in (a change is audited)."""
        check_role(role)
        # keyserver/oidc.py refuses these with the provider's words; this guards other callers.
        if len(username) > USERNAME_MAX or len(full_name) > FULL_NAME_MAX:
            raise InvalidInput(f"a username is at most {USERNAME_MAX} characters and a full name at most "
                               f"{FULL_NAME_MAX}", code="username_too_long")
        now = self._x.now()
        anon = RequestContext(principal=Principal(name=username, actor_type="user", role=None,
                                                  permissions=frozenset()), source_ip=source_ip, request_id=request_id)
        with self._x.audit.transaction() as s:
            user = s.execute(select(User).where(User.username == username).with_for_update()).scalar_one_or_none()
            details: dict[str, object] = {"method": "oidc", "issuer": issuer, "subject": subject, "role": role}
            if user is None:
                user = User(id=uuid.uuid4(), username=username, full_name=full_name, role=role,
                            password_hash=EXTERNAL_PASSWORD, must_change_password=False, created_at=now,
                            password_changed_at=now)
                s.add(user)
                details["created"] = True
            elif user.password_hash != EXTERNAL_PASSWORD:
                self._x.audit.record_after(s, anon, action="auth.login", outcome="denied", object_type="user",
                                           object_id=username, details={**details, "reason": "local_account"})
                raise Forbidden(f"'{username}' is a local account here; sign in with its password",
                                code="oidc_local_account")
            elif user.disabled:
                self._x.audit.record_after(s, anon, action="auth.login", outcome="denied", object_type="user",
                                           object_id=username, details={**details, "reason": "disabled"})
                raise Forbidden(f"'{username}' is disabled here; ask an administrator", code="account_disabled")
            elif user.role != role:
                details["role_was"] = user.role
                user.role = role
                self._x.notifier.publish(s, Topic.PRINCIPALS)
            user.last_login_at, user.full_name = now, full_name or user.full_name
            s.flush()  # a new user's row before its session's
            result = self._sessions.open_session(s, user, now, source_ip)
            self._x.audit.add(s, RequestContext(result.principal, source_ip, request_id), action="auth.login",
                              object_type="user", object_id=username, details=details)
        return result
