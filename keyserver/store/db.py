"""Engine and session factory; schema changes go through Alembic only."""

from __future__ import annotations

import collections
import os
import select
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, create_engine, event, inspect, make_url
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, DisconnectionError, OperationalError
from sqlalchemy.exc import TimeoutError as SATimeoutError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry, QueuePool

T = TypeVar("T")
# How long a transaction waits for SQLite's write lock before the request is answered
# 503 + Retry-After (a client's patience is seconds; a hold this long is a fault).
SQLITE_BUSY_SECONDS = 5.0
# PostgreSQL: the same bound on row and table locks and on a free pooled connection.
LOCK_TIMEOUT_MS = 5000
POOL_TIMEOUT_SECONDS = 5.0
# A pooled PostgreSQL connection idle longer than this is pinged before it is handed out.
IDLE_PING_SECONDS = 2.0


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

    # Keyed by the SQLAlchemy Connection, not its DBAPI connection: after the server
    # dropped a connection, reading `conn.connection` in the rollback event raises, and a
    # database outage (503) became a 500 with this thread's slot never released.
    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conns = open_conns()
        if conns and id(conn) not in conns:
            raise NestedTransaction(
                "a second database transaction was opened while this thread holds one; "
                "finish the first before opening another")
        conns.add(id(conn))

    def _end(conn: Any, *_: Any) -> None:
        open_conns().discard(id(conn))

    event.listen(engine, "commit", _end)
    event.listen(engine, "rollback", _end)


class _WriterQueue:
    """First come, first served: the threads of this process that want SQLite's write lock.

    SQLite lets one transaction hold it and makes the others poll, sleeping longer and
    longer between tries (its busy handler): with 50 concurrent requests the unluckiest
    waited 1.4-1.8 s (p99; decision 0010). Here they queue instead, and the next one is
    handed the turn the moment the writer ends. SQLite's own lock and busy timeout still
    arbitrate between processes (the CLI beside the server)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._busy = False
        self._waiting: collections.deque[threading.Event] = collections.deque()
        self._owner = threading.local()

    def acquire(self, timeout: float) -> bool:
        with self._mutex:
            if not self._busy:
                self._busy = self._owner.held = True
                return True
            turn = threading.Event()
            self._waiting.append(turn)
        if not turn.wait(timeout):
            with self._mutex:
                if turn in self._waiting:  # still queued: give up our place
                    self._waiting.remove(turn)
                    return False
            # handed the turn just as we gave up: it is ours
        self._owner.held = True
        return True

    def release(self) -> None:
        if not getattr(self._owner, "held", False):
            return
        self._owner.held = False
        with self._mutex:
            if self._waiting:
                self._waiting.popleft().set()  # the turn passes on; still busy
            else:
                self._busy = False


def _ping_when_idle(engine: Engine) -> None:
    """Ping a pooled connection on checkout only when it has been idle a while.

    `pool_pre_ping` pings on every checkout: a round trip per transaction, 15 % of a KMIP
    mutation's time. An idle PostgreSQL connection has nothing to read; one the server
    closed or terminated (restart, pg_terminate_backend, a reset) has its error message
    or EOF waiting on the socket, which a zero-timeout poll sees without a round trip.
    One idle for seconds is pinged anyway: a network path can die silently."""

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        last = record.info.get("checked_in_at")
        if last is not None and time.monotonic() - last < IDLE_PING_SECONDS and not _readable(dbapi_conn):
            return
        try:
            cur = dbapi_conn.cursor()
            try:
                cur.execute("SELECT 1")
            finally:
                cur.close()
        except Exception as exc:
            # The pool drops this connection and checks out another (up to three times).
            raise DisconnectionError(f"pooled connection was dead: {exc}") from exc

    @event.listens_for(engine, "checkin")
    def _checkin(_dbapi_conn: Any, record: Any) -> None:
        record.info["checked_in_at"] = time.monotonic()


def _readable(dbapi_conn: Any) -> bool:
    """Something (an error, EOF) waits on an idle connection's socket: it may be dead."""
    try:
        fd = dbapi_conn.fileno()
    except Exception:
        return True
    try:
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):
        return True


REPO_ROOT = Path(__file__).resolve().parents[2]
MIGRATIONS_DIR = REPO_ROOT / "migrations"


