"""database identities and their key grants: the KV-v2 compatible front that MariaDB's
hashicorp_key_management plugin reads its encryption keys from (docs/integrations.md)

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0024'
down_revision = '0023'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'databases',
        sa.Column('id', sa.Uuid(), nullable=False),
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('description', sa.Text(), nullable=False),
        sa.Column('kind', sa.String(length=16), nullable=False),
        sa.Column('token_lookup', sa.String(length=32), nullable=False),
        sa.Column('token_hash', sa.String(length=64), nullable=False),
        sa.Column('token_issued_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('created_by', sa.String(length=300), nullable=False),
        sa.Column('last_seen_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('name', name='uq_databases_name'),
        sa.UniqueConstraint('token_lookup', name='uq_databases_token_lookup'),
    )
    op.create_table(
        'database_grants',
        sa.Column('id', sa.Uuid(), nullable=False),
        sa.Column('database_id', sa.Uuid(), nullable=False),
        sa.Column('kv_id', sa.BigInteger(), nullable=False),
        sa.Column('key_id', sa.Uuid(), nullable=False),
        sa.Column('granted_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('granted_by', sa.String(length=300), nullable=False),
        sa.Column('last_read_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('last_read_version', sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(['database_id'], ['databases.id'], ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['key_id'], ['managed_keys.id'], ondelete='RESTRICT'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('database_id', 'kv_id', name='uq_database_grants_kv_id'),
    )
    op.create_index('ix_database_grants_key_id', 'database_grants', ['key_id'])


def downgrade() -> None:
    op.drop_table('database_grants')
    op.drop_table('databases')
