"""KEK retirement: a KEK rotated away from is 'superseded' (still in the token) until
`keyserver retire-kek` removes it ('retired', by whom); rotations count per kind

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('keks') as batch:
        batch.add_column(sa.Column('superseded_at', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('retired_by', sa.String(length=200), nullable=True))
    with op.batch_alter_table('kek_rotations') as batch:
        batch.add_column(sa.Column('progress', sa.JSON(), nullable=False, server_default='{}'))
    # 'retired' used to mean what 'superseded' means now: rotated away from, still in the token.
    op.execute("UPDATE keks SET state = 'superseded', superseded_at = retired_at, retired_at = NULL "
               "WHERE state = 'retired'")


def downgrade() -> None:
    # A KEK removed from the token stays 'retired'; a superseded one was called retired before.
    op.execute("UPDATE keks SET state = 'retired', retired_at = superseded_at WHERE state = 'superseded'")
    with op.batch_alter_table('kek_rotations') as batch:
        batch.drop_column('progress')
    with op.batch_alter_table('keks') as batch:
        batch.drop_column('retired_by')
        batch.drop_column('superseded_at')
