"""Serving with several worker processes.

uvicorn's own multi-worker mode shares one listening socket, and the kernel then hands
most keep-alive connections to whichever worker wakes first: under load one worker
saturates while the others idle. Here every worker binds its own SO_REUSEPORT socket,
so the kernel spreads connections evenly; the KMIP port is shared the same way. The
supervisor restarts a worker that dies and stops them all on SIGTERM/SIGINT.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
from typing import Any

from keyserver.runtime.sockets import bind_socket
from keyserver.services import Services

log = logging.getLogger(__name__)


def _worker(host: str, port: int, uvicorn_kwargs: dict[str, Any], kmip: bool = False) -> None:
    import uvicorn

    from keyserver.runtime.agentport import agent_sidecar, run_servers
    from keyserver.runtime.asgi import app_factory
    from keyserver.runtime.tls import rest_tls_context, uvicorn_tls
    from keyserver.runtime.xksport import start_xks_sidecar

    app = app_factory(housekeeping=False)  # the supervisor does it
    services = app.state.services
    if kmip:
        # Every worker serves KMIP on the same port (SO_REUSEPORT): one Python process
        # is one core for KMIP, as for HTTP. Caches are per process and dropped by the
        # store's notifications, as between replicas.
        from keyserver.kmip.server import build_listener

        listener = build_listener(services, reuse_port=True)
        try:
            listener.start()
            services.on_close.append(listener.stop)  # runs first (last in, first out)
        except OSError as exc:  # the supervisor bound it a moment ago; serve HTTP regardless
            log.error("worker %s: KMIP listener not started: %s", os.getpid(), exc)
    sock = bind_socket(host, port)
    sidecar = agent_sidecar(services, app, uvicorn_kwargs)  # the agent port: same SO_REUSEPORT sharing
    tls = uvicorn_tls(rest_tls_context(services.settings, services.ca))
    sidecars = ([sidecar] if sidecar else []) + start_xks_sidecar(services, app, uvicorn_kwargs)
    run_servers(uvicorn.Server(uvicorn.Config(app, **uvicorn_kwargs, **tls)), sidecars, [sock])


def serve_workers(*, host: str, port: int, workers: int, uvicorn_kwargs: dict[str, Any],
                  kmip: bool = False, housekeeping: Services | None = None) -> None:
    """`housekeeping`: services of the supervisor's own, on which it chains the audit,
    delivers to the sinks and runs the scheduler while the workers serve requests (and
    closes them at the end)."""
    # Bind once in the parent to fail fast (port in use) before any worker starts.
    probe = bind_socket(host, port)
    # Metrics: each worker writes its values here, every scrape adds them up (api/app.py
    # Metrics). Set before the workers start: prometheus_client reads it on import.
    metrics_dir = tempfile.mkdtemp(prefix="strongroom-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    ctx = multiprocessing.get_context("spawn")
    procs: list[multiprocessing.process.BaseProcess] = []
    stopping = False

    def start() -> multiprocessing.process.BaseProcess:
        p = ctx.Process(target=_worker, args=(host, port, uvicorn_kwargs, kmip), daemon=False)
        p.start()
        return p

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    procs = [start() for _ in range(workers)]
    probe.close()
    if housekeeping is not None:
        housekeeping.start_background()
    try:
        while not stopping:
            time.sleep(0.5)
            for i, p in enumerate(procs):
                if not p.is_alive() and not stopping:
                    log.error("worker %s exited with %s; restarting it", p.pid, p.exitcode)
                    procs[i] = start()
    finally:
        for p in procs:
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for p in procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
        if housekeeping is not None:
            housekeeping.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
