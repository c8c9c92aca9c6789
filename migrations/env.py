"""Alembic environment: the URL comes from the caller (keyserver.store.db.upgrade)
or STRONGROOM_DATABASE_URL; models are the target for autogenerate."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine

from keyserver.store.models import Base

config = context.config
url = config.get_main_option("sqlalchemy.url") or os.environ["STRONGROOM_DATABASE_URL"]


def run_migrations_offline() -> None:
    context.configure(url=url, target_metadata=Base.metadata, literal_binds=True,
                      render_as_batch=url.startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(url)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=Base.metadata,
                          render_as_batch=url.startswith("sqlite"))
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
