"""LUKS2 block volumes bound to the key server (docs/volumes.md)

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'volumes',
        sa.Column('id', sa.Uuid(), nullable=False),
        sa.Column('host_id', sa.Uuid(), nullable=False),
        sa.Column('host_group', sa.String(length=64), nullable=False),
        sa.Column('scope', sa.String(length=8), nullable=False),
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('path', sa.String(length=1024), nullable=False),
        sa.Column('key_id', sa.Uuid(), nullable=False),
        sa.Column('key_version', sa.Integer(), nullable=False),
        sa.Column('luks_uuid', sa.String(length=36), nullable=True),
        sa.Column('size_bytes', sa.BigInteger(), nullable=True),
        sa.Column('sector_size', sa.Integer(), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('opened_by', sa.String(length=16), nullable=True),
        sa.Column('rekey_generation', sa.Integer(), server_default='0', nullable=False),
        sa.Column('rekey_applied', sa.Integer(), server_default='0', nullable=False),
        sa.Column('rekey_progress', sa.JSON(), nullable=True),
        sa.Column('recovery_created_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('grace_seconds', sa.Integer(), server_default='0', nullable=False),
        sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('created_by', sa.String(length=200), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('last_opened_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['host_id'], ['hosts.id'], ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['key_id'], ['managed_keys.id'], ondelete='RESTRICT'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('host_id', 'name', name='uq_volumes_host_name'),
    )
    op.create_index('ix_volumes_host_id', 'volumes', ['host_id'])
    op.create_index('ix_volumes_host_group', 'volumes', ['host_group'])
    op.create_index('ix_volumes_key_id', 'volumes', ['key_id'])
    op.create_index('ix_volumes_state', 'volumes', ['state'])


def downgrade() -> None:
    op.drop_table('volumes')
