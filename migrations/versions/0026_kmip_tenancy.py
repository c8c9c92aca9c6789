"""KMIP tenancy: every KMIP client has a group, every object a group, and grants let a
client or group see another group's objects (docs/kmip.md "Tenancy", decision 0022)

Upgrading: a client's group is its name; an object a client made (owner `kmip:<name>`)
goes to that client's group; every other object, made over REST before tenancy, goes to
group `shared`, and every unrevoked client is granted all four rights on `shared`, so no
running client breaks while the objects clients made themselves stop leaking.

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-26
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = '0026'
down_revision = '0025'
branch_labels = None
depends_on = None

OBJECT_TABLES = ('managed_keys', 'kmip_public_keys', 'kmip_sealed_objects')
SHARED = 'shared'
ALL_RIGHTS = ['read', 'use', 'export', 'destroy']


def upgrade() -> None:
    # Nullable, NULL meaning "its own name": a replica of the previous release, still
    # serving through a rolling upgrade (docs/operations.md), issues clients without one.
    with op.batch_alter_table('kmip_clients') as batch:
        batch.add_column(sa.Column('group', sa.String(length=64), nullable=True))
        batch.create_index('ix_kmip_clients_group', ['group'])
    op.execute('UPDATE kmip_clients SET "group" = name')
    for table in OBJECT_TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column('kmip_group', sa.String(length=64), nullable=True))
            batch.create_index(f'ix_{table}_kmip_group', ['kmip_group'])
        # The creator's group where the creator is a known client; `shared` otherwise.
        # (Table names are this module's constants.)
        op.execute(f"UPDATE {table} SET kmip_group = (SELECT c.\"group\" FROM kmip_clients c "  # noqa: S608
                   f"WHERE 'kmip:' || c.name = {table}.owner)")
        op.execute(sa.text(f"UPDATE {table} SET kmip_group = :shared WHERE kmip_group IS NULL")  # noqa: S608
                   .bindparams(shared=SHARED))
    grants = op.create_table(
        'kmip_grants',
        sa.Column('id', sa.Uuid(), nullable=False),
        sa.Column('grantee', sa.String(length=72), nullable=False),
        sa.Column('target_kind', sa.String(length=8), nullable=False),
        sa.Column('target', sa.String(length=64), nullable=False),
        sa.Column('rights', sa.JSON(), nullable=False),
        sa.Column('created_by', sa.String(length=300), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('grantee', 'target_kind', 'target', name='uq_kmip_grants_grantee_target'),
    )
    op.create_index('ix_kmip_grants_target', 'kmip_grants', ['target'])
    bind = op.get_bind()
    clients = bind.execute(sa.text('SELECT name FROM kmip_clients WHERE revoked_at IS NULL')).scalars().all()
    now = datetime.now(UTC)
    if clients:
        op.bulk_insert(grants, [
            {'id': uuid.uuid4(), 'grantee': f'client:{name}', 'target_kind': 'group', 'target': SHARED,
             'rights': ALL_RIGHTS, 'created_by': 'migration 0026', 'created_at': now}
            for name in clients])


def downgrade() -> None:
    op.drop_index('ix_kmip_grants_target', table_name='kmip_grants')
    op.drop_table('kmip_grants')
    for table in reversed(OBJECT_TABLES):
        with op.batch_alter_table(table) as batch:
            batch.drop_index(f'ix_{table}_kmip_group')
            batch.drop_column('kmip_group')
    with op.batch_alter_table('kmip_clients') as batch:
        batch.drop_index('ix_kmip_clients_group')
        batch.drop_column('group')
