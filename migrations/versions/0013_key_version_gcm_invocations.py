"""key versions count their AES-GCM encryptions (NIST SP 800-38D's 2^32 with random IVs)

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing versions start at 0: what they encrypted before was not counted (documented).
    with op.batch_alter_table('key_versions') as batch:
        batch.add_column(sa.Column('gcm_invocations', sa.BigInteger(), nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('key_versions') as batch:
        batch.drop_column('gcm_invocations')
