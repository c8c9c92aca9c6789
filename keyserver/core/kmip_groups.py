"""A KMIP client's tenancy group (core/kmip_tenancy.py), as a value and in SQL.

A module of its own, below the services, so that every service that needs a client's
group can import it: kmip_clients reaches approvals (through ca and kek), and approvals
rebuilds a KMIP client's principal when a held request runs, so neither can import the
other (tests/test_architecture.py).
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, func

from keyserver.core.views import KmipClientView
from keyserver.store.models import KmipClient


def client_group(client: KmipClientView) -> str:
    """Its KMIP tenancy group: NULL is its own name (a client issued by the previous release
    during a rolling upgrade, migration 0026)."""
    return client.group or client.name


def group_column() -> ColumnElement[str]:
    """`client_group` in SQL."""
    return func.coalesce(KmipClient.group, KmipClient.name)
