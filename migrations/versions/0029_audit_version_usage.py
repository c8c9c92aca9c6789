"""who used which version of a key: per (key, version, actor) usage counts the chainer
keeps, backfilled from the audit chain, so the inventory's AWS key stores and KMIP
clients are one look by primary key instead of a scan of the records per actor
(decision 0024, amendment of 2026-11-27)

Revision ID: 0029
Revises: 0028
Create Date: 2026-11-27
"""

from __future__ import annotations

import uuid
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = '0029'
down_revision = '0028'
branch_labels = None
depends_on = None

# keyserver.core.audit.statements.VERSION_FIELDS as it was when this ran: the use actions
# and the details fields naming the version each used.
_VERSION_FIELDS: dict[str, tuple[str, ...]] = {
    "key.encrypt": ("version",), "key.decrypt": ("version",), "key.sign": ("version",), "key.verify": ("version",),
    "key.mac": ("version",), "key.mac_verify": ("version",), "key.export": ("version",),
    "key.deliver": ("version",), "database.key_read": ("version",), "datakey.generate": ("version",),
    "datakey.generate_without_plaintext": ("version",), "datakey.decrypt": ("version",),
    "datakey.reencrypt": ("from_version", "to_version"),
}
_FIELDS = ("version", "from_version", "to_version")


def upgrade() -> None:
    usage = op.create_table(
        'audit_version_usage',
        sa.Column('key_id', sa.Uuid(), nullable=False),
        sa.Column('version', sa.Integer(), nullable=False),
        sa.Column('actor', sa.String(length=300), nullable=False),
        sa.Column('first_used', sa.DateTime(timezone=True), nullable=False),
        sa.Column('last_used', sa.DateTime(timezone=True), nullable=False),
        sa.Column('count', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('key_id', 'version', 'actor'),
    )
    _backfill(usage)


def _integer(details: Any, field: str, dialect: str) -> Any:
    """The details field as text when it is a JSON integer, else NULL: the chainer's rule
    (an integer, never a boolean, a string or a fraction), on each store's own JSON."""
    if dialect == 'postgresql':
        text = details[field].as_string()  # ->>
        return sa.case((sa.and_(sa.func.json_typeof(details[field]) == 'number', text.regexp_match('^[0-9]+$')), text),
                       else_=None)
    path = f'$."{field}"'
    return sa.case((sa.func.json_type(details, path) == 'integer', sa.func.json_extract(details, path)), else_=None)


def _backfill(usage: sa.Table) -> None:
    """What the chainer counts from now on (chain.py `_count_version_use`), for the
    records chained before: allowed use records on a key, grouped in SQL by key, actor and
    the versions they name, folded per (key, version, actor) here."""
    bind = op.get_bind()
    events = sa.table('audit_events', sa.column('time', sa.DateTime(timezone=True)),
                      sa.column('object_type', sa.String()), sa.column('object_id', sa.Text()),
                      sa.column('actor', sa.String()), sa.column('action', sa.String()),
                      sa.column('outcome', sa.String()), sa.column('details', sa.JSON()))
    named = [_integer(events.c.details, f, bind.dialect.name).label(f) for f in _FIELDS]
    rows = bind.execute(
        sa.select(events.c.object_id, events.c.actor, events.c.action, *named, sa.func.min(events.c.time),
                  sa.func.max(events.c.time), sa.func.count())
        .where(events.c.outcome == 'allowed', events.c.object_type == 'key', events.c.object_id.is_not(None),
               events.c.action.in_(list(_VERSION_FIELDS)))
        .group_by(events.c.object_id, events.c.actor, events.c.action, *named)).all()
    uses: dict[tuple[uuid.UUID, int, str], list[Any]] = {}
    for object_id, actor, action, *rest in rows:
        versions, (first, last, n) = dict(zip(_FIELDS, rest[:3], strict=True)), rest[3:]
        try:
            key_id = uuid.UUID(str(object_id))
        except ValueError:
            continue  # not one key's id: no version of it to name
        numbers = {int(versions[f]) for f in _VERSION_FIELDS[action] if versions[f] is not None}
        for v in numbers:
            if not 0 < v < 2**31:
                continue
            entry = uses.setdefault((key_id, v, actor), [first, last, 0])
            entry[0], entry[1], entry[2] = min(entry[0], first), max(entry[1], last), entry[2] + int(n)
    values = [{"key_id": k, "version": v, "actor": a, "first_used": first, "last_used": last,
               "count": n} for (k, v, a), (first, last, n) in uses.items()]
    if values:
        op.bulk_insert(usage, values)


def downgrade() -> None:
    op.drop_table('audit_version_usage')
