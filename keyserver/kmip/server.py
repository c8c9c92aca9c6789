"""Builds a KMIP listener from the keyserver's services and settings."""

from __future__ import annotations

from keyserver.kmip.context import Engine
from keyserver.kmip.dispatcher import Dispatcher
from keyserver.kmip.listener import KmipListener, ListenerLimits
from keyserver.services import Services


def build_listener(services: Services, *, port: int | None = None, reuse_port: bool = False) -> KmipListener:
    s = services.settings
    return KmipListener(
        ca=services.ca, clients=services.kmip_clients,
        dispatcher=Dispatcher(Engine(keys=services.keys, objects=services.kmip_objects, crypto=services.crypto)),
        host=s.kmip_host, port=s.kmip_port if port is None else port, server_names=s.kmip_server_names,
        limits=ListenerLimits(max_connections=s.kmip_max_connections, max_message_bytes=s.kmip_max_message_bytes,
                              idle_timeout=s.kmip_idle_timeout_seconds,
                              max_connections_per_source=s.kmip_max_connections_per_source,
                              handshake_timeout=s.tls_handshake_timeout_seconds,
                              trusted_proxies=tuple(s.trusted_proxies)),
        reuse_port=reuse_port,
    )
