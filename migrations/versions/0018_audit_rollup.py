"""audit records counted per hour and outcome, and refusals per hour, actor, action and
reason (the console's charts and alerts), filled from the records chained so far

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None

BATCH = 20_000


def _reason(outcome: str, details: Any) -> str:
    # The rule of keyserver.core.audit.rollup_reason as it was when this ran.
    if outcome == "allowed" or not isinstance(details, dict):
        return ""
    if details.get("reason"):
        return str(details["reason"])[:64]
    if details.get("missing_permission"):
        return f"missing {details['missing_permission']}"[:64]
    return "refused" if details.get("refused") else ""


def upgrade() -> None:
    hourly = op.create_table(
        'audit_hourly',
        sa.Column('hour', sa.DateTime(timezone=True), nullable=False),
        sa.Column('outcome', sa.String(length=16), nullable=False),
        sa.Column('count', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('hour', 'outcome'),
    )
    refusals = op.create_table(
        'audit_refusals_hourly',
        sa.Column('hour', sa.DateTime(timezone=True), nullable=False),
        sa.Column('actor', sa.String(length=200), nullable=False),
        sa.Column('action', sa.String(length=64), nullable=False),
        sa.Column('reason', sa.String(length=64), nullable=False),
        sa.Column('count', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('hour', 'actor', 'action', 'reason'),
    )
    events = sa.table('audit_events', sa.column('seq', sa.BigInteger), sa.column('time', sa.DateTime(timezone=True)),
                      sa.column('action', sa.String), sa.column('outcome', sa.String), sa.column('actor', sa.String),
                      sa.column('details', sa.JSON))
    bind = op.get_bind()
    per_hour: Counter[tuple[Any, str]] = Counter()
    refused: Counter[tuple[Any, str, str, str]] = Counter()
    after = 0
    while True:  # in batches of seq: a chain of millions fits in memory as counts, not rows
        rows = bind.execute(sa.select(events.c.seq, events.c.time, events.c.action, events.c.outcome,
                                      events.c.actor, events.c.details)
                            .where(events.c.seq > after).order_by(events.c.seq).limit(BATCH)).all()
        if not rows:
            break
        for _, t, action, outcome, actor, details in rows:
            hour = t.replace(minute=0, second=0, microsecond=0)
            per_hour[(hour, outcome)] += 1
            if outcome != "allowed":
                refused[(hour, actor, action, _reason(outcome, details))] += 1
        after = rows[-1][0]
    if per_hour:
        op.bulk_insert(hourly, [{"hour": h, "outcome": o, "count": n} for (h, o), n in per_hour.items()])
    if refused:
        op.bulk_insert(refusals, [{"hour": h, "actor": a, "action": act, "reason": r, "count": n}
                                  for (h, a, act, r), n in refused.items()])


def downgrade() -> None:
    op.drop_table('audit_refusals_hourly')
    op.drop_table('audit_hourly')
