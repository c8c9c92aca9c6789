"""AWS KMS external key stores: an optional client certificate subject per store, required
of every call when set (mutual TLS on the XKS port; decision 0023)

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0027'
down_revision = '0026'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, no default: existing stores keep SigV4 alone until an operator sets one.
    with op.batch_alter_table('xks_stores') as batch:
        batch.add_column(sa.Column('client_cert_subject', sa.String(length=253), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('xks_stores') as batch:
        batch.drop_column('client_cert_subject')
