"""`v2.KeyManagementService` (KMS v2, as kube-apiserver calls it) over the key server.

What is kept between calls, in memory only: the current key id (`<key UUID>:v<N>`, not
secret), the current version's state and when the key server last answered. Nothing
secret is cached: every Encrypt and Decrypt goes to the key server, and no plaintext ever
touches the disk. Status answers "ok" while the key server answered within the last
`grace` seconds (reporting the last key id it gave, so kube-apiserver keeps its DEK); after
that, "unhealthy: ..." with the same key id until it answers again."""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

from agents.k8skms.backend import BackendError, KeyServer
from agents.k8skms.v2 import api_pb2, api_pb2_grpc

log = logging.getLogger("strongroom.k8skms")

API_VERSION = "v2"
MAX_PLAINTEXT = 1024  # kube-apiserver sends a 32-byte DEK seed
MAX_CIPHERTEXT = 2048  # ours is plaintext + 28 bytes; kube-apiserver stores at most 1 KiB
MAX_UID = 256
MAX_MESSAGE = 64 * 1024  # gRPC messages in either direction (annotations are bounded to 32 kB upstream)


class Health:
    """The last answer of the key server, shared by the RPC threads."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self._lock = threading.Lock()
        self.key_id = ""
        self.state = ""
        self.last_ok: float | None = None  # time.monotonic() of the key server's last answer

    def answered(self, key_id: str | None = None, state: str | None = None) -> None:
        with self._lock:
            self.last_ok = time.monotonic()
            if key_id is not None:
                self.key_id = key_id
            if state is not None:
                self.state = state

    def recent(self) -> bool:
        with self._lock:
            return self.last_ok is not None and time.monotonic() - self.last_ok <= self.grace


class KeyManagementService(api_pb2_grpc.KeyManagementServiceServicer):
    def __init__(self, server: KeyServer, grace: float = 60.0, status_timeout: float = 2.0) -> None:
        self.server = server
        self.health = Health(grace)
        self.status_timeout = status_timeout

    def _timeout(self, context: grpc.ServicerContext) -> float:
        remaining = context.time_remaining()
        return self.server.timeout if remaining is None else max(0.05, min(self.server.timeout, remaining - 0.05))

    def Status(self, request: api_pb2.StatusRequest, context: grpc.ServicerContext) -> api_pb2.StatusResponse:
        h = self.health
        try:
            key = self.server.current(min(self.status_timeout, self._timeout(context)))
        except BackendError as e:
            if e.code is grpc.StatusCode.UNAVAILABLE and h.recent():
                healthz = "ok" if h.state.lower() == "active" else f"key version {h.key_id} is {h.state}"
            else:
                healthz = f"unhealthy: {e}"
            log.warning("status: %s (last key id %s)", e, h.key_id or "-")
            return api_pb2.StatusResponse(version=API_VERSION, healthz=healthz, key_id=h.key_id)
        h.answered(key.key_id, key.state)
        healthz = "ok" if key.state.lower() == "active" else \
            f"key version {key.key_id} is {key.state}: it no longer encrypts; rotate or activate it in Strongroom"
        return api_pb2.StatusResponse(version=API_VERSION, healthz=healthz, key_id=key.key_id)

    def Encrypt(self, request: api_pb2.EncryptRequest, context: grpc.ServicerContext) -> api_pb2.EncryptResponse:
        _check_uid(request.uid, context)
        if not 1 <= len(request.plaintext) <= MAX_PLAINTEXT:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"plaintext must be 1 to {MAX_PLAINTEXT} bytes")
        try:
            ciphertext, key_id = self.server.encrypt(request.plaintext, self._timeout(context))
        except BackendError as e:
            log.warning("encrypt uid=%s: %s", request.uid, e)
            context.abort(e.code, str(e))
        self.health.answered(key_id)
        log.info("encrypt uid=%s key_id=%s", request.uid, key_id)
        return api_pb2.EncryptResponse(ciphertext=ciphertext, key_id=key_id)

    def Decrypt(self, request: api_pb2.DecryptRequest, context: grpc.ServicerContext) -> api_pb2.DecryptResponse:
        _check_uid(request.uid, context)
        if not 1 <= len(request.ciphertext) <= MAX_CIPHERTEXT:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ciphertext must be 1 to {MAX_CIPHERTEXT} bytes")
        if request.annotations:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "unexpected annotations: this plugin sets none (" + ", ".join(sorted(request.annotations))
                          + ")")
        try:
            plaintext = self.server.decrypt(request.ciphertext, request.key_id, self._timeout(context))
        except BackendError as e:
            log.warning("decrypt uid=%s key_id=%s: %s", request.uid, request.key_id[:80], e)
            context.abort(e.code, str(e))
        self.health.answered()
        log.info("decrypt uid=%s key_id=%s", request.uid, request.key_id)
        return api_pb2.DecryptResponse(plaintext=plaintext)


def _check_uid(uid: str, context: grpc.ServicerContext) -> None:
    if len(uid) > MAX_UID or not uid.isprintable():
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"uid must be at most {MAX_UID} printable characters")


def serve(service: KeyManagementService, socket_path: Path, workers: int = 4) -> grpc.Server:
    """Starts the gRPC server on `socket_path` (mode 0600, a stale socket replaced)."""
    if socket_path.is_socket():
        socket_path.unlink()
    elif socket_path.exists():
        raise FileExistsError(f"{socket_path} exists and is not a socket")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="k8skms"),
                         maximum_concurrent_rpcs=64,
                         options=[("grpc.max_receive_message_length", MAX_MESSAGE),
                                  ("grpc.max_send_message_length", MAX_MESSAGE)])
    api_pb2_grpc.add_KeyManagementServiceServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    old = os.umask(0o177)  # the socket is born 0600: no window where others may connect
    try:
        server.add_insecure_port(f"unix://{socket_path}")
        server.start()
    finally:
        os.umask(old)
    os.chmod(socket_path, 0o600)
    return server
