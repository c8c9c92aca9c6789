"""The plugin's one way to the key server: its REST API with the plugin's own API token
(a `kmip-client` service account, scoped to keys:read, keys:encrypt and keys:decrypt), so
every Encrypt and Decrypt is done in the HSM and audited under that identity.

The KMS key id kube-apiserver stores beside each encrypted DEK seed is `<key UUID>:v<N>`:
the managed key and the version that encrypted. Ciphertext is `IV (12) || ciphertext ||
tag (16)` of AES-256-GCM in the HSM, with the associated data `k8s-kms-v2:<key UUID>`, so a
seed cannot be passed off as another key's.

Every failure is a `BackendError` carrying the gRPC status code the plugin answers with."""

from __future__ import annotations

import base64
import re
import ssl
import uuid
from dataclasses import dataclass
from typing import Any

import grpc
import httpx

from agents.errors import AgentError, Exit

IV_BYTES, TAG_BYTES = 12, 16
KEY_ID = re.compile(r"^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}):v([1-9][0-9]{0,8})$")


class BackendError(AgentError):
    """The key server refused or could not be reached; `code` is what gRPC answers."""

    exit_status = Exit.KEY

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code

    @property
    def exit_code(self) -> Exit:
        return Exit.UNREACHABLE if self.code is grpc.StatusCode.UNAVAILABLE else Exit.KEY


@dataclass(frozen=True)
class KeyState:
    key_id: str  # <uuid>:v<N> of the current version
    state: str  # the current version's state (Active, Deactivated, Compromised, ...)


def parse_key_id(key_id: str) -> tuple[str, int]:
    m = KEY_ID.match(key_id)
    if not m:
        raise BackendError(grpc.StatusCode.INVALID_ARGUMENT,
                           "key_id is not one this plugin made (<key UUID>:v<version>)")
    return m.group(1), int(m.group(2))


def aad_for(key_uuid: str) -> bytes:
    return f"k8s-kms-v2:{key_uuid}".encode()


# REST answers → gRPC status codes (docs/integrations.md "Kubernetes: KMS v2 plugin").
_BY_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.UNAVAILABLE,
}


class KeyServer:
    """A keep-alive HTTPS client of the key server's REST API for one managed key."""

    def __init__(self, url: str, token: str, key: str, verify: ssl.SSLContext | str | bool = True,
                 timeout: float = 5.0) -> None:
        self.key = key
        self.timeout = timeout
        self._uuid: str | None = None  # the key's UUID once known (its name may be given)
        self._http = httpx.Client(base_url=url.rstrip("/") + "/api/v1", verify=verify, timeout=timeout,
                                  headers={"Authorization": f"Bearer {token}"},
                                  limits=httpx.Limits(max_connections=8, max_keepalive_connections=4))

    def close(self) -> None:
        self._http.close()

    def set_token(self, token: str) -> None:
        """A replaced API token, used from the next call on (kms-plugin re-reads it on SIGHUP)."""
        self._http.headers["Authorization"] = f"Bearer {token}"

    def _call(self, method: str, path: str, body: dict[str, Any] | None, timeout: float | None) -> dict[str, Any]:
        try:
            r = self._http.request(method, path, json=body, timeout=timeout or self.timeout)
        except httpx.HTTPError as e:
            raise BackendError(grpc.StatusCode.UNAVAILABLE,
                               f"key server unreachable: {type(e).__name__}") from None
        if r.status_code >= 400:
            try:
                problem = r.json()
                detail = f"{problem.get('code', r.status_code)}: {problem.get('detail', '')}"
            except ValueError:
                detail = f"HTTP {r.status_code}"
            code = _BY_STATUS.get(r.status_code, grpc.StatusCode.UNAVAILABLE if r.status_code >= 500
                                  else grpc.StatusCode.INTERNAL)
            raise BackendError(code, f"key server refused: {detail}")
        out: dict[str, Any] = r.json()
        return out

    def current(self, timeout: float | None = None) -> KeyState:
        """The key's current version, as kube-apiserver's key_id."""
        got = self._call("GET", f"/keys/{_path(self.key)}", None, timeout)
        version = int(got["current_version"])
        state = next((str(v["state"]) for v in got.get("versions", []) if v.get("version") == version),
                     str(got["state"]))
        self._uuid = str(uuid.UUID(str(got["id"])))
        return KeyState(f"{self._uuid}:v{version}", state)

    def encrypt(self, plaintext: bytes, timeout: float | None = None) -> tuple[bytes, str]:
        """(ciphertext, key_id) under the key's current version."""
        key_uuid = self._uuid or self.current(timeout).key_id.partition(":")[0]
        got = self._call("POST", f"/keys/{key_uuid}/encrypt",
                         {"plaintext": _b64(plaintext), "mode": "AES-GCM",
                          "aad": _b64(aad_for(key_uuid))}, timeout)
        iv, ct, tag = (base64.b64decode(got[f]) for f in ("iv", "ciphertext", "tag"))
        if len(iv) != IV_BYTES or len(tag) != TAG_BYTES:
            raise BackendError(grpc.StatusCode.INTERNAL, "key server answered an unexpected IV or tag length")
        return iv + ct + tag, f"{key_uuid}:v{int(got['version'])}"

    def decrypt(self, ciphertext: bytes, key_id: str, timeout: float | None = None) -> bytes:
        key_uuid, version = parse_key_id(key_id)
        if len(ciphertext) < IV_BYTES + TAG_BYTES + 1:
            raise BackendError(grpc.StatusCode.INVALID_ARGUMENT, "ciphertext too short")
        iv, ct, tag = ciphertext[:IV_BYTES], ciphertext[IV_BYTES:-TAG_BYTES], ciphertext[-TAG_BYTES:]
        got = self._call("POST", f"/keys/{key_uuid}/decrypt",
                         {"ciphertext": _b64(ct), "version": version, "mode": "AES-GCM", "iv": _b64(iv),
                          "tag": _b64(tag), "aad": _b64(aad_for(key_uuid))}, timeout)
        return base64.b64decode(got["plaintext"])


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _path(key: str) -> str:
    return httpx.URL("/" + key).raw_path.decode().lstrip("/").replace("/", "%2F")
