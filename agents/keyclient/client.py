"""The agent's client of the key server's agent port: HTTPS with the server's CA pinned,
and, once enrolled, the host's certificate and key for mutual TLS.

Errors say what to do next: ServerUnreachable (network, TLS, 5xx: keep working from the
cache), HostRevoked (stop: this host must be re-enrolled), ServerRefused (the server
answered no, with its problem code: a forbidden key, a destroyed version, a used token).
A HostRevoked is also remembered on disk before it is raised (keyclient/revocation.py),
whoever made the call: no offline path of this host opens anything after it.
"""

from __future__ import annotations

import base64
import socket
import ssl
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from agents import __version__
from agents.cryptfile.errors import KeyUnavailable
from agents.cryptfile.keys import KeyVersion
from agents.errors import AgentError, Exit
from agents.keyclient.cache import KeyCache, ServerUnreachable
from agents.keyclient.identity import CA_FILE, CERT_FILE, KEY_FILE, HostIdentity
from agents.keyclient.revocation import RevocationLedger, certificate_fingerprint

# Events are sent in batches no larger than the server takes (EventBatch).
MAX_EVENT_BATCH = 500


class ServerRefused(AgentError):
    """The server understood the call and said no (4xx), with its problem code."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail

    @property
    def exit_code(self) -> Exit:
        return Exit.NOT_ENROLLED if self.code.startswith("enrollment_") else Exit.KEY

    def describe(self) -> str:
        return f"the key server refused: {self.detail} ({self.code})"


class HostRevoked(ServerRefused):
    """This host's certificate is revoked or unknown to the server."""

    @property
    def exit_code(self) -> Exit:
        return Exit.NOT_ENROLLED

    def describe(self) -> str:
        return f"the key server refuses this host ({self.detail}); re-enroll it with `kms-agent enroll --token TOKEN`"


@dataclass(frozen=True, slots=True)
class VolumeSecret:
    """A volume's keyslot passphrase, unwrapped here, with the blob that seals it on the
    server (what the volume's LUKS2 token keeps) and the key version it is sealed under."""

    volume: dict[str, Any]
    key_name: str
    key_version: int
    blob: bytes
    passphrase: bytes = field(repr=False)
    # The volume's offline grace (None: fail closed) and the passphrase as it came,
    # wrapped under this host's key: what the agent may keep until then.
    grace_until: str | None = None
    wrapped: bytes = field(default=b"", repr=False)
    mechanism: str = ""


@dataclass(frozen=True, slots=True)
class DeliveredKey:
    key: KeyVersion
    name: str
    state: str


def _tls_hint(exc: Exception) -> str:
    text = str(exc)
    if "certificate has expired" in text or "not yet valid" in text:
        return f"{text} — check this host's clock (NTP): certificates are only valid within their dates"
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return f"{text} — the server's certificate is not from the pinned CA; check server_url and ca_file"
    return text


