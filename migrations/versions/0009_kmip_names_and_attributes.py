"""KMIP names are labels; standard KMIP attributes

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24

* managed_keys.name loses its UNIQUE constraint (an index stays): a KMIP Name may be
  shared (PyKMIP's client names every registered key "Symmetric Key"), and a destroyed
  key's name is free again. REST still admits one live key per name (KeyService).
* kmip_attributes (JSON) on managed_keys, kmip_public_keys and kmip_sealed_objects: the
  standard attributes clients set with Add/ModifyAttribute (Contact Information, Object
  Group, Application Specific Information).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

TABLES = ('managed_keys', 'kmip_public_keys', 'kmip_sealed_objects')
# SQLite's inline UNIQUE has no name: batch mode needs one to drop it.
SQLITE_UQ = {"uq": "uq_%(table_name)s_%(column_0_name)s"}


def upgrade() -> None:
    if op.get_bind().dialect.name == 'sqlite':
        with op.batch_alter_table('managed_keys', recreate='always', naming_convention=SQLITE_UQ) as batch_op:
            batch_op.drop_constraint('uq_managed_keys_name', type_='unique')
    else:
        op.drop_constraint('managed_keys_name_key', 'managed_keys', type_='unique')
    with op.batch_alter_table('managed_keys', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_managed_keys_name'), ['name'], unique=False)
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column('kmip_attributes', sa.JSON(), nullable=False, server_default='{}'))


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column('kmip_attributes')
    with op.batch_alter_table('managed_keys', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_managed_keys_name'))
    if op.get_bind().dialect.name == 'sqlite':
        with op.batch_alter_table('managed_keys', recreate='always', naming_convention=SQLITE_UQ) as batch_op:
            batch_op.create_unique_constraint('uq_managed_keys_name', ['name'])
    else:
        op.create_unique_constraint('managed_keys_name_key', 'managed_keys', ['name'])
