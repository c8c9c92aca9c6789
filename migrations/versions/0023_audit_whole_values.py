"""audit records keep whole values: object ids (paths up to 4,096 bytes) and actors (a
253-character hostname after "enrolling:") are no longer cut (docs/audit.md "Fields")

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-26

`audit_events.object_id` becomes unbounded text. Its index becomes a hash index on
PostgreSQL — a B-tree entry holds at most about 2,700 bytes, and a record whose path is
longer would stop the chainer — and an ordinary index on `object_id` on SQLite: records
are looked up by an exact object id (with or without its type). The way down refuses
while a record holds a longer value: cutting it would break the record's MAC.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None

_ACTORS = ('audit_events', 'audit_refusals_hourly', 'audit_usage_hourly')


def upgrade() -> None:
    op.drop_index('ix_audit_events_object', table_name='audit_events')
    for table in _ACTORS:
        with op.batch_alter_table(table) as batch:
            batch.alter_column('actor', existing_type=sa.String(length=200), type_=sa.String(length=300),
                               existing_nullable=False)
            if table == 'audit_events':
                batch.alter_column('object_id', existing_type=sa.String(length=200), type_=sa.Text(),
                                   existing_nullable=True)
    op.create_index('ix_audit_events_object', 'audit_events', ['object_id'], postgresql_using='hash')


def downgrade() -> None:
    # Cutting a chained value would break its record's MAC: refuse instead.
    bind = op.get_bind()
    for table, column in [('audit_events', 'object_id')] + [(t, 'actor') for t in _ACTORS]:
        col = sa.column(column)
        longer = bind.execute(sa.select(sa.func.count()).select_from(sa.table(table, col))
                              .where(sa.func.length(col) > 200)).scalar_one()
        if longer:
            raise RuntimeError(f"cannot downgrade below 0023: {longer} rows of {table} hold a {column} longer "
                               "than 200 characters, and cutting it would break the audit chain")
    op.drop_index('ix_audit_events_object', table_name='audit_events')
    for table in _ACTORS:
        with op.batch_alter_table(table) as batch:
            batch.alter_column('actor', existing_type=sa.String(length=300), type_=sa.String(length=200),
                               existing_nullable=False)
            if table == 'audit_events':
                batch.alter_column('object_id', existing_type=sa.Text(), type_=sa.String(length=200),
                                   existing_nullable=True)
    op.create_index('ix_audit_events_object', 'audit_events', ['object_type', 'object_id'])
