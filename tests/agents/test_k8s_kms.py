"""The Kubernetes KMS v2 plugin (`kms-plugin`, agents/k8skms), driven as kube-apiserver
drives it: a grpcio client generated from the same upstream api.proto, over the plugin's
unix socket, against a real key server (REST over HTTPS, the session's store and HSM).
Status, Encrypt of a DEK seed, Decrypt with the key id and annotations it returned, a
rotation in Strongroom, an outage of the key server and its recovery, a revoked key, bad
input, and the audit record of each call under the plugin's own identity."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import grpc
import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from agents.k8skms.v2 import api_pb2, api_pb2_grpc
from keyserver.runtime.tls import rest_tls_context, uvicorn_tls
from keyserver.services import Services
from tests.conftest import unique
from tests.serve import eventually, free_port

REPO = Path(__file__).resolve().parents[2]
GRACE = 5.0  # the plugin's --grace here: seconds Status stays ok after the key server last answered


class RestServer:
    """The key server's REST port on the session's application, in this process, which a
    test can stop (the outage) and start again on the same port."""

    def __init__(self, app: FastAPI, services: Services) -> None:
        self.app, self.services = app, services
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        tls = uvicorn_tls(rest_tls_context(self.services.settings, self.services.ca))
        self._server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_config=None,
                                                     access_log=False, lifespan="off",
                                                     timeout_graceful_shutdown=1, **tls))
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        eventually(lambda: self._server is not None and self._server.started, "the REST port", 20)

    def stop(self) -> None:
        assert self._server is not None and self._thread is not None
        self._server.should_exit = self._server.force_exit = True  # the plugin's keep-alive connection too
        self._thread.join(timeout=10)
        assert not self._thread.is_alive()


class Plugin:
    """`kms-plugin` in its own process, and kube-apiserver's side of the socket."""

    def __init__(self, tmp: Path, rest: RestServer, token: str, key: str, ca_file: Path) -> None:
        self.socket = tmp / "kms.sock"
        self.token_file = token_file = tmp / "token"
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agents.k8skms.cli", "--socket", str(self.socket), "--server", rest.url,
             "--key", key, "--token-file", str(token_file), "--ca-file", str(ca_file), "--grace", str(GRACE),
             "--timeout", "2"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        eventually(lambda: self.socket.is_socket() or self.proc.poll() is not None, "the plugin's socket", 30)
        assert self.proc.poll() is None, self.proc.communicate()[0]
        # as kube-apiserver dials it: unix:// endpoint, insecure channel (the socket's mode is the guard)
        self.channel = grpc.insecure_channel(f"unix://{self.socket}")
        self.stub = api_pb2_grpc.KeyManagementServiceStub(self.channel)  # type: ignore[no-untyped-call]

    def status(self) -> api_pb2.StatusResponse:
        return cast(api_pb2.StatusResponse, self.stub.Status(api_pb2.StatusRequest(), timeout=3))

    def encrypt(self, plaintext: bytes, uid: str | None = None) -> api_pb2.EncryptResponse:
        request = api_pb2.EncryptRequest(plaintext=plaintext, uid=uid or str(uuid.uuid4()))
        return cast(api_pb2.EncryptResponse, self.stub.Encrypt(request, timeout=3))

    def decrypt(self, out: api_pb2.EncryptResponse, uid: str | None = None, **over: Any) -> bytes:
        req = {"ciphertext": out.ciphertext, "uid": uid or str(uuid.uuid4()), "key_id": out.key_id,
               "annotations": dict(out.annotations), **over}
        return bytes(self.stub.Decrypt(api_pb2.DecryptRequest(**req), timeout=3).plaintext)

    def close(self) -> str:
        self.channel.close()
        self.proc.send_signal(signal.SIGTERM)
        output, _ = self.proc.communicate(timeout=20)
        assert self.proc.returncode == 0, output
        assert not self.socket.exists()
        return output


@pytest.fixture
def rest(app: FastAPI, services: Services) -> Iterator[RestServer]:
    server = RestServer(app, services)
    server.start()
    yield server
    if server._thread is not None and server._thread.is_alive():
        server.stop()


