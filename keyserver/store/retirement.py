"""The tables of a key version's retirement (decision 0024): the retirement itself, the
holders an operator excluded from it, and the chainer's per-version counts that the
inventory reads (data keys issued under a version; distinct blobs re-encrypted off it;
who used the version).

Mapped on `models.Base` beside the other tables; `keyserver/store/__init__.py` imports
this module, so the metadata always holds them.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Connection,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    Uuid,
    case,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Mapped, mapped_column, relationship

from keyserver.store.models import Base

RETIREMENT_STATES = ("running", "complete", "cancelled")


class VersionRetirement(Base):
    __tablename__ = "version_retirements"
    __table_args__ = (Index("ix_version_retirements_key_version", "key_id", "version"),)

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    key_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("managed_keys.id", ondelete="RESTRICT"))
    version: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), index=True)  # running | complete | cancelled
    reason: Mapped[str] = mapped_column(Text, default="")
    # The operator asked for guard points' file contents to be re-keyed too, not only headers re-wrapped.
    contents: Mapped[bool] = mapped_column(Boolean, default=False)
    requested_by: Mapped[str] = mapped_column(String(300))
    requested_at: Mapped[datetime]
    completed_at: Mapped[datetime | None]
    cancelled_at: Mapped[datetime | None]
    cancelled_by: Mapped[str | None] = mapped_column(String(300))
    # The seq of its `key.version_retired` record, once chained.
    statement_seq: Mapped[int | None] = mapped_column(BigInteger)
    # The inventory's counts per kind when it began: the statement's `initial`.
    initial: Mapped[dict[str, Any]] = mapped_column(default=dict)

    exclusions: Mapped[list[RetirementExclusion]] = relationship(
        back_populates="retirement", order_by="RetirementExclusion.excluded_at", lazy="selectin",
        cascade="all, delete-orphan")


class RetirementExclusion(Base):
    """A holder an operator declared clear of the version (a decommissioned host, a client
    known to hold nothing), with the reason: the statement lists it."""

    __tablename__ = "retirement_exclusions"
    __table_args__ = (UniqueConstraint("retirement_id", "kind", "holder", name="uq_retirement_exclusions_holder"),)

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    retirement_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("version_retirements.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(32))
    holder: Mapped[str] = mapped_column(String(300))
    reason: Mapped[str] = mapped_column(Text)
    excluded_by: Mapped[str] = mapped_column(String(300))
    excluded_at: Mapped[datetime]

    retirement: Mapped[VersionRetirement] = relationship(back_populates="exclusions")


class KeyVersionDatakeys(Base):
    """Data keys issued under a version (allowed `datakey.generate*` records, counted by
    the chainer), and re-encryptions off it recorded before `from_iv` was (the
    migration's backfill): those cannot be told apart, so each counts as one blob."""

    __tablename__ = "key_version_datakeys"

    key_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    issued: Mapped[int] = mapped_column(BigInteger, default=0)
    legacy_reencrypted: Mapped[int] = mapped_column(BigInteger, default=0)


class DatakeyReencrypted(Base):
    """A blob re-encrypted off a version, by its IV (12 random bytes per blob): a blob
    re-encrypted twice counts once."""

    __tablename__ = "datakey_reencrypted"

    key_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    iv: Mapped[bytes] = mapped_column(LargeBinary(12), primary_key=True)


class AuditVersionUsage(Base):
    """Who used which version of a key: allowed records of a use action naming the
    version in its details (statements.VERSION_FIELDS), per key, version and actor, kept
    by the chainer in the transaction that chains them (migration 0029 counted the
    records before it). The inventory finds the AWS key stores and KMIP clients that used
    a version here, in one look by the primary key, never in the records."""

    __tablename__ = "audit_version_usage"

    key_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    actor: Mapped[str] = mapped_column(String(300), primary_key=True)
    first_used: Mapped[datetime]
    last_used: Mapped[datetime]
    count: Mapped[int] = mapped_column(BigInteger)


def add_version_usage(conn: Connection, uses: dict[tuple[uuid.UUID, int, str], tuple[datetime, datetime, int]]
                      ) -> None:
    """Add uses per (key id, version, actor) as (first, last, n), one statement (the
    chainer's transaction). A batch's records are not in time order across replicas, so
    the first and last uses are compared, not overwritten."""
    if not uses:
        return
    t = AuditVersionUsage
    stmt = (pg_insert if conn.dialect.name == "postgresql" else sqlite_insert)(t)
    new = stmt.excluded
    conn.execute(stmt.on_conflict_do_update(
        index_elements=[t.key_id, t.version, t.actor],
        set_={"count": t.count + new["count"],
              "first_used": case((new.first_used < t.first_used, new.first_used), else_=t.first_used),
              "last_used": case((new.last_used > t.last_used, new.last_used), else_=t.last_used)}),
        [{"key_id": k, "version": v, "actor": a, "first_used": first, "last_used": last, "count": n}
         for (k, v, a), (first, last, n) in uses.items()])


def add_issued(conn: Connection, counts: dict[tuple[uuid.UUID, int], int]) -> None:
    """Add data keys issued per (key id, version), one statement (the chainer's transaction)."""
    if not counts:
        return
    t = KeyVersionDatakeys
    stmt = (pg_insert if conn.dialect.name == "postgresql" else sqlite_insert)(t)
    conn.execute(stmt.on_conflict_do_update(index_elements=[t.key_id, t.version],
                                            set_={"issued": t.issued + stmt.excluded.issued}),
                 [{"key_id": k, "version": v, "issued": n, "legacy_reencrypted": 0} for (k, v), n in counts.items()])


def add_reencrypted(conn: Connection, blobs: set[tuple[uuid.UUID, int, bytes]]) -> None:
    """Record blobs re-encrypted off a version; one already recorded is left as it is."""
    if not blobs:
        return
    t = DatakeyReencrypted
    stmt = (pg_insert if conn.dialect.name == "postgresql" else sqlite_insert)(t)
    conn.execute(stmt.on_conflict_do_nothing(index_elements=[t.key_id, t.version, t.iv]),
                 [{"key_id": k, "version": v, "iv": iv} for k, v, iv in blobs])
