"""audit checkpoints: signed anchors of the chain, and how far it has been verified

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'audit_checkpoints',
        sa.Column('id', sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column('seq', sa.BigInteger(), nullable=False),
        sa.Column('hash', sa.String(length=64), nullable=False),
        sa.Column('time', sa.DateTime(timezone=True), nullable=False),
        sa.Column('prev_digest', sa.String(length=64), nullable=False),
        sa.Column('key_fingerprint', sa.String(length=64), nullable=False),
        sa.Column('signature', sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_table(
        'audit_verified',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('checkpoint', sa.BigInteger(), nullable=False),
        sa.Column('seq', sa.BigInteger(), nullable=False),
        sa.Column('hash', sa.String(length=64), nullable=False),
        sa.Column('verified_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )


def downgrade() -> None:
    op.drop_table('audit_verified')
    op.drop_table('audit_checkpoints')