def _token(base_url: str, tls: Any, username: str, password: str) -> dict[str, str]:
    """An API token of the service account, scoped to what the plugin does (docs/integrations.md)."""
    with httpx.Client(base_url=base_url, verify=tls, timeout=30) as s:
        r = s.post("/api/v1/auth/login", json={"username": username, "password": password})
        assert r.status_code == 200, r.text
        r = s.post("/api/v1/tokens", headers={"X-CSRF-Token": r.json()["csrf_token"]},
                   json={"name": "kms-plugin", "scopes": ["keys:read", "keys:encrypt", "keys:decrypt"]})
        assert r.status_code == 201, r.text
        return {"token": r.json()["secret"], "token_id": r.json()["token"]["id"]}


@pytest.fixture
def identity(services: Services, base_url: str, tls: Any) -> dict[str, str]:
    """The plugin's identity: a `kmip-client` service account and its API token."""
    from keyserver.core.principal import system_context

    username, password = unique("k8s-kms"), f"pw-{uuid.uuid4().hex}"
    services.identity.create_user(system_context("tests"), username=username, role="kmip-client", password=password)
    return {"username": username, "password": password, **_token(base_url, tls, username, password)}


@pytest.fixture
def kek(admin: httpx.Client) -> dict[str, Any]:
    r = admin.post("/api/v1/keys", json={"name": unique("k8s-secrets"), "activate": True})
    assert r.status_code == 201, r.text
    return dict(r.json())


@pytest.fixture
def plugin(tmp_path: Path, rest: RestServer, identity: dict[str, str], kek: dict[str, Any],
           ca_file: Path) -> Iterator[Plugin]:
    # a short directory: a unix socket's path is at most 107 bytes
    short = Path(os.environ.get("TMPDIR", "/tmp")) / f"k8skms-{uuid.uuid4().hex[:8]}"
    short.mkdir(mode=0o700)
    p = Plugin(short, rest, identity["token"], kek["name"], ca_file)
    yield p
    if p.proc.poll() is None:
        p.proc.kill()
        p.proc.wait()
    for f in short.iterdir():
        f.unlink()
    short.rmdir()


