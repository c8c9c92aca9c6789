"""Engine and session factory; schema changes go through Alembic only."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as SATimeoutError
from sqlalchemy.orm import Session, sessionmaker

T = TypeVar("T")
# How long a transaction waits for SQLite's write lock before the request is answered
# 503 + Retry-After (a client's patience is seconds; a hold this long is a fault).
SQLITE_BUSY_SECONDS = 5.0
# PostgreSQL: the same bound on row and table locks and on a free pooled connection.
LOCK_TIMEOUT_MS = 5000
POOL_TIMEOUT_SECONDS = 5.0


class NestedTransaction(RuntimeError):
    """A thread began a database transaction while it already held one.

    On SQLite every transaction takes the write lock (BEGIN IMMEDIATE), so the second
    waits on the first forever; on PostgreSQL it holds two pooled connections, and a
    full pool then deadlocks the same way. Either way it is a programming error: finish
    (or roll back) the first transaction, then open the next (docs/decisions/0010)."""


def _guard_one_transaction_per_thread(engine: Engine) -> None:
    held = threading.local()

    def open_conns() -> set[int]:
        conns: set[int] | None = getattr(held, "conns", None)
        if conns is None:
            conns = held.conns = set()
        return conns

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conns = open_conns()
        if conns and id(conn.connection) not in conns:
            raise NestedTransaction(
                "a second database transaction was opened while this thread holds one; "
                "finish the first before opening another")
        conns.add(id(conn.connection))

    def _end(conn: Any, *_: Any) -> None:
        open_conns().discard(id(conn.connection))

    event.listen(engine, "commit", _end)
    event.listen(engine, "rollback", _end)
REPO_ROOT = Path(__file__).resolve().parents[2]
MIGRATIONS_DIR = REPO_ROOT / "migrations"


def make_engine(url: str, *, pool_size: int = 20) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_SECONDS})
        _guard_one_transaction_per_thread(engine)  # before BEGIN IMMEDIATE would wait on ourselves

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            # WAL lets readers run beside the writer; foreign keys are off by default.
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()
            # pysqlite's own BEGIN handling defers locks; take them explicitly instead.
            dbapi_conn.isolation_level = None

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size // 2,
        pool_pre_ping=True,
        pool_recycle=1800,
        pool_timeout=POOL_TIMEOUT_SECONDS,
        connect_args={"options": f"-c lock_timeout={LOCK_TIMEOUT_MS}"},
    )
    _guard_one_transaction_per_thread(engine)
    return engine


def make_autocommit_engine(engine: Engine, *, pool_size: int) -> Engine:
    """A second pool whose connections stay in autocommit and are not pinged on checkout:
    for single-statement writes on the hot path (a ping is a round trip; callers retry
    once on a dead connection instead, see `retry_on_disconnect`)."""
    if engine.dialect.name == "sqlite":
        return engine
    return create_engine(engine.url, isolation_level="AUTOCOMMIT", pool_size=pool_size,
                         max_overflow=pool_size // 2, pool_recycle=1800, pool_timeout=POOL_TIMEOUT_SECONDS,
                         connect_args={"options": f"-c lock_timeout={LOCK_TIMEOUT_MS}"})


def is_busy(exc: BaseException) -> bool:
    """The store answered, but a lock or a pooled connection was not free within its
    bound (SQLITE_BUSY_SECONDS, LOCK_TIMEOUT_MS, POOL_TIMEOUT_SECONDS): retry shortly."""
    if isinstance(exc, SATimeoutError):
        return True
    orig = getattr(exc, "orig", None)
    if isinstance(orig, sqlite3.OperationalError):
        return "locked" in str(orig) or "busy" in str(orig)
    return isinstance(orig, (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled))


def retry_on_disconnect(fn: Callable[[], T]) -> T:
    """Run `fn`; if it failed because a pooled connection was dead (the pool is then
    invalidated), run it once more on a fresh connection."""
    try:
        return fn()
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        return fn()


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def is_migrated(engine: Engine) -> bool:
    return inspect(engine).has_table("alembic_version")
