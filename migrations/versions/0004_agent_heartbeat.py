"""what agents report in their heartbeat

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('hosts') as batch:
        batch.add_column(sa.Column('last_seen_ip', sa.String(length=64), nullable=True))
        batch.add_column(sa.Column('guard_points', sa.JSON(), nullable=False, server_default='[]'))


def downgrade() -> None:
    with op.batch_alter_table('hosts') as batch:
        batch.drop_column('guard_points')
        batch.drop_column('last_seen_ip')
