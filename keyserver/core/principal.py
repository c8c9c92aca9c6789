"""Who is asking, and from where: passed into every core service call."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

from keyserver.core.permissions import Permission

ActorType = Literal["user", "token", "host", "system", "anonymous"]


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    actor_type: ActorType
    role: str | None
    permissions: frozenset[Permission]
    user_id: uuid.UUID | None = None
    token_id: uuid.UUID | None = None
    must_change_password: bool = False
    # A KMIP client's tenancy group (core/kmip_tenancy.py); None: not a KMIP client, not scoped.
    kmip_group: str | None = None


@dataclass(frozen=True, slots=True)
class RequestContext:
    principal: Principal
    source_ip: str | None = None
    request_id: str | None = None
    # Set only by the approvals service when it runs an approved action (core/approvals.py).
    approval: str | None = None


SYSTEM = Principal(
    name="system", actor_type="system", role="admin", permissions=frozenset(Permission)
)
ANONYMOUS = Principal(name="anonymous", actor_type="anonymous", role=None, permissions=frozenset())


def system_context(name: str = "system", *, request_id: str | None = None) -> RequestContext:
    principal = SYSTEM if name == "system" else Principal(
        name=name, actor_type="system", role="admin", permissions=frozenset(Permission)
    )
    return RequestContext(principal=principal, request_id=request_id)