def private_sqlite_files(url: str) -> None:
    """The embedded database and its -wal/-shm readable by the server's user only,
    whatever the umask. SQLite creates a new database 0644 (less the umask) and gives
    its -wal and -shm the database file's mode, so the database is made 0600 before
    SQLite first opens it; files an older version left 0644 are narrowed too."""
    if not url.startswith("sqlite"):
        return
    name = make_url(url).database
    if not name or name == ":memory:" or name.startswith("file:"):
        return
    path = Path(name)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except (FileExistsError, FileNotFoundError):  # there already, or no directory: SQLite says so
        pass
    else:
        os.fchmod(fd, 0o600)  # open's mode is masked by the umask
        os.close(fd)
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            if p.stat().st_mode & 0o077:
                p.chmod(0o600)
        except FileNotFoundError:
            pass


class WouldBlock(RuntimeError):
    """A database connection was asked for inside `no_blocking()`."""


_NO_BLOCKING: ContextVar[bool] = ContextVar("db_no_blocking", default=False)


@contextmanager
def no_blocking() -> Iterator[None]:
    """For work tried on an event loop: asking for a database connection in this block
    raises WouldBlock before any is taken, and the caller redoes the work in a thread.
    The work must leave no effect it would repeat before its first database access
    (the XKS proxy, api/hotpath.py)."""
    token = _NO_BLOCKING.set(True)
    try:
        yield
    finally:
        _NO_BLOCKING.reset(token)


class _GuardedPool(QueuePool):
    # Refused before a connection is taken: a checkout listener that raised would
    # invalidate (close) the pooled connection instead.
    def _do_get(self) -> ConnectionPoolEntry:
        if _NO_BLOCKING.get():
            raise WouldBlock("a database connection was asked for on the event loop")
        return super()._do_get()


def make_engine(url: str, *, pool_size: int = 20) -> Engine:
    if url.startswith("sqlite"):
        private_sqlite_files(url)
        engine = create_engine(url, poolclass=_GuardedPool,
                               connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_SECONDS})
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

        writers = _WriterQueue()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Any) -> None:
            if not writers.acquire(SQLITE_BUSY_SECONDS):
                raise OperationalError("BEGIN IMMEDIATE", None, sqlite3.OperationalError(
                    "database is locked (this process's other transactions held it)"))
            try:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            except BaseException:
                writers.release()
                raise

        def _sqlite_end(_conn: Any, *_: Any) -> None:
            writers.release()

        event.listen(engine, "commit", _sqlite_end)
        event.listen(engine, "rollback", _sqlite_end)
        # A connection that goes back to the pool (or is dropped) without either: never
        # leave the turn held by nobody.
        event.listen(engine, "checkin", _sqlite_end)
        return engine
    engine = create_engine(
        url,
        poolclass=_GuardedPool,
        pool_size=pool_size,
        max_overflow=pool_size // 2,
        pool_recycle=1800,
        pool_timeout=POOL_TIMEOUT_SECONDS,
        connect_args={"options": f"-c lock_timeout={LOCK_TIMEOUT_MS}"},
    )
    _guard_one_transaction_per_thread(engine)
    _ping_when_idle(engine)
    return engine


def make_autocommit_engine(engine: Engine, *, pool_size: int) -> Engine:
    """A second pool whose connections stay in autocommit: for single-statement reads and
    writes on the hot path (no BEGIN/COMMIT round trips; callers retry once on a dead
    connection, see `retry_on_disconnect`)."""
    if engine.dialect.name == "sqlite":
        return engine
    auto = create_engine(engine.url, isolation_level="AUTOCOMMIT", poolclass=_GuardedPool, pool_size=pool_size,
                         max_overflow=pool_size // 2, pool_recycle=1800, pool_timeout=POOL_TIMEOUT_SECONDS,
                         connect_args={"options": f"-c lock_timeout={LOCK_TIMEOUT_MS}"})
    _ping_when_idle(auto)
    return auto


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


def upsert_counts(conn: Connection | Session, table: Any, keys: list[str], counts: dict[tuple[Any, ...], int]) -> None:
    """Add `counts` (key columns' values → n) to a table of counters, one statement."""
    if not counts:
        return
    dialect = conn.dialect if isinstance(conn, Connection) else conn.get_bind().dialect
    stmt = (pg_insert if dialect.name == "postgresql" else sqlite_insert)(table)
    conn.execute(stmt.on_conflict_do_update(index_elements=[getattr(table, k) for k in keys],
                                            set_={"count": table.count + stmt.excluded["count"]}),
                 [{**dict(zip(keys, k, strict=True)), "count": n} for k, n in counts.items()])


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    private_sqlite_files(url)
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def is_migrated(engine: Engine) -> bool:
    return inspect(engine).has_table("alembic_version")
