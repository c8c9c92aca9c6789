"""KMIP tenancy grants (migration 0026, docs/kmip.md "Tenancy"): a KMIP client or a
whole group may see and use another group's objects, with the rights listed.

Mapped on `models.Base` beside the other tables; `keyserver/store/__init__.py` imports
this module, so the metadata always holds it.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import String, UniqueConstraint, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from keyserver.store.models import Base


class KmipGrant(Base):
    __tablename__ = "kmip_grants"
    # One grant per grantee and target: rights are changed by replacing it, so a listing
    # never shows two rows that must be read together.
    __table_args__ = (UniqueConstraint("grantee", "target_kind", "target", name="uq_kmip_grants_grantee_target"),)

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    grantee: Mapped[str] = mapped_column(String(72))  # "client:<name>" or "group:<name>"
    target_kind: Mapped[str] = mapped_column(String(8))  # key | object | group
    # A managed key's id (all its versions), a standalone object's uid, or a group's name.
    target: Mapped[str] = mapped_column(String(64), index=True)
    rights: Mapped[list[str]] = mapped_column()  # a non-empty subset of read, use, export, destroy
    created_by: Mapped[str] = mapped_column(String(300))
    created_at: Mapped[datetime]
