"""Alembic environment: the URL comes from the caller (keyserver.store.db.upgrade)
or STRONGROOM_DATABASE_URL; models are the target for autogenerate."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine, text

from keyserver.store.models import Base, mapped_here

config = context.config
url = config.get_main_option("sqlalchemy.url") or os.environ["STRONGROOM_DATABASE_URL"]


def run_migrations_offline() -> None:
    context.configure(url=url, target_metadata=Base.metadata, literal_binds=True, include_object=mapped_here,
                      render_as_batch=url.startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()


# Replicas of a new release start together on one PostgreSQL database, and each one
# migrates on start: the first to take this lock migrates, the others wait for its
# commit, then read the new revision and have nothing left to do. (The embedded store is
# one server's file.)
MIGRATION_LOCK = 0x5354524F4E47  # "STRONG"


def run_migrations_online() -> None:
    engine = create_engine(url)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=Base.metadata, include_object=mapped_here,
                          render_as_batch=url.startswith("sqlite"))
        with context.begin_transaction():
            if connection.dialect.name == "postgresql":
                # Held until the migration's transaction ends, taken before Alembic
                # reads the current revision.
                connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
