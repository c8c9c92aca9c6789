"""guard points: protected directories and their access policy

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('guard_points',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('host_group', sa.String(length=64), nullable=True),
    sa.Column('host_id', sa.Uuid(), nullable=True),
    sa.Column('path', sa.String(length=1024), nullable=False),
    sa.Column('backing_path', sa.String(length=1024), nullable=False),
    sa.Column('key_id', sa.Uuid(), nullable=False),
    sa.Column('chunk_size', sa.Integer(), nullable=False),
    sa.Column('mode', sa.String(length=16), nullable=False),
    sa.Column('rules', sa.JSON(), nullable=False),
    sa.Column('default_effect', sa.String(length=8), nullable=False),
    sa.Column('revision', sa.Integer(), nullable=False),
    sa.Column('rekey_generation', sa.Integer(), nullable=False, server_default='0'),
    sa.Column('created_by', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['host_id'], ['hosts.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['key_id'], ['managed_keys.id'], ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id'),
    )
    with op.batch_alter_table('guard_points') as batch:
        batch.create_index(batch.f('ix_guard_points_host_group'), ['host_group'], unique=False)
        batch.create_index(batch.f('ix_guard_points_host_id'), ['host_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('guard_points') as batch:
        batch.drop_index(batch.f('ix_guard_points_host_id'))
        batch.drop_index(batch.f('ix_guard_points_host_group'))
    op.drop_table('guard_points')
