"""The XKS port (optional, `xks_port`; decision 0023): AWS KMS's external key store
proxy API, and nothing else, over TLS that asks for a client certificate.

* Mutual TLS is on a port of its own because the REST port must never ask browsers for
  a certificate; the REST port keeps serving the same API with SigV4 alone.
* The certificate is asked for, not demanded: a key store that names no required
  subject keeps working here on SigV4 alone. One that is presented must chain to
  `xks_client_ca_file` (the TLS handshake fails otherwise); which subject a key store
  requires is checked per call by core/xks.py.
* The verified certificate reaches the application through the agent port's
  mechanism (TlsScopeProtocol), marked `listener: xks`.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import uvicorn

from keyserver.runtime.agentport import ASGIApp, SidecarServer, TlsScopeProtocol, port_only, sidecar_server
from keyserver.runtime.sockets import bind_socket
from keyserver.runtime.tls import xks_tls_context
from keyserver.services import Services

log = logging.getLogger("keyserver")
XKS_PORT_PATHS = ("/xks/",)
XKS_PORT_EXACT = frozenset({"/healthz", "/readyz"})


class XksTlsScopeProtocol(TlsScopeProtocol):
    listener = "xks"


def xks_sidecar(services: Services, app: ASGIApp, uvicorn_kwargs: dict[str, Any]
                ) -> tuple[SidecarServer, socket.socket] | None:
    """The XKS port's server and its bound socket (None when not configured). Raises
    OSError when the port cannot be bound or the CA bundle not read."""
    s = services.settings
    if s.xks_port is None:
        return None
    context = xks_tls_context(s, services.ca)  # before binding: a bad bundle leaves no socket behind
    sock = bind_socket(s.xks_host, s.xks_port)
    return sidecar_server(port_only(app, XKS_PORT_PATHS, XKS_PORT_EXACT, "xks"), context, XksTlsScopeProtocol,
                          uvicorn_kwargs), sock


def start_xks_sidecar(services: Services, app: ASGIApp, uvicorn_kwargs: dict[str, Any]
                      ) -> list[tuple[uvicorn.Server, socket.socket]]:
    """`xks_sidecar` for `keyserver serve` and each worker: like KMIP and the agent port
    an extra door, so a busy port or an unreadable bundle is logged (what to change) and
    the REST port, which serves the same API on SigV4 alone, still starts."""
    try:
        sidecar = xks_sidecar(services, app, uvicorn_kwargs)
    except OSError as exc:
        s = services.settings
        log.error("XKS port not started: cannot listen on %s:%s with client CAs from %s (%s); fix "
                  "STRONGROOM_XKS_PORT or STRONGROOM_XKS_CLIENT_CA_FILE, or unset both", s.xks_host, s.xks_port,
                  s.xks_client_ca_file, exc)
        return []
    if sidecar is not None:
        log.info("XKS port (mutual TLS) on %s:%s", services.settings.xks_host, sidecar[1].getsockname()[1])
    return [sidecar] if sidecar is not None else []
