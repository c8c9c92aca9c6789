"""ASGI entry for multi-worker serving: each worker process builds its own services
(its own HSM sessions and database pool) from the environment."""

from __future__ import annotations

from fastapi import FastAPI

from keyserver.api.app import create_app
from keyserver.logs import configure
from keyserver.services import build_services
from keyserver.settings import Settings


def app_factory(*, housekeeping: bool = True) -> FastAPI:
    """`housekeeping=False`: a worker whose supervisor chains the audit, delivers to the
    sinks and runs the scheduler."""
    settings = Settings()
    configure(settings.log_level)
    return create_app(build_services(settings, migrate=False), housekeeping=housekeeping)
