"""KMIP client key-export setting: plaintext (KMIP's default), wrapped only, or none

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing clients keep what they could do: plaintext export, as their role allows.
    with op.batch_alter_table('kmip_clients') as batch:
        batch.add_column(sa.Column('key_export', sa.String(length=16), nullable=False,
                                   server_default='plaintext'))


def downgrade() -> None:
    with op.batch_alter_table('kmip_clients') as batch:
        batch.drop_column('key_export')