class ServerClient:
    def __init__(self, server_url: str, ca_file: Path, identity: HostIdentity | None = None, *,
                 timeout: float = 10.0) -> None:
        self.server_url = server_url.rstrip("/")
        context = ssl.create_default_context(cafile=str(ca_file))
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # The certificate this client presents: a refusal of it is about it, not about one
        # a later enrollment wrote.
        self._certificate = ""
        if identity is not None and identity.enrolled:
            self._certificate = certificate_fingerprint(identity.state_dir)
            context.load_cert_chain(identity.state_dir / CERT_FILE, identity.state_dir / KEY_FILE)
        self._identity = identity
        self._http = httpx.Client(base_url=self.server_url, verify=context, timeout=timeout,
                                  headers={"user-agent": f"strongroom-agent/{__version__}"})

    @classmethod
    def for_host(cls, server_url: str, identity: HostIdentity, *, timeout: float = 10.0) -> ServerClient:
        """After enrollment the CA the server sent is the one pinned."""
        return cls(server_url, identity.state_dir / CA_FILE, identity, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # --- calls ------------------------------------------------------------------------
    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            r = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise ServerUnreachable(f"{self.server_url} did not answer in time") from None
        except (httpx.TransportError, ssl.SSLError) as exc:
            raise ServerUnreachable(f"{self.server_url}: {_tls_hint(exc)}") from None
        if r.status_code >= 500:
            raise ServerUnreachable(f"{self.server_url} answered {r.status_code}: {_detail(r)}")
        if r.status_code >= 400:
            code = _code(r)
            if code in ("host_revoked", "host_unknown"):
                detail = _detail(r)
                if self._identity is not None and self._certificate:
                    try:
                        RevocationLedger(self._identity.state_dir).mark_host(code=code, detail=detail,
                                                                             certificate=self._certificate)
                    except OSError as exc:  # a full or read-only state dir must not hide the revocation
                        detail = f"{detail} (not remembered on disk: {exc})"
                raise HostRevoked(r.status_code, code, detail)
            raise ServerRefused(r.status_code, code, _detail(r))
        return r.json()

    def enroll(self, token: str, *, hostname: str | None = None, os_name: str = "") -> dict[str, Any]:
        """Send this host's CSR with the token; keep the certificate and the CA."""
        assert self._identity is not None
        name = hostname or socket.getfqdn()
        body = {"token": token, "csr_pem": self._identity.csr(name).decode(), "hostname": name,
                "os": os_name, "agent_version": __version__}
        result: dict[str, Any] = self._call("POST", "/api/v1/enroll", json=body)
        self._identity.save_certificates(result["certificate_pem"].encode(), result["ca_pem"].encode())
        RevocationLedger(self._identity.state_dir).clear_host()  # a new certificate: the refusal was of the old one
        return result

    def heartbeat(self, *, os_name: str, guard_points: Iterable[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Report this host (and, from the daemon, its guard points: None leaves the
        server's record of them as it is)."""
        body: dict[str, Any] = {"os": os_name, "agent_version": __version__}
        if guard_points is not None:
            body["guard_points"] = list(guard_points)
        result: dict[str, Any] = self._call("POST", "/api/v1/agent/heartbeat", json=body)
        return result

    def list_keys(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/agent/keys")
        return result

    def guard_points(self) -> list[dict[str, Any]]:
        """The guard points this host must serve, with their policies."""
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/agent/guard-points")
        return result

    def fetch(self, key_ref: str | uuid.UUID, version: int | None = None) -> DeliveredKey:
        """A key version (the Active one by default), unwrapped here with the host key."""
        assert self._identity is not None
        params = {"version": version} if version is not None else {}
        d = self._call("GET", f"/api/v1/agent/keys/{key_ref}", params=params)
        material = self._identity.unwrap(base64.b64decode(d["wrapped_key"]), mechanism=d["mechanism"])
        try:
            return DeliveredKey(KeyVersion(uuid.UUID(d["key_id"]), int(d["version"]), material), d["name"], d["state"])
        finally:
            del material

    # --- block volumes (docs/volumes.md) ----------------------------------------------
    def _secret(self, volume: dict[str, Any], s: dict[str, Any]) -> VolumeSecret:
        assert self._identity is not None
        wrapped = base64.b64decode(s["wrapped_passphrase"])
        passphrase = self._identity.unwrap(wrapped, mechanism=s["mechanism"])
        return VolumeSecret(volume, s["key_name"], int(s["key_version"]), base64.b64decode(s["blob"]), passphrase,
                            s.get("grace_until"), wrapped, s["mechanism"])

    def volumes(self) -> list[dict[str, Any]]:
        """The volumes this host may open."""
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/agent/volumes")
        return result

    def create_volume(self, *, name: str, path: str, key: str, scope: str = "host", sector_size: int = 4096,
                      size_bytes: int | None = None) -> VolumeSecret:
        d = self._call("POST", "/api/v1/agent/volumes", json={
            "name": name, "path": path, "key": key, "scope": scope, "sector_size": sector_size,
            "size_bytes": size_bytes})
        return self._secret(d["volume"], d["secret"])

    def unseal_volume(self, volume_id: str, blob: bytes) -> VolumeSecret:
        d = self._call("POST", f"/api/v1/agent/volumes/{volume_id}/unseal",
                       json={"blob": base64.b64encode(blob).decode()})
        return self._secret(d["volume"], d["secret"])

    def reseal_volume(self, volume_id: str, blob: bytes) -> tuple[VolumeSecret, VolumeSecret]:
        """The passphrase in use and a new one sealed under the key's Active version."""
        d = self._call("POST", f"/api/v1/agent/volumes/{volume_id}/reseal",
                       json={"blob": base64.b64encode(blob).decode()})
        return self._secret(d["volume"], d["current"]), self._secret(d["volume"], d["new"])

    def report_volume(self, volume_id: str, state: str, **fields: Any) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/api/v1/agent/volumes/{volume_id}/report",
                                            json={"state": state, **fields})
        return result

    def record_volume_recovery(self, volume_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/api/v1/agent/volumes/{volume_id}/recovery")
        return result

    def send_events(self, events: list[dict[str, Any]]) -> None:
        """A spool batch, in server batches; raises (and the spool keeps it) on failure."""
        for i in range(0, len(events), MAX_EVENT_BATCH):
            self._call("POST", "/api/v1/agent/events",
                       json={"events": [to_wire(e) for e in events[i:i + MAX_EVENT_BATCH]]})


def to_wire(event: dict[str, Any]) -> dict[str, Any]:
    """A spooled event (flat: event, time, and its fields) in the server's shape: the
    volume, file path or key it concerns becomes the audited object (a volume's is what
    its page in the console lists)."""
    fields = {k: v for k, v in event.items() if k not in ("event", "time")}
    obj_type, obj_id = None, None
    for name, kind in (("volume_id", "volume"), ("path", "file"), ("key_id", "key")):
        if fields.get(name) is not None:
            obj_type, obj_id = kind, str(fields.pop(name))
            break
    clean = {k: v if isinstance(v, (int, float, bool)) or v is None else str(v)[:1024] for k, v in fields.items()}
    return {"event": event["event"], "time": float(event.get("time", datetime.now(UTC).timestamp())),
            "object_type": obj_type, "object_id": obj_id, "fields": clean}


def _code(r: httpx.Response) -> str:
    try:
        return str(r.json().get("code", "error"))
    except ValueError:
        return "error"


def _detail(r: httpx.Response) -> str:
    try:
        body = r.json()
        return str(body.get("detail") or body.get("title") or r.reason_phrase)
    except ValueError:
        return r.text[:200] or r.reason_phrase


class ServerKeyring:
    """The `Keyring` the file format and guard points read through: key versions from
    the server, held by the in-memory cache (TTL, size bound, fails closed)."""

    def __init__(self, client: ServerClient, *, ttl_seconds: float, max_entries: int) -> None:
        self._client = client
        self.cache = KeyCache(self._fetch, ttl_seconds=ttl_seconds, max_entries=max_entries)

    def _fetch(self, key_id: uuid.UUID, version: int) -> KeyVersion:
        try:
            return self._client.fetch(key_id, version).key
        except HostRevoked:
            self.cache.drop_all()
            raise
        except ServerRefused as exc:
            raise KeyUnavailable(f"key {key_id} version {version}: {exc.detail}") from None

    def get(self, key_id: uuid.UUID, version: int) -> KeyVersion:
        return self.cache.get(key_id, version)
