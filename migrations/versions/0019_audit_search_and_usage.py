"""audit records' words and their full-text index (GIN on PostgreSQL, FTS5 on SQLite),
allowed operations on keys per hour, key, actor and action, and hosts' heartbeats per
hour — filled from what is already there

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-25
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None

BATCH = 20_000

# The rule of keyserver.core.audit_search.record_terms as it was when this ran.
_WORD = re.compile(r"[^\W_]+")
_FIELDS = ("actor", "action", "object_type", "object_id", "outcome", "source_ip", "request_id")


def _values(value: Any, out: list[str], depth: int = 0) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int | float):
        out.append(str(value))
    elif depth < 3 and isinstance(value, dict):
        for v in value.values():
            _values(v, out, depth + 1)
    elif depth < 3 and isinstance(value, list | tuple):
        for v in value[:64]:
            _values(v, out, depth + 1)


def _terms(event: dict[str, Any]) -> str:
    strings = [str(event[f]) for f in _FIELDS if event.get(f)]
    _values(event.get("details"), strings)
    seen: dict[str, None] = {}
    for s in strings:
        for w in _WORD.findall(s.lower()):
            seen.setdefault(w[:64], None)
            if len(seen) >= 256:
                return " ".join(seen)
    return " ".join(seen)


def upgrade() -> None:
    bind = op.get_bind()
    search = op.create_table(
        'audit_search',
        sa.Column('seq', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=False, nullable=False),
        sa.Column('terms', sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint('seq'),
    )
    if bind.dialect.name == 'postgresql':
        op.execute("CREATE INDEX ix_audit_search_terms ON audit_search "
                   "USING gin (to_tsvector('simple'::regconfig, terms))")
    else:
        # External content: the words live once, in audit_search; the trigger keeps the
        # index in step with every insert (records are never updated or deleted).
        op.execute("CREATE VIRTUAL TABLE audit_search_fts USING fts5(terms, content='audit_search', "
                   "content_rowid='seq', tokenize='unicode61 remove_diacritics 0')")
        op.execute("CREATE TRIGGER audit_search_fts_insert AFTER INSERT ON audit_search BEGIN "
                   "INSERT INTO audit_search_fts(rowid, terms) VALUES (new.seq, new.terms); END")
    usage = op.create_table(
        'audit_usage_hourly',
        sa.Column('key_id', sa.String(length=200), nullable=False),
        sa.Column('hour', sa.DateTime(timezone=True), nullable=False),
        sa.Column('actor', sa.String(length=200), nullable=False),
        sa.Column('action', sa.String(length=64), nullable=False),
        sa.Column('count', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('key_id', 'hour', 'actor', 'action'),
    )
    op.create_index('ix_audit_usage_hourly_actor', 'audit_usage_hourly', ['actor', 'hour'])
    op.create_table(
        'host_heartbeats_hourly',
        sa.Column('host_id', sa.Uuid(), nullable=False),
        sa.Column('hour', sa.DateTime(timezone=True), nullable=False),
        sa.Column('count', sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(['host_id'], ['hosts.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('host_id', 'hour'),
    )

    columns = ("seq", "time", "actor", "action", "object_type", "object_id", "outcome", "source_ip",
               "request_id")
    events = sa.table('audit_events', *(sa.column(c) for c in columns if c != "time"),
                      sa.column('time', sa.DateTime(timezone=True)), sa.column('details', sa.JSON))
    used: Counter[tuple[str, Any, str, str]] = Counter()
    after = 0
    while True:  # in batches of seq: the words are written as they are made, the counts at the end
        rows = bind.execute(sa.select(*(events.c[c] for c in columns), events.c.details)
                            .where(events.c.seq > after).order_by(events.c.seq).limit(BATCH)).mappings().all()
        if not rows:
            break
        op.bulk_insert(search, [{"seq": r["seq"], "terms": _terms(dict(r))} for r in rows])
        for r in rows:
            if r["outcome"] == "allowed" and r["object_type"] == "key" and r["object_id"]:
                hour = r["time"].replace(minute=0, second=0, microsecond=0)
                used[(r["object_id"], hour, r["actor"], r["action"])] += 1
        after = rows[-1]["seq"]
    if used:
        op.bulk_insert(usage, [{"key_id": k, "hour": h, "actor": a, "action": act, "count": n}
                               for (k, h, a, act), n in used.items()])


def downgrade() -> None:
    op.drop_table('host_heartbeats_hourly')
    op.drop_index('ix_audit_usage_hourly_actor', table_name='audit_usage_hourly')
    op.drop_table('audit_usage_hourly')
    if op.get_bind().dialect.name == 'sqlite':
        op.execute("DROP TRIGGER audit_search_fts_insert")
        op.execute("DROP TABLE audit_search_fts")
    else:
        op.execute("DROP INDEX ix_audit_search_terms")
    op.drop_table('audit_search')
