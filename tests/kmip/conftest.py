"""A real KMIP listener over real TLS on loopback, and PyKMIP clients that verify the
server's certificate *and host name* (PyKMIP's own default does not)."""

from __future__ import annotations

import socket
import ssl
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kmip.pie.client import ProxyKmipClient

from keyserver.core.principal import system_context
from keyserver.kmip.listener import KmipListener
from keyserver.kmip.server import build_listener
from keyserver.services import Services


@dataclass
class ClientFiles:
    name: str
    client_id: str
    cert: Path
    key: Path
    ca: Path
    group: str = ""  # its KMIP tenancy group (docs/kmip.md "Tenancy")


def issue_client(services: Services, directory: Path, role: str, group: str | None = None) -> ClientFiles:
    """A client of `role` in `group` (by default a group of its own, as the server makes it):
    clients that must see each other's objects share a group, as an operator sets them up."""
    name = f"{role.replace('-', '')}-{uuid.uuid4().hex[:8]}"
    issued = services.kmip_clients.create(system_context("tests"), name=name, role=role, group=group)
    assert issued.private_key_pem is not None
    d = directory / name
    d.mkdir()
    (d / "cert.pem").write_text(issued.certificate_pem)
    (d / "key.pem").write_text(issued.private_key_pem)
    (d / "ca.pem").write_text(issued.ca_certificate_pem)
    return ClientFiles(name, str(issued.client.id), d / "cert.pem", d / "key.pem", d / "ca.pem", issued.client.group)


def verifying_context(files: ClientFiles) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(files.ca))
    ctx.check_hostname = True  # the point: PyKMIP's default context does not
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(files.cert), str(files.key))
    return ctx


def make_client(files: ClientFiles, port: int, host: str = "localhost") -> ProxyKmipClient:
    client = ProxyKmipClient(hostname=host, port=port, cert=str(files.cert), key=str(files.key),
                             ca=str(files.ca))
    proxy = client.proxy

    def create_socket(sock: socket.socket) -> None:
        proxy.socket = verifying_context(files).wrap_socket(sock, server_hostname=host)
        proxy.socket.settimeout(proxy.timeout)

    proxy._create_socket = create_socket
    return client


@pytest.fixture(scope="session")
def kmip_listener(services: Services) -> Iterator[KmipListener]:
    listener = build_listener(services, port=0)
    listener.start()
    yield listener
    listener.stop()


@pytest.fixture(scope="session")
def kmip_files(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., ClientFiles]:
    directory = tmp_path_factory.mktemp("kmip-clients")

    def make(role: str, group: str | None = None) -> ClientFiles:
        return issue_client(services, directory, role, group)

    return make


@pytest.fixture(scope="session")
def officer_files(kmip_files: Callable[..., ClientFiles]) -> ClientFiles:
    return kmip_files("key-officer")


@pytest.fixture
def kmip(officer_files: ClientFiles, kmip_listener: KmipListener) -> Iterator[Any]:
    """A connected key-officer client."""
    client = make_client(officer_files, kmip_listener.port)
    client.open()
    yield client
    client.close()
