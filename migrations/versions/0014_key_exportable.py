"""per-key export policy: a key may be kept from ever leaving in plaintext

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('managed_keys') as batch:
        batch.add_column(sa.Column('exportable', sa.Boolean(), nullable=False, server_default=sa.true()))


def downgrade() -> None:
    with op.batch_alter_table('managed_keys') as batch:
        batch.drop_column('exportable')
