"""hosts and enrollment

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('enrollment_tokens',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('lookup_id', sa.String(length=32), nullable=False),
    sa.Column('secret_hash', sa.String(length=64), nullable=False),
    sa.Column('host_group', sa.String(length=64), nullable=False),
    sa.Column('max_uses', sa.Integer(), nullable=False),
    sa.Column('uses', sa.Integer(), nullable=False),
    sa.Column('created_by', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('lookup_id')
    )
    with op.batch_alter_table('enrollment_tokens', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_enrollment_tokens_host_group'), ['host_group'], unique=False)

    op.create_table('hosts',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('hostname', sa.String(length=253), nullable=False),
    sa.Column('host_group', sa.String(length=64), nullable=False),
    sa.Column('os', sa.String(length=200), nullable=False),
    sa.Column('agent_version', sa.String(length=64), nullable=False),
    sa.Column('cert_serial', sa.String(length=64), nullable=False),
    sa.Column('cert_pem', sa.Text(), nullable=False),
    sa.Column('public_key_der', sa.LargeBinary(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('enrolled_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_heartbeat_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('token_id', sa.Uuid(), nullable=True),
    sa.ForeignKeyConstraint(['token_id'], ['enrollment_tokens.id'], ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('cert_serial')
    )
    with op.batch_alter_table('hosts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_hosts_host_group'), ['host_group'], unique=False)
        batch_op.create_index(batch_op.f('ix_hosts_hostname'), ['hostname'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('hosts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_hosts_hostname'))
        batch_op.drop_index(batch_op.f('ix_hosts_host_group'))

    op.drop_table('hosts')
    with op.batch_alter_table('enrollment_tokens', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_enrollment_tokens_host_group'))

    op.drop_table('enrollment_tokens')
