"""The tables of database identities (issue 27): a database that reads its encryption
keys over the KV-v2 compatible front (MariaDB's hashicorp_key_management plugin), and
the managed keys granted to it under the numeric key ids the database asks for.

Mapped on `models.Base` beside the other tables (models.py is at its size limit);
`keyserver/store/__init__.py` imports this module, so the metadata always holds them.
The token is stored as a lookup id and a SHA-256 of its secret, as API tokens are.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, String, Text, UniqueConstraint, Uuid
from sqlalchemy.orm import Mapped, mapped_column, relationship

from keyserver.store.models import Base, ManagedKey


class DatabaseIdentity(Base):
    __tablename__ = "databases"
    __table_args__ = (UniqueConstraint("name", name="uq_databases_name"),
                      UniqueConstraint("token_lookup", name="uq_databases_token_lookup"))

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(64))
    description: Mapped[str] = mapped_column(Text, default="")
    kind: Mapped[str] = mapped_column(String(16), default="mariadb")
    token_lookup: Mapped[str] = mapped_column(String(32))
    token_hash: Mapped[str] = mapped_column(String(64))
    token_issued_at: Mapped[datetime]
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(300))
    last_seen_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]

    grants: Mapped[list[DatabaseGrant]] = relationship(
        back_populates="database", order_by="DatabaseGrant.kv_id", lazy="selectin", cascade="all, delete-orphan"
    )


class DatabaseGrant(Base):
    """A managed key readable by one database under its numeric key id (1..2^32-1)."""

    __tablename__ = "database_grants"
    __table_args__ = (UniqueConstraint("database_id", "kv_id", name="uq_database_grants_kv_id"),)

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    database_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("databases.id", ondelete="CASCADE"))
    kv_id: Mapped[int] = mapped_column(BigInteger)
    key_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("managed_keys.id", ondelete="RESTRICT"), index=True)
    granted_at: Mapped[datetime]
    granted_by: Mapped[str] = mapped_column(String(300))
    last_read_at: Mapped[datetime | None]
    last_read_version: Mapped[int | None] = mapped_column(BigInteger)

    database: Mapped[DatabaseIdentity] = relationship(back_populates="grants")
    key: Mapped[ManagedKey] = relationship(lazy="joined")
