"""What the console's charts read: records per hour or day by outcome, who and what was
refused most, and the use of keys — from hourly counts the chainer keeps in the
transaction that chains the records (docs/audit.md "Activity counts"), so a chart costs
the same at a thousand records or at millions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from keyserver.core.errors import InvalidInput
from keyserver.store.models import AuditHourly, AuditRefusalsHourly, AuditUsageHourly

# An activity query returns at most this many buckets (two weeks of hours, a year of days).
MAX_ACTIVITY_BUCKETS = 400


def rollup_reason(outcome: str, details: Any) -> str:
    """Why a record was refused or failed, in a few words shared by many records (what
    the activity charts group denials by): the refusal's code, the missing permission,
    or "refused"; empty for what was allowed. Migration 0018 applied this rule to the
    records chained before it."""
    if outcome == "allowed" or not isinstance(details, dict):
        return ""
    if details.get("reason"):
        return str(details["reason"])[:64]
    if details.get("missing_permission"):
        return f"missing {details['missing_permission']}"[:64]
    return "refused" if details.get("refused") else ""


def buckets_of(since: datetime, until: datetime, bucket: Literal["hour", "day"]) -> tuple[datetime, timedelta]:
    """The first bucket's start and the buckets' length, for charts over [since, until)."""
    if since.tzinfo is None or until.tzinfo is None:
        raise InvalidInput("since and until need a time zone (e.g. 2026-11-25T10:00:00Z)")
    start = since.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    if bucket == "day":
        start = start.replace(hour=0)
    if not start < until:
        raise InvalidInput("until must be after since")
    step = timedelta(hours=1) if bucket == "hour" else timedelta(days=1)
    if (until - start) / step > MAX_ACTIVITY_BUCKETS:
        raise InvalidInput(f"at most {MAX_ACTIVITY_BUCKETS} buckets: ask for days over long ranges")
    return start, step


class ActivityCounts:
    def __init__(self, session_factory: sessionmaker[Session]) -> None:
        self._db = session_factory

    def activity(self, *, since: datetime, until: datetime, bucket: Literal["hour", "day"],
                 top: int = 5) -> dict[str, Any]:
        """Chained records per hour or day and outcome between `since` and `until` (every
        bucket listed, empty ones as zeros), and the actors, actions and reasons with the
        most refusals — from the hourly counts, so it costs the same at a thousand records
        or at millions."""
        start, step = buckets_of(since, until, bucket)
        r = AuditRefusalsHourly
        total = func.sum(r.count)

        def ranked(s: Session, column: Any) -> list[dict[str, Any]]:
            rows = s.execute(select(column, total).where(r.hour >= start, r.hour < until).group_by(column)
                             .order_by(total.desc(), column).limit(top)).all()
            return [{"name": name, "count": int(n)} for name, n in rows]

        with self._db() as s:
            per_hour = s.execute(select(AuditHourly.hour, AuditHourly.outcome, AuditHourly.count)
                                 .where(AuditHourly.hour >= start, AuditHourly.hour < until)).all()
            result: dict[str, Any] = {"top_refused_actors": ranked(s, r.actor),
                                      "top_refused_actions": ranked(s, r.action),
                                      "top_refusal_reasons": ranked(s, r.reason)}
        buckets: dict[datetime, dict[str, int]] = {}
        at = start
        while at < until:
            buckets[at] = {"allowed": 0, "denied": 0, "error": 0}
            at += step
        for hour, outcome, n in per_hour:
            hour = hour.astimezone(UTC)
            key = hour if bucket == "hour" else hour.replace(hour=0)
            if key in buckets:
                kind = outcome if outcome in ("allowed", "denied") else "error"
                buckets[key][kind] += int(n)
        result["buckets"] = [{"start": t, **c} for t, c in buckets.items()]
        result["totals"] = {k: sum(c[k] for c in buckets.values()) for k in ("allowed", "denied", "error")}
        return result

    def usage(self, *, since: datetime, until: datetime, bucket: Literal["hour", "day"],
              key_id: str | None = None, actor: str | None = None, top: int = 5) -> dict[str, Any]:
        """Allowed operations on keys per hour or day and action, for one key (with the
        actors that used it most) or one actor — a host is `host:<hostname>`, a KMIP
        client `kmip:<name>` — (with the keys it used most), from the hourly counts."""
        if (key_id is None) == (actor is None):
            raise InvalidInput("ask for the usage of one key or of one actor")
        start, step = buckets_of(since, until, bucket)
        u = AuditUsageHourly
        scope = (u.key_id == key_id) if key_id is not None else (u.actor == actor)
        in_range = (u.hour >= start, u.hour < until)
        total = func.sum(u.count)
        other = u.actor if key_id is not None else u.key_id
        with self._db() as s:
            per_hour = s.execute(select(u.hour, u.action, total).where(scope, *in_range)
                                 .group_by(u.hour, u.action)).all()
            ranked = s.execute(select(other, total).where(scope, *in_range).group_by(other)
                               .order_by(total.desc(), other).limit(top)).all()
        buckets: dict[datetime, dict[str, int]] = {}
        at = start
        while at < until:
            buckets[at] = {}
            at += step
        actions: dict[str, int] = {}
        for hour, action, n in per_hour:
            hour = hour.astimezone(UTC)
            b = buckets.get(hour if bucket == "hour" else hour.replace(hour=0))
            if b is not None:
                b[action] = b.get(action, 0) + int(n)
                actions[action] = actions.get(action, 0) + int(n)
        return {"buckets": [{"start": t, "counts": c} for t, c in buckets.items()],
                "actions": [{"name": a, "count": n} for a, n in sorted(actions.items(), key=lambda x: (-x[1], x[0]))],
                "total": sum(actions.values()),
                "top": [{"name": name, "count": int(n)} for name, n in ranked]}
