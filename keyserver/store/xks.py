"""The tables of AWS KMS external key stores (issue 28): a key store's SigV4 credential
(the secret sealed under the KEK, never in plaintext) and the managed keys granted to
it under the external key ids AWS KMS asks for.

Mapped on `models.Base` beside the other tables; `keyserver/store/__init__.py` imports
this module, so the metadata always holds them.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import ForeignKey, LargeBinary, String, Text, UniqueConstraint, Uuid
from sqlalchemy.orm import Mapped, mapped_column, relationship

from keyserver.store.models import Base, ManagedKey


class XksStore(Base):
    __tablename__ = "xks_stores"
    __table_args__ = (UniqueConstraint("name", name="uq_xks_stores_name"),
                      UniqueConstraint("access_key_id", name="uq_xks_stores_access_key_id"),
                      UniqueConstraint("previous_access_key_id", name="uq_xks_stores_previous_access_key_id"))

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(64))
    description: Mapped[str] = mapped_column(Text, default="")
    region: Mapped[str] = mapped_column(String(32))
    access_key_id: Mapped[str] = mapped_column(String(32))
    # The secret access key: AES-KWP under its own DEK, the DEK wrapped under the KEK (core/kmip_sealed.py).
    secret_dek_wrapping_key_id: Mapped[str] = mapped_column(String(64))
    secret_dek_mechanism: Mapped[str] = mapped_column(String(32))
    secret_dek: Mapped[bytes] = mapped_column(LargeBinary)
    secret_sealed: Mapped[bytes] = mapped_column(LargeBinary)
    credential_issued_at: Mapped[datetime]
    # The credential before the last re-issue, still accepted until retired (the XKS API's
    # rotation: AWS KMS's hosts move to the new one over some time).
    previous_access_key_id: Mapped[str | None] = mapped_column(String(32))
    previous_dek_wrapping_key_id: Mapped[str | None] = mapped_column(String(64))
    previous_dek_mechanism: Mapped[str | None] = mapped_column(String(32))
    previous_dek: Mapped[bytes | None] = mapped_column(LargeBinary)
    previous_sealed: Mapped[bytes | None] = mapped_column(LargeBinary)
    previous_issued_at: Mapped[datetime | None]
    # When set, every call must come over the XKS port with a verified client certificate
    # whose CN or a DNS SAN is this name (decision 0023); else SigV4 alone.
    client_cert_subject: Mapped[str | None] = mapped_column(String(253))
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(300))
    last_seen_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]

    keys: Mapped[list[XksKey]] = relationship(
        back_populates="store", order_by="XksKey.external_id", lazy="selectin", cascade="all, delete-orphan"
    )


class XksKey(Base):
    """A managed AES-256 key AWS KMS uses through one key store under its external key id."""

    __tablename__ = "xks_keys"
    __table_args__ = (UniqueConstraint("store_id", "external_id", name="uq_xks_keys_external_id"),)

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    store_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("xks_stores.id", ondelete="CASCADE"))
    external_id: Mapped[str] = mapped_column(String(128))
    key_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("managed_keys.id", ondelete="RESTRICT"), index=True)
    granted_at: Mapped[datetime]
    granted_by: Mapped[str] = mapped_column(String(300))
    last_used_at: Mapped[datetime | None]

    store: Mapped[XksStore] = relationship(back_populates="keys")
    key: Mapped[ManagedKey] = relationship(lazy="joined")
