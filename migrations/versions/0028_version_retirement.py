"""Retiring a key version (decision 0024): retirements and their exclusions, and the
per-version data-key counts the inventory reads, backfilled from the audit chain

Revision ID: 0028
Revises: 0027
Create Date: 2026-11-26
"""

from __future__ import annotations

import uuid
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = '0028'
down_revision = '0027'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'version_retirements',
        sa.Column('id', sa.Uuid(), nullable=False),
        sa.Column('key_id', sa.Uuid(), nullable=False),
        sa.Column('version', sa.Integer(), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('reason', sa.Text(), nullable=False),
        sa.Column('contents', sa.Boolean(), nullable=False),
        sa.Column('requested_by', sa.String(length=300), nullable=False),
        sa.Column('requested_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('completed_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('cancelled_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('cancelled_by', sa.String(length=300), nullable=True),
        sa.Column('statement_seq', sa.BigInteger(), nullable=True),
        sa.Column('initial', sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(['key_id'], ['managed_keys.id'], ondelete='RESTRICT'),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_version_retirements_key_version', 'version_retirements', ['key_id', 'version'])
    op.create_index('ix_version_retirements_state', 'version_retirements', ['state'])
    op.create_table(
        'retirement_exclusions',
        sa.Column('id', sa.Uuid(), nullable=False),
        sa.Column('retirement_id', sa.Uuid(), nullable=False),
        sa.Column('kind', sa.String(length=32), nullable=False),
        sa.Column('holder', sa.String(length=300), nullable=False),
        sa.Column('reason', sa.Text(), nullable=False),
        sa.Column('excluded_by', sa.String(length=300), nullable=False),
        sa.Column('excluded_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['retirement_id'], ['version_retirements.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('retirement_id', 'kind', 'holder', name='uq_retirement_exclusions_holder'),
    )
    datakeys = op.create_table(
        'key_version_datakeys',
        sa.Column('key_id', sa.Uuid(), nullable=False),
        sa.Column('version', sa.Integer(), nullable=False),
        sa.Column('issued', sa.BigInteger(), nullable=False),
        sa.Column('legacy_reencrypted', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('key_id', 'version'),
    )
    op.create_table(
        'datakey_reencrypted',
        sa.Column('key_id', sa.Uuid(), nullable=False),
        sa.Column('version', sa.Integer(), nullable=False),
        sa.Column('iv', sa.LargeBinary(length=12), nullable=False),
        sa.PrimaryKeyConstraint('key_id', 'version', 'iv'),
    )
    _backfill(datakeys)


def _backfill(datakeys: sa.Table) -> None:
    """The counts the chainer keeps from now on (chain.py), for the records chained before:
    data keys issued per version, and re-encryptions off it. Those re-encryptions did not
    record the old blob's IV, so each counts as one blob (`legacy_reencrypted`)."""
    events = sa.table('audit_events', sa.column('object_id', sa.Text()), sa.column('action', sa.String()),
                      sa.column('actor', sa.String()),
                      sa.column('outcome', sa.String()), sa.column('details', sa.JSON()))
    # ->> on PostgreSQL, json_extract on SQLite
    v = events.c.details['version'].as_string().label('v')
    fv = events.c.details['from_version'].as_string().label('fv')
    rows = op.get_bind().execute(
        sa.select(events.c.object_id, events.c.action, v, fv, sa.func.count().label('n'))
        # A host's data keys are its volumes' passphrases, which the inventory counts as volumes.
        .where(events.c.outcome == 'allowed', events.c.actor.not_like('host:%'), events.c.action.in_(
            ['datakey.generate', 'datakey.generate_without_plaintext', 'datakey.reencrypt']))
        .group_by(events.c.object_id, events.c.action, v, fv)).all()
    counts: dict[tuple[uuid.UUID, int], list[int]] = {}
    for object_id, action, v, fv, n in rows:
        try:
            key_id = uuid.UUID(str(object_id))
            number = int(fv if action == 'datakey.reencrypt' else v)
        except (TypeError, ValueError):
            continue  # not a record of one key's version: nothing to count
        entry = counts.setdefault((key_id, number), [0, 0])
        entry[1 if action == 'datakey.reencrypt' else 0] += int(n)
    values: list[dict[str, Any]] = [{"key_id": k, "version": v, "issued": i, "legacy_reencrypted": r}
                                    for (k, v), (i, r) in counts.items()]
    if values:
        op.bulk_insert(datakeys, values)


def downgrade() -> None:
    op.drop_table('datakey_reencrypted')
    op.drop_table('key_version_datakeys')
    op.drop_table('retirement_exclusions')
    op.drop_index('ix_version_retirements_state', table_name='version_retirements')
    op.drop_index('ix_version_retirements_key_version', table_name='version_retirements')
    op.drop_table('version_retirements')
