"""KMIP key pairs, secret data and certificates

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

_PUBLIC_KEY_COLUMNS = ('private_key_id', 'activation_date', 'deactivation_date', 'compromise_date',
                       'destroy_date', 'revocation_reason')


def upgrade() -> None:
    op.create_table('kmip_sealed_objects',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('object_type', sa.String(length=32), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=True),
    sa.Column('owner', sa.String(length=200), nullable=False),
    sa.Column('algorithm', sa.String(length=16), nullable=True),
    sa.Column('length_bits', sa.Integer(), nullable=True),
    sa.Column('data_type', sa.String(length=32), nullable=True),
    sa.Column('state', sa.String(length=32), nullable=False),
    sa.Column('public_key_id', sa.Uuid(), nullable=True),
    sa.Column('dek_wrapping_key_id', sa.String(length=128), nullable=True),
    sa.Column('dek_mechanism', sa.String(length=32), nullable=True),
    sa.Column('dek_ciphertext', sa.LargeBinary(), nullable=True),
    sa.Column('mechanism', sa.String(length=32), nullable=True),
    sa.Column('material', sa.LargeBinary(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('activation_date', sa.DateTime(timezone=True), nullable=True),
    sa.Column('deactivation_date', sa.DateTime(timezone=True), nullable=True),
    sa.Column('compromise_date', sa.DateTime(timezone=True), nullable=True),
    sa.Column('destroy_date', sa.DateTime(timezone=True), nullable=True),
    sa.Column('revocation_reason', sa.String(length=64), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('kmip_sealed_objects', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_kmip_sealed_objects_name'), ['name'], unique=False)
        batch_op.create_index(batch_op.f('ix_kmip_sealed_objects_object_type'), ['object_type'], unique=False)
    with op.batch_alter_table('kmip_public_keys', schema=None) as batch_op:
        batch_op.add_column(sa.Column('private_key_id', sa.Uuid(), nullable=True))
        batch_op.add_column(sa.Column('activation_date', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('deactivation_date', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('compromise_date', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('destroy_date', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('revocation_reason', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('kmip_public_keys', schema=None) as batch_op:
        for column in reversed(_PUBLIC_KEY_COLUMNS):
            batch_op.drop_column(column)
    with op.batch_alter_table('kmip_sealed_objects', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_kmip_sealed_objects_object_type'))
        batch_op.drop_index(batch_op.f('ix_kmip_sealed_objects_name'))
    op.drop_table('kmip_sealed_objects')