def _events(services: Services, admin: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    services.audit.flush()
    r = admin.get("/api/v1/audit/events", params={"limit": 100, **params})
    assert r.status_code == 200, r.text
    return list(r.json()["items"])


def _code(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return cast(grpc.StatusCode, e.value.code())


def test_status_encrypt_decrypt_as_kube_apiserver(plugin: Plugin, kek: dict[str, Any], identity: dict[str, str],
                                                  services: Services, admin: httpx.Client) -> None:
    assert stat.S_IMODE(plugin.socket.stat().st_mode) == 0o600
    status = plugin.status()
    key_id = f"{kek['id']}:v1"
    assert (status.version, status.healthz, status.key_id) == ("v2", "ok", key_id)

    seed = os.urandom(32)  # kube-apiserver's DEK seed
    t0 = time.perf_counter()
    out = plugin.encrypt(seed, uid="uid-encrypt-1")
    encrypt_ms = (time.perf_counter() - t0) * 1000
    assert out.key_id == key_id and dict(out.annotations) == {}
    assert seed not in out.ciphertext and len(out.ciphertext) == 12 + 32 + 16
    t0 = time.perf_counter()
    assert plugin.decrypt(out, uid="uid-decrypt-1") == seed
    decrypt_ms = (time.perf_counter() - t0) * 1000
    print(f"kms-plugin one call: Encrypt {encrypt_ms:.1f} ms, Decrypt {decrypt_ms:.1f} ms")
    # kube-apiserver's default KMS timeout is 3 s; one call is a few HTTPS round trips to the HSM
    assert encrypt_ms < 1000 and decrypt_ms < 1000

    actor = f"{identity['username']}/token:kms-plugin"  # the service account, through the plugin's token
    enc = _events(services, admin, action="key.encrypt", object_id=kek["id"])
    dec = _events(services, admin, action="key.decrypt", object_id=kek["id"])
    assert [e["actor"] for e in enc] == [actor] and enc[0]["outcome"] == "allowed"
    assert [e["actor"] for e in dec] == [actor] and dec[0]["outcome"] == "allowed"
    assert all(seed.hex() not in str(e) for e in enc + dec)
    # Status's metadata reads leave no records: the plugin's trail is its Encrypts and Decrypts
    assert {e["action"] for e in _events(services, admin, actor=actor)} == {"key.encrypt", "key.decrypt"}
    log = plugin.close()  # the plugin's own log names each request's uid and key id, never the bytes
    assert f"encrypt uid=uid-encrypt-1 key_id={key_id}" in log and f"decrypt uid=uid-decrypt-1 key_id={key_id}" in log
    assert seed.hex() not in log


def test_rotation_changes_key_id_and_old_ciphertexts_decrypt(plugin: Plugin, kek: dict[str, Any],
                                                             admin: httpx.Client) -> None:
    old_seed = os.urandom(32)
    old = plugin.encrypt(old_seed)
    assert old.key_id == f"{kek['id']}:v1"
    r = admin.post(f"/api/v1/keys/{kek['id']}/rotate")
    assert r.status_code == 200, r.text
    status = plugin.status()
    assert (status.healthz, status.key_id) == ("ok", f"{kek['id']}:v2")  # kube-apiserver re-seeds
    new_seed = os.urandom(32)
    new = plugin.encrypt(new_seed)
    assert new.key_id == f"{kek['id']}:v2"
    assert plugin.decrypt(old) == old_seed and plugin.decrypt(new) == new_seed
    # the version is bound by the key id: the old ciphertext under the new version does not decrypt
    assert _code(lambda: plugin.decrypt(old, key_id=new.key_id)) is grpc.StatusCode.INVALID_ARGUMENT
    plugin.close()


def test_outage_status_keeps_the_key_id_then_turns_unhealthy_and_recovers(plugin: Plugin, rest: RestServer,
                                                                        kek: dict[str, Any]) -> None:
    seed = os.urandom(32)
    out = plugin.encrypt(seed)
    assert plugin.status().healthz == "ok"
    answered = time.monotonic()  # the key server's last answer, as the plugin saw it (a moment before)
    rest.stop()
    # within the grace: Status still ok with the last key id (kube-apiserver keeps its DEK)
    status = plugin.status()
    assert time.monotonic() - answered < GRACE
    assert (status.version, status.healthz, status.key_id) == ("v2", "ok", f"{kek['id']}:v1")
    # nothing secret is cached: Encrypt and Decrypt need the key server
    assert _code(lambda: plugin.encrypt(os.urandom(32))) is grpc.StatusCode.UNAVAILABLE
    assert _code(lambda: plugin.decrypt(out)) is grpc.StatusCode.UNAVAILABLE
    time.sleep(max(0.0, GRACE + 0.5 - (time.monotonic() - answered)))
    status = plugin.status()
    assert status.healthz.startswith("unhealthy: key server unreachable") and status.key_id == f"{kek['id']}:v1"
    rest.start()
    status = plugin.status()
    assert (status.healthz, status.key_id) == ("ok", f"{kek['id']}:v1")
    assert plugin.decrypt(out) == seed
    plugin.close()


def test_revoked_key(plugin: Plugin, kek: dict[str, Any], identity: dict[str, str], services: Services,
                     admin: httpx.Client) -> None:
    seed = os.urandom(32)
    out = plugin.encrypt(seed)
    r = admin.post(f"/api/v1/keys/{kek['id']}/revoke", json={"reason": "key-compromise", "message": "test"})
    assert r.status_code == 200, r.text
    status = plugin.status()
    assert status.healthz != "ok" and "compromised" in status.healthz.lower() and status.key_id == f"{kek['id']}:v1"
    assert _code(lambda: plugin.encrypt(os.urandom(32))) is grpc.StatusCode.FAILED_PRECONDITION
    # a compromised version still decrypts what it protected (KMIP 1.4 §3.22: it processes, never protects)
    assert plugin.decrypt(out) == seed
    # a destroyed version decrypts nothing any more
    r = admin.post(f"/api/v1/keys/{kek['id']}/destroy", json={"version": 1})
    assert r.status_code == 200, r.text
    assert _code(lambda: plugin.decrypt(out)) is grpc.StatusCode.FAILED_PRECONDITION
    refused = [e for e in _events(services, admin, action="key.encrypt", object_id=kek["id"])
               if e["outcome"] in ("denied", "error")]
    assert refused and refused[0]["actor"] == f"{identity['username']}/token:kms-plugin"
    plugin.close()


def test_a_revoked_token_stops_the_plugin_at_once_and_sighup_takes_a_new_one(
        plugin: Plugin, identity: dict[str, str], admin: httpx.Client, base_url: str, tls: Any) -> None:
    out = plugin.encrypt(os.urandom(32))
    r = admin.delete(f"/api/v1/tokens/{identity['token_id']}")
    assert r.status_code in (200, 204), r.text
    assert _code(lambda: plugin.decrypt(out)) is grpc.StatusCode.UNAUTHENTICATED
    assert _code(lambda: plugin.encrypt(os.urandom(32))) is grpc.StatusCode.UNAUTHENTICATED
    assert plugin.status().healthz.startswith("unhealthy: key server refused: token_revoked")
    # a new token in the file, then SIGHUP (systemctl reload): served again without a restart
    plugin.token_file.write_text(_token(base_url, tls, identity["username"], identity["password"])["token"])
    plugin.proc.send_signal(signal.SIGHUP)
    eventually(lambda: plugin.status().healthz == "ok", "the plugin to take the new token", 10)
    seed = os.urandom(32)
    assert plugin.decrypt(plugin.encrypt(seed)) == seed
    assert "SIGHUP: the API token was read again" in plugin.close()


def test_bad_input_gets_precise_codes(plugin: Plugin, kek: dict[str, Any]) -> None:
    out = plugin.encrypt(os.urandom(32))
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    assert _code(lambda: plugin.encrypt(b"")) is invalid
    assert _code(lambda: plugin.encrypt(os.urandom(1025))) is invalid
    assert _code(lambda: plugin.decrypt(out, key_id="not-ours")) is invalid
    assert _code(lambda: plugin.decrypt(out, key_id=f"{kek['id']}:v0")) is invalid
    assert _code(lambda: plugin.decrypt(out, ciphertext=out.ciphertext[:20])) is invalid
    tampered = bytearray(out.ciphertext)
    tampered[20] ^= 1
    assert _code(lambda: plugin.decrypt(out, ciphertext=bytes(tampered))) is invalid
    assert _code(lambda: plugin.decrypt(out, annotations={"version.kms.k8s.io": b"1"})) is invalid
    assert _code(lambda: plugin.decrypt(out, key_id=f"{uuid.uuid4()}:v1")) is grpc.StatusCode.NOT_FOUND
    # the message size is bounded: a 100 KiB request never reaches the handler
    assert _code(lambda: plugin.encrypt(os.urandom(100 * 1024))) is grpc.StatusCode.RESOURCE_EXHAUSTED
    plugin.close()


def test_the_committed_bindings_are_compiled_from_the_vendored_proto(tmp_path: Path) -> None:
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    out = tmp_path / "api.pb"
    assert protoc.main(["protoc", f"-I{REPO}", f"--descriptor_set_out={out}",
                        str(REPO / "agents/k8skms/v2/api.proto")]) == 0
    compiled = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    committed = descriptor_pb2.FileDescriptorProto.FromString(api_pb2.DESCRIPTOR.serialized_pb)
    for message in [*compiled.message_type, *(n for m in compiled.message_type for n in m.nested_type)]:
        for field in message.field:
            field.ClearField("json_name")  # protoc fills it in a descriptor set; the bindings derive it
    assert compiled == committed
    assert [m.name for m in committed.service[0].method] == ["Status", "Decrypt", "Encrypt"]
    assert committed.package == "v2" and committed.service[0].name == "KeyManagementService"
    text = (REPO / "agents/k8skms/v2/api.proto").read_text()
    assert "Copyright 2022 The Kubernetes Authors." in text and "staging/src/k8s.io/kms/apis/v2/api.proto" in text
