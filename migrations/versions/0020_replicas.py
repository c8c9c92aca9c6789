"""the key server's replicas as each reports itself (the System page's list)

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'replicas',
        sa.Column('id', sa.String(length=240), nullable=False),
        sa.Column('hostname', sa.String(length=253), nullable=False),
        sa.Column('pid', sa.Integer(), nullable=False),
        sa.Column('version', sa.String(length=64), nullable=False),
        sa.Column('store', sa.String(length=16), nullable=False),
        sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('last_seen_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('scheduler_error', sa.String(length=500), nullable=True),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_replicas_last_seen_at', 'replicas', ['last_seen_at'])


def downgrade() -> None:
    op.drop_index('ix_replicas_last_seen_at', table_name='replicas')
    op.drop_table('replicas')
