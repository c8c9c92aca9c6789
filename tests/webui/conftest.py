"""The console's end-to-end run gets an installation of its own.

It tells a new installation's first hour (the first administrator's one-time password, a
fleet of four hosts, the System page of a server nobody has rotated), so it runs on a store
only it has written to: a fresh one of the session's kind, behind servers of its own, even
in the middle of the full suite. On the session's shared server it met what ~1,500 other
tests left there (a KEK rotation the authorisation matrix started and nothing finished,
some hundred hosts and enrollment tokens), which is not the story it tells. The fixtures
have names of their own: the session's `base_url` and `services` are session-scoped and
cached, so overriding `services` here would not give `base_url` a new server."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from hsm import HsmBackend
from keyserver.api.app import create_app
from keyserver.services import Services
from tests.conftest import _make_actor, own_services, serving_agent_port, serving_https


@dataclass
class Installation:
    services: Services
    base_url: str
    agent_url: str
    ca_file: Path  # the internal CA's certificate, as `keyserver serve` leaves it in the data directory
    admin: httpx.Client  # an administrator's API token client


@pytest.fixture
def fresh_installation(tmp_path_factory: pytest.TempPathFactory, hsm_backend: HsmBackend) -> Iterator[Installation]:
    """A new key server on a new store of the session's kind (a scratch PostgreSQL database,
    or the embedded default in a new data directory) with the session's token, its REST and
    agent ports served from this process as the session's are."""
    data = tmp_path_factory.mktemp("console-data")
    with own_services(data, hsm_backend, session_idle_minutes=30) as svc:
        svc.notifier.start()  # as the session's server: it hears other replicas' revocations
        app = create_app(svc, run_background=False)
        ca_file = data / "ca.pem"
        ca_file.write_bytes(svc.ca.certificate_pem())
        with serving_https(app, svc) as base_url, serving_agent_port(svc, app) as agent_url:
            # Not https.trust(): that sets what the session's own tests trust.
            admin = _make_actor(svc, base_url, ssl.create_default_context(cafile=str(ca_file)), "admin")
            try:
                yield Installation(svc, base_url, agent_url, ca_file, admin.client)
            finally:
                admin.client.close()
                admin.session.close()
