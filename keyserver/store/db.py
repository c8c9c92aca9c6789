"""Engine and session factory; schema changes go through Alembic only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parents[2]
MIGRATIONS_DIR = REPO_ROOT / "migrations"


def make_engine(url: str, *, pool_size: int = 20) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

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
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size // 2,
        pool_pre_ping=True,
        pool_recycle=1800,
    )


def make_autocommit_engine(engine: Engine, *, pool_size: int) -> Engine:
    """A second pool whose connections stay in autocommit and are not pinged on checkout:
    for single-statement writes on the hot path (a ping is a round trip; callers retry
    once on a dead connection instead, see `retry_on_disconnect`)."""
    if engine.dialect.name == "sqlite":
        return engine
    return create_engine(engine.url, isolation_level="AUTOCOMMIT", pool_size=pool_size,
                         max_overflow=pool_size // 2, pool_recycle=1800)


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
