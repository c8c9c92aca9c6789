"""audit_verified carries an HMAC under the chain's HSM key (docs/audit.md "Verifying")

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-26

A row written before this migration has no MAC: the first verification after it walks
every record and writes one.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0022'
down_revision = '0021'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('audit_verified') as batch:
        batch.add_column(sa.Column('mac', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('audit_verified') as batch:
        batch.drop_column('mac')
