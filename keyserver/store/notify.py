"""Cross-process notifications: every process drops its cached credentials and key
states the moment any of them revokes or changes something.

Each notification names a topic — key material and states, or principals (users,
tokens, KMIP clients, hosts) — so that a burst of key changes does not also empty every
replica's credential caches (under a KMIP key-lifecycle load that cost a database read
per request).

PostgreSQL: LISTEN/NOTIFY between replicas, the topic as the payload. The embedded
SQLite store has no such channel, and other processes share it too (the CLI beside a
running server): there a change bumps the one-row `change_counter` in its own
transaction, and every process polls it five times a second and drops every cache (the
counter carries no topic). Either way a notification is delivered only if the change
commits, and a process that cannot hear them reports itself unhealthy, so callers stop
trusting their caches.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from enum import StrEnum

import psycopg
from sqlalchemy import update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from keyserver.store.models import ChangeCounter

log = logging.getLogger(__name__)
CHANNEL = "strongroom_invalidate"
LOCAL = "notify_local"  # Session.info: topics this process fires itself once the session commits
POLL_SECONDS = 0.2


class Topic(StrEnum):
    KEYS = "keys"  # a key version's state or wrapped material, a KMIP object's state
    PRINCIPALS = "principals"  # a user, API token, KMIP client or host: role, revocation
    XKS = "xks"  # an external key store: revocation, credential, client certificate rule, grants



class Notifier:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._callbacks: dict[Topic, list[Callable[[], None]]] = {t: [] for t in Topic}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._connected = threading.Event()
        self._postgres = engine.dialect.name == "postgresql"
        self._seen = -1  # the change counter as this process last acted on it (polling only)

    @property
    def healthy(self) -> bool:
        """True while this process hears the others' notifications."""
        return self._connected.is_set()

    def caught_up(self) -> bool:
        """Whether this process has acted on every change committed so far (polling: the
        change counter it last read is the current one). With PostgreSQL notifications
        arrive as they are committed; True."""
        if self._postgres:
            return True
        raw = self._engine.raw_connection()
        try:
            cur = raw.cursor()
            cur.execute("SELECT seq FROM change_counter WHERE id = 1")
            row = cur.fetchone()
            cur.close()
        finally:
            raw.close()
        return self._seen >= (int(row[0]) if row else 0)

    def subscribe(self, topic: Topic, callback: Callable[[], None]) -> None:
        """`callback` runs whenever something of `topic` may have changed (and whenever
        this process may have missed notifications)."""
        self._callbacks[topic].append(callback)

    def publish(self, session: Session, topic: Topic) -> None:
        """Notify inside the caller's transaction: delivered only if it commits."""
        # On the session's connection: a statement, not an ORM execution (no autoflush).
        conn = session.connection()
        if self._postgres:
            conn.exec_driver_sql(f"NOTIFY {CHANNEL}, '{Topic(topic).value}'")
        else:
            conn.execute(update(ChangeCounter).where(ChangeCounter.id == 1).values(seq=ChangeCounter.seq + 1))
        session.info.setdefault(LOCAL, set()).add(Topic(topic))

    def fire_local(self, topics: Iterable[Topic] | None = None) -> None:
        """Run the callbacks of `topics` (all of them when None)."""
        for topic in Topic if topics is None else topics:
            for cb in self._callbacks[topic]:
                cb()

    def _received(self, payload: str) -> None:
        try:
            topics: list[Topic] | None = [Topic(payload)]
        except ValueError:
            topics = None  # an older replica's bare NOTIFY, or a topic this one does not know
        self.fire_local(topics)

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            target = self._listen if self._postgres else self._poll
            self._thread = threading.Thread(target=target, name="notify-listener", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _listen(self) -> None:
        url = self._engine.url
        while not self._stop.is_set():
            try:
                with psycopg.connect(host=url.host, port=url.port or 5432, user=url.username,
                                     password=url.password, dbname=url.database, autocommit=True,
                                     connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._connected.set()
                    # Anything may have changed while we were not listening.
                    self.fire_local()
                    while not self._stop.is_set():
                        for n in conn.notifies(timeout=1.0, stop_after=100):
                            self._received(n.payload)
            except psycopg.Error as exc:
                log.warning("notification listener lost its connection (%s); retrying", type(exc).__name__)
            finally:
                self._connected.clear()
                self.fire_local()
            self._stop.wait(1.0)

    def _poll(self) -> None:
        seen: int | None = None
        while not self._stop.is_set():
            try:
                # The DBAPI connection directly: a plain autocommit read, not a transaction
                # (on SQLite every transaction here takes the write lock).
                raw = self._engine.raw_connection()
                try:
                    cur = raw.cursor()
                    cur.execute("SELECT seq FROM change_counter WHERE id = 1")
                    row = cur.fetchone()
                    cur.close()
                finally:
                    raw.close()
                seq = int(row[0]) if row else 0
                if seq != seen:
                    seen = seq
                    self.fire_local()
                self._seen = seq
                self._connected.set()
            except Exception as exc:
                log.warning("change counter not readable (%s); retrying", type(exc).__name__)
                self._connected.clear()
                self.fire_local()
            self._stop.wait(POLL_SECONDS)
        self._connected.clear()
