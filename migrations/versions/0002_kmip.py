"""kmip: internal CA, client identities, registered public keys

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('kmip_ca',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('certificate_pem', sa.Text(), nullable=False),
    sa.Column('sealed_private_key', sa.LargeBinary(), nullable=False),
    sa.Column('dek_wrapped', sa.LargeBinary(), nullable=False),
    sa.Column('dek_wrapping_key_id', sa.String(length=128), nullable=False),
    sa.Column('dek_mechanism', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('kmip_clients',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('role', sa.String(length=32), nullable=False),
    sa.Column('serial', sa.String(length=64), nullable=False),
    sa.Column('fingerprint_sha256', sa.String(length=64), nullable=False),
    sa.Column('not_after', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_by', sa.String(length=200), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name'),
    sa.UniqueConstraint('serial')
    )
    op.create_table('kmip_public_keys',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=True),
    sa.Column('owner', sa.String(length=200), nullable=False),
    sa.Column('der', sa.LargeBinary(), nullable=False),
    sa.Column('length_bits', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=32), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('kmip_public_keys', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_kmip_public_keys_name'), ['name'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('kmip_public_keys', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_kmip_public_keys_name'))
    op.drop_table('kmip_public_keys')
    op.drop_table('kmip_clients')
    op.drop_table('kmip_ca')
