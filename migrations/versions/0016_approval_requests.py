"""the two-person rule: actions held until other people approve them

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'approval_requests',
        sa.Column('id', sa.Uuid(), nullable=False),
        sa.Column('action', sa.String(length=32), nullable=False),
        sa.Column('target', sa.String(length=200), nullable=False),
        sa.Column('params', sa.JSON(), nullable=False),
        sa.Column('requested_by', sa.String(length=200), nullable=False),
        sa.Column('requester_user_id', sa.Uuid(), nullable=True),
        sa.Column('required', sa.Integer(), nullable=False),
        sa.Column('approvals', sa.JSON(), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('decided_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('result', sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_approval_requests_created_at', 'approval_requests', ['created_at'])


def downgrade() -> None:
    op.drop_index('ix_approval_requests_created_at', table_name='approval_requests')
    op.drop_table('approval_requests')
