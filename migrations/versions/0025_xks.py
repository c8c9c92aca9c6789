"""AWS KMS external key stores: each store's SigV4 credential (secret sealed under the
KEK) and the managed keys granted to it under external key ids (docs/integrations.md)

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0025'
down_revision = '0024'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'xks_stores',
        sa.Column('id', sa.Uuid(), nullable=False),
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('description', sa.Text(), nullable=False),
        sa.Column('region', sa.String(length=32), nullable=False),
        sa.Column('access_key_id', sa.String(length=32), nullable=False),
        sa.Column('secret_dek_wrapping_key_id', sa.String(length=64), nullable=False),
        sa.Column('secret_dek_mechanism', sa.String(length=32), nullable=False),
        sa.Column('secret_dek', sa.LargeBinary(), nullable=False),
        sa.Column('secret_sealed', sa.LargeBinary(), nullable=False),
        sa.Column('credential_issued_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('previous_access_key_id', sa.String(length=32), nullable=True),
        sa.Column('previous_dek_wrapping_key_id', sa.String(length=64), nullable=True),
        sa.Column('previous_dek_mechanism', sa.String(length=32), nullable=True),
        sa.Column('previous_dek', sa.LargeBinary(), nullable=True),
        sa.Column('previous_sealed', sa.LargeBinary(), nullable=True),
        sa.Column('previous_issued_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('created_by', sa.String(length=300), nullable=False),
        sa.Column('last_seen_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('name', name='uq_xks_stores_name'),
        sa.UniqueConstraint('access_key_id', name='uq_xks_stores_access_key_id'),
        sa.UniqueConstraint('previous_access_key_id', name='uq_xks_stores_previous_access_key_id'),
    )
    op.create_table(
        'xks_keys',
        sa.Column('id', sa.Uuid(), nullable=False),
        sa.Column('store_id', sa.Uuid(), nullable=False),
        sa.Column('external_id', sa.String(length=128), nullable=False),
        sa.Column('key_id', sa.Uuid(), nullable=False),
        sa.Column('granted_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('granted_by', sa.String(length=300), nullable=False),
        sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['store_id'], ['xks_stores.id'], ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['key_id'], ['managed_keys.id'], ondelete='RESTRICT'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('store_id', 'external_id', name='uq_xks_keys_external_id'),
    )
    op.create_index('ix_xks_keys_key_id', 'xks_keys', ['key_id'])


def downgrade() -> None:
    op.drop_table('xks_keys')
    op.drop_table('xks_stores')
