"""The agent port: the same application, served over TLS with certificates from the
internal CA, where enrolled hosts authenticate with their client certificates.

* A host pins the internal CA and nothing else (`curl --cacert ca.pem ...`), so the
  port's certificate is issued by that CA, for a fresh key at every start.
* A client certificate is optional at the TLS layer: the installer, the agent package
  and enrollment come before a host has one. Agent routes require it.
* uvicorn does not hand the peer certificate to the application, so the connection
  protocol here puts it into each request's scope as the ASGI TLS extension specifies
  (`scope["extensions"]["tls"]["client_cert_chain"]`, PEM strings), with the listener
  that verified it (`"listener"`: `agent`, or `xks` for runtime/xksport.py, whose
  certificates chain to another CA) so a route trusts only its own listener's.
* It runs on the main server's event loop as a sidecar: the main server owns signals
  and the application's lifespan.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import ssl
from collections.abc import Generator
from typing import Any
from urllib.parse import urlsplit

import uvicorn
from starlette.types import Receive, Scope, Send

from keyserver.core.ca import CertificateAuthority
from keyserver.runtime.limits import HttpLimits, bound_handshakes, limit_server
from keyserver.runtime.sockets import bind_socket
from keyserver.runtime.tls import server_context
from keyserver.services import Services

try:  # the protocol uvicorn's "auto" would pick
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _BaseProtocol
except ImportError:  # pragma: no cover - httptools is part of uvicorn[standard]
    from uvicorn.protocols.http.h11_impl import H11Protocol as _BaseProtocol  # type: ignore[assignment]

ASGIApp = Any


class TlsScopeProtocol(_BaseProtocol):
    """HTTP over TLS that tells the application which client certificate the
    connection presented (verified against the listener's CA by the TLS layer)."""

    listener = "agent"

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        tls = {"server_cert": None, "client_cert_chain": [ssl.DER_cert_to_PEM_cert(der)] if der else [],
               "client_cert_name": None, "client_cert_error": None, "tls_version": None, "cipher_suite": None,
               "listener": self.listener}
        app = self.app

        async def with_tls(scope: dict[str, Any], receive: Any, send: Any) -> None:
            scope.setdefault("extensions", {})["tls"] = tls
            await app(scope, receive, send)

        self.app = with_tls


class SidecarServer(uvicorn.Server):
    """A server that leaves signal handling to the main server of its loop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def agent_tls_context(ca: CertificateAuthority, names: list[str]) -> ssl.SSLContext:
    return server_context(ca, names, client_cert=ssl.CERT_OPTIONAL, common_name="Strongroom agent port")


# What the agent port serves: a host's routes (its certificate), enrollment, and what a
# host needs before it is enrolled. The console and the administrative API are on the
# main port only, so exposing the agent port to the hosts' network exposes nothing else.
AGENT_PORT_PATHS = ("/api/v1/agent/", "/downloads/")
AGENT_PORT_EXACT = frozenset({"/api/v1/enroll", "/ca.pem", "/install.sh", "/healthz", "/readyz"})


def agent_port_only(app: ASGIApp) -> ASGIApp:
    """`app` restricted to the agent port's routes; anything else is a 404 problem."""
    return port_only(app, AGENT_PORT_PATHS, AGENT_PORT_EXACT, "agent")


def port_only(app: ASGIApp, prefixes: tuple[str, ...], exact: frozenset[str], port: str) -> ASGIApp:
    """`app` restricted to the paths a sidecar port serves; anything else is a 404
    problem `not_on_<port>_port`."""
    from keyserver.api import problems

    async def restricted(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if scope["type"] != "http" or path in exact or path.startswith(prefixes):
            await app(scope, receive, send)
            return
        await problems.problem(404, f"not_on_{port}_port", f"{path} is not served on the {port} port; the "
                               "console and the administrative API are on the key server's main port"
                               )(scope, receive, send)

    return restricted


def sidecar_server(app: ASGIApp, context: ssl.SSLContext, protocol: type[TlsScopeProtocol],
                   uvicorn_kwargs: dict[str, Any]) -> SidecarServer:
    """A sidecar serving `app` over `context`, client certificates passed to the app."""
    kwargs = {k: v for k, v in uvicorn_kwargs.items() if not k.startswith("ssl_")}
    return SidecarServer(uvicorn.Config(app, http=protocol, lifespan="off",
                                        ssl_context_factory=lambda _config, _default: context, **kwargs))


def install_command(url: str) -> str:
    """The one-liner a host runs, `TOKEN` standing for the enrollment token. No sudo: a
    root-only host has none, and the installer asks for it itself when a step needs root."""
    return f"curl -fsS --cacert ca.pem {url}/install.sh | sh -s -- --token TOKEN"


def loopback_warning(url: str) -> str | None:
    """What to change when hosts would be sent to this machine's own loopback address
    (the default: the agent port listens on 127.0.0.1), else None."""
    host = (urlsplit(url).hostname or "").lower()
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost" or host.endswith(".localhost")
    if not loopback:
        return None
    return (f"{url} is this machine's loopback address: another host running the installer would reach "
            "itself, not this server. Set STRONGROOM_AGENT_HOST=0.0.0.0 (listen on every interface) and "
            "STRONGROOM_AGENT_PUBLIC_URL=https://NAME:PORT (the address hosts reach this server at), then "
            "restart the key server")


def agent_sidecar(services: Services, app: ASGIApp, uvicorn_kwargs: dict[str, Any]
                  ) -> tuple[SidecarServer, socket.socket] | None:
    """The agent port's server and its bound socket (None when disabled); sets
    `services.agent_url`. Raises OSError when the port cannot be bound."""
    s = services.settings
    if not s.agent_enabled:
        return None
    sock = bind_socket(s.agent_host, s.agent_port)
    port = sock.getsockname()[1]
    wildcard = s.agent_host in ("0.0.0.0", "::", "")  # noqa: S104 - compared, not bound
    url_host = socket.getfqdn() if wildcard else s.agent_host
    url_host = f"[{url_host}]" if ":" in url_host else url_host
    services.agent_url = (s.agent_public_url or f"https://{url_host}:{port}").rstrip("/")
    names = [url_host.strip("[]"), *([] if wildcard else [s.agent_host]), *s.agent_server_names]
    context = agent_tls_context(services.ca, names)
    return sidecar_server(agent_port_only(app), context, TlsScopeProtocol, uvicorn_kwargs), sock


def run_servers(main: uvicorn.Server, sidecars: list[tuple[uvicorn.Server, socket.socket]],
                main_sockets: list[socket.socket] | None = None) -> None:
    with asyncio.Runner(loop_factory=main.config.get_loop_factory()) as runner:
        runner.run(serve_with_sidecars(main, sidecars, main_sockets))


async def serve_with_sidecars(main: uvicorn.Server, sidecars: list[tuple[uvicorn.Server, socket.socket]],
                              main_sockets: list[socket.socket] | None = None) -> None:
    """Run `main` and the sidecars on one loop, each port under the connection limits
    of the application's settings (runtime/limits.py); when main stops, so do they."""
    services = getattr(getattr(main.config.app, "state", None), "services", None)
    if services is not None:
        limits = HttpLimits.from_settings(services.settings)
        limit_server(main, limits)
        # The agent and XKS ports face other networks: handshakes count per address there too.
        for server, _ in sidecars:
            limit_server(server, limits, count_tls=True)
        bound_handshakes(asyncio.get_running_loop(), limits.handshake_timeout)
    tasks = [asyncio.create_task(server.serve(sockets=[sock])) for server, sock in sidecars]
    try:
        await main.serve(sockets=main_sockets)
    finally:
        for server, _ in sidecars:
            server.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
