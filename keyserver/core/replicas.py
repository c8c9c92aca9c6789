"""The key server's replicas, as each one reports itself: an operator sees which are
alive and which version each runs (during a rolling upgrade, the stragglers).

Every replica's housekeeping (the scheduler's loop) writes its own row each interval;
a row not written for three intervals is a replica that stopped or was killed, shown as
gone for a day, then forgotten. Nothing depends on these rows but the picture."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from keyserver import product_version
from keyserver.core.audit import utcnow
from keyserver.core.permissions import Permission
from keyserver.core.policy import Policy
from keyserver.core.principal import RequestContext
from keyserver.store.models import Replica

FORGET_AFTER = timedelta(days=1)


class ReplicaRegistry:
    def __init__(self, session_factory: sessionmaker[Session], policy: Policy, *, interval_seconds: float,
                 store: str, now: Callable[[], datetime] = utcnow) -> None:
        self._db = session_factory
        self._policy = policy
        self._now = now
        self._store = store
        self.live_within = timedelta(seconds=3 * interval_seconds)
        self.started_at = now()
        self.id = f"{socket.gethostname()[:200]}:{os.getpid()}:{int(self.started_at.timestamp())}"

    def beat(self, *, scheduler_error: str | None = None) -> None:
        """This replica is alive, and its scheduler has just run (`scheduler_error`: what
        failed): its row, written (or made) now; the long gone forgotten."""
        now = self._now()
        error = scheduler_error[:500] if scheduler_error else None
        with self._db.begin() as s:
            row = s.get(Replica, self.id)
            if row is None:
                s.add(Replica(id=self.id, hostname=socket.gethostname()[:253], pid=os.getpid(),
                              version=product_version()[:64], store=self._store, started_at=self.started_at,
                              last_seen_at=now, scheduler_error=error))
            else:
                row.last_seen_at, row.scheduler_error = now, error
            s.execute(delete(Replica).where(Replica.last_seen_at < now - FORGET_AFTER))

    def list(self, ctx: RequestContext) -> list[tuple[Replica, bool]]:
        """Every replica heard from in the last day, newest first, each with whether it is
        alive (heard from within three intervals)."""
        self._policy.require(ctx, Permission.SYSTEM_READ, action="system.health")
        now = self._now()
        with self._db() as s:
            rows = list(s.execute(select(Replica).where(Replica.last_seen_at >= now - FORGET_AFTER)
                                  .order_by(Replica.started_at.desc())).scalars())
        return [(r, now - r.last_seen_at <= self.live_within) for r in rows]
