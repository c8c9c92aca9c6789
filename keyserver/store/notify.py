"""Cross-replica notifications over PostgreSQL LISTEN/NOTIFY.

Used to drop cached credentials in every replica the moment one of them revokes
something. On SQLite (the single-process embedded default) a notification only runs
the local callbacks, which is all there is.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

log = logging.getLogger(__name__)
CHANNEL = "strongroom_invalidate"


class Notifier:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._callbacks: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._connected = threading.Event()
        self.distributed = engine.dialect.name == "postgresql"

    @property
    def healthy(self) -> bool:
        """True when every replica will hear our notifications (or there is only us)."""
        return not self.distributed or self._connected.is_set()

    def subscribe(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    def publish(self, session: Session) -> None:
        """Notify inside the caller's transaction: delivered only if it commits."""
        if self.distributed:
            session.execute(text(f"NOTIFY {CHANNEL}"))
        session.info.setdefault("notify_local", True)

    def fire_local(self) -> None:
        for cb in self._callbacks:
            cb()

    def start(self) -> None:
        if self.distributed and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._listen, name="notify-listener", daemon=True)
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
                        for _ in conn.notifies(timeout=1.0, stop_after=100):
                            self.fire_local()
            except psycopg.Error as exc:
                log.warning("notification listener lost its connection (%s); retrying", type(exc).__name__)
            finally:
                self._connected.clear()
                self.fire_local()
            self._stop.wait(1.0)
