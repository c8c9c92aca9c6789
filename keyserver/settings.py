"""One settings object for the whole keyserver, read from STRONGROOM_* variables.

Nothing is parsed at import time: `Settings()` is built by the entry point and passed
down. The embedded default (SQLite + SoftHSM2 under `data_dir`, HTTPS from the internal
CA) needs no settings at all; anything that is not local requires real secrets and TLS.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
import typing
from pathlib import Path
from typing import Any, Literal

import pydantic_settings
from pydantic import BaseModel, ConfigDict, Field, IPvAnyNetwork, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

from hsm.config import HsmConfig

SOFTHSM_MODULE = "/usr/lib/softhsm/libsofthsm2.so"


class AuditSinkSettings(BaseModel):
    """One audit sink (docs/audit.md): `file` (path, max_bytes, keep), `syslog` (host,
    port, ca_file: RFC 5424 over TLS) or `webhook` (url, ca_file: HTTPS)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
    type: Literal["file", "syslog", "webhook"]
    path: Path | None = None
    max_bytes: int = Field(default=100 * 1024 * 1024, ge=4096)
    keep: int = Field(default=10, ge=1, le=1000)
    host: str | None = None
    port: int = Field(default=6514, ge=1, le=65535)
    server_name: str | None = None
    url: str | None = None
    ca_file: Path | None = None

    @model_validator(mode="after")
    def _complete(self) -> AuditSinkSettings:
        needed = {"file": ("path", self.path), "syslog": ("host", self.host), "webhook": ("url", self.url)}
        field_name, value = needed[self.type]
        if value is None:
            raise ValueError(f"audit sink {self.name!r} ({self.type}) needs {field_name!r}")
        if self.type == "webhook" and not str(self.url).startswith("https://"):
            raise ValueError(f"audit sink {self.name!r}: a webhook URL must be https://")
        return self


class SettingsInvalid(ValueError):
    """Bad STRONGROOM_* values, one line per bad setting in `problems`: the variable,
    what is wrong with its value and the form expected (never pydantic's dump)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STRONGROOM_", env_file=None, extra="ignore")

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise SettingsInvalid(settings_problems(exc)) from None
        except pydantic_settings.SettingsError as exc:  # a list or object setting that is not JSON
            raise SettingsInvalid([_unparsed(str(exc))]) from None

    environment: Literal["local", "production"] = "local"
    data_dir: Path = Path("data")
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default: SQLite file in data_dir"
    )
    database_pool_size: int = Field(default=20, ge=1, le=500)

    host: str = "127.0.0.1"
    port: int = Field(default=8800, ge=1, le=65535)
    public_url: str | None = None
    # The REST/console port serves HTTPS: with the operator's certificate files when
    # given, else with a certificate the internal CA issues for `server_names` (plus
    # localhost, the host name and `host`). Plain HTTP only with `insecure_http`.
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    server_names: list[str] = Field(
        default_factory=list, description="extra DNS names / IPs for the REST port's certificate")
    insecure_http: bool = Field(
        default=False, description="serve the REST API and console over plain HTTP (never in production)")
    workers: int = Field(default=1, ge=1, le=64)
    threads: int = Field(default=64, ge=4, le=1024, description="request worker threads")

    hsm_module: str = SOFTHSM_MODULE
    hsm_token_label: str = "strongroom"  # noqa: S105 - a label, not a secret
    hsm_user_pin: str | None = None
    hsm_so_pin: str | None = None
    hsm_pool_size: int = Field(default=8, ge=1, le=256)
    hsm_softhsm_token_dir: Path | None = None

    session_ttl_minutes: int = Field(default=8 * 60, ge=1)
    session_idle_minutes: int = Field(default=30, ge=1)
    login_max_failures: int = Field(default=5, ge=1)
    # The longest an API token may live (days); 0 allows tokens that never expire.
    token_max_days: int = Field(default=365, ge=0, le=3650)
    login_lockout_seconds: int = Field(default=60, ge=1)
    cookie_secure: bool | None = None

    audit_hmac_key_id: str = "audit-chain-v1"
    # Signed checkpoints of the audit chain (docs/audit.md): every N records or T seconds.
    audit_checkpoint_records: int = Field(default=1000, ge=1)
    audit_checkpoint_seconds: float = Field(default=300.0, gt=0)
    audit_checkpoint_key_id: str = "audit-checkpoint-v1"
    # Where the chain is copied off the server, as JSON: STRONGROOM_AUDIT_SINKS='[{"name":
    # "local", "type": "file", "path": "/var/log/strongroom/audit.jsonl"}]' (docs/audit.md).
    audit_sinks: list[AuditSinkSettings] = Field(default_factory=list)
    # Refuse key operations while no sink accepts records (Vault's "block" behaviour).
    audit_fail_closed: bool = False
    # OpenID Connect sign-in for the console (docs/api.md "Single sign-on"): the issuer,
    # this client's id and secret, and which values of the role claim give which role, as
    # JSON: STRONGROOM_OIDC_ROLE_MAP='{"kms-admins": "admin", "kms-auditors": "auditor"}'.
    oidc_issuer: str | None = None
    oidc_client_id: str | None = None
    oidc_client_secret: str | None = None
    oidc_role_claim: str = "groups"
    oidc_role_map: dict[str, str] = Field(default_factory=dict)
    oidc_scopes: str = "openid profile groups"
    oidc_ca_file: Path | None = None
    # The callback URL registered at the provider; default: public_url + /api/v1/auth/oidc/callback.
    oidc_redirect_url: str | None = None
    # The two-person rule (docs/api.md "Approvals"): actions held until this many other
    # people approve, as JSON: STRONGROOM_APPROVALS='{"key.destroy": 2, "kek.rotate": 2}'.
    approvals: dict[str, int] = Field(default_factory=dict)
    approval_ttl_hours: float = Field(default=24.0, gt=0, le=24 * 30)
    scheduler_interval_seconds: float = Field(default=30.0, gt=0)
    kek_rewrap_batch: int = Field(default=200, ge=1)

    # KMIP listener (docs/kmip.md): mutual TLS, client certificates from the internal CA.
    kmip_enabled: bool = True
    kmip_host: str = "127.0.0.1"
    kmip_port: int = Field(default=5696, ge=0, le=65535, description="0 picks a free port (tests)")
    kmip_server_names: list[str] = Field(
        default_factory=list, description="extra DNS names / IPs for the listener's certificate")
    kmip_max_connections: int = Field(default=64, ge=1, le=4096)
    kmip_max_message_bytes: int = Field(default=1 << 20, ge=1024, le=64 << 20)
    kmip_idle_timeout_seconds: float = Field(default=60.0, gt=0)
    kmip_client_cert_days: int = Field(default=365, ge=1, le=3650)

    # The agent port (docs/agents.md): HTTPS with a certificate from the internal CA,
    # where enrolled hosts authenticate with their client certificates.
    agent_enabled: bool = True
    agent_host: str = "127.0.0.1"
    agent_port: int = Field(default=8443, ge=0, le=65535, description="0 picks a free port (tests)")
    agent_public_url: str | None = Field(
        default=None, description="the agent port's URL as hosts reach it; default https://<agent_host>:<port>")
    agent_server_names: list[str] = Field(
        default_factory=list, description="extra DNS names / IPs for the agent port's certificate")
    agent_heartbeat_seconds: int = Field(default=30, ge=5, le=3600,
                                         description="agents heartbeat this often; offline after 3 missed")

    # The XKS port (docs/integrations.md "Mutual TLS"): AWS KMS's external key store proxy
    # API alone, on its own port, asking for a client certificate that must chain to
    # `xks_client_ca_file` (AWS KMS's public CAs). Off unless `xks_port` is set.
    xks_host: str = "127.0.0.1"
    xks_port: int | None = Field(default=None, ge=0, le=65535,
                                 description="the XKS port (mutual TLS); off when unset; 0 picks a free port (tests)")
    xks_client_ca_file: Path | None = Field(
        default=None, description="PEM bundle of the CAs whose client certificates the XKS port accepts")
    # XKS calls in flight per worker process; past it a call is answered 429
    # ThrottlingException at once (docs/integrations.md "Load shedding", decision 0020).
    # At the benchmark's 1,800 calls/s over two workers (docs/benchmarks.md) a worker holds
    # ~20 on average, under 100 even at the p99's 93 ms; ~225 queued at its ~900 calls/s
    # wait past AWS KMS's 250 ms, so a call admitted beyond ~200 is work no one awaits.
    xks_max_in_flight: int = Field(default=200, ge=1, le=65536,
                                   description="XKS proxy calls in flight per worker; past it: ThrottlingException")

    # Resource limits against hostile clients (docs/api.md "Limits", docs/kmip.md
    # "Connection limits"); the HTTP ones are per worker process and per port.
    max_body_bytes: int = Field(default=1 << 20, ge=1024, le=64 << 20)
    http_max_header_bytes: int = Field(default=64 << 10, ge=4096, le=1 << 20)
    http_header_timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    http_body_timeout_seconds: float = Field(default=60.0, gt=0, le=3600)
    http_max_connections: int = Field(default=2048, ge=16, le=65536)
    http_max_connections_per_source: int = Field(default=64, ge=1, le=65536)
    tls_handshake_timeout_seconds: float = Field(default=5.0, gt=0, le=120)
    kmip_max_connections_per_source: int = Field(default=16, ge=1, le=4096)
    # A load balancer passing TLS through (deploy/haproxy.cfg) makes every client's
    # connection come from its own address: the per-address caps above would then cap
    # the balancer. Connections from these networks are not capped per address; the
    # balancer caps each client instead (LB_MAX_CONN_PER_SOURCE in deploy/haproxy.cfg).
    trusted_proxies: list[IPvAnyNetwork] = Field(
        default_factory=list, max_length=64,
        description="addresses or networks of load balancers in front (JSON list, e.g. [\"10.0.0.5/32\"])")

    log_level: str = "INFO"

    @model_validator(mode="after")
    def _production_needs_real_secrets(self) -> Settings:
        self._pins_from_credentials()
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("set both STRONGROOM_TLS_CERT_FILE and STRONGROOM_TLS_KEY_FILE, or neither "
                             "(the internal CA then issues the REST port's certificate)")
        if self.insecure_http and self.tls_cert_file is not None:
            raise ValueError("STRONGROOM_INSECURE_HTTP contradicts STRONGROOM_TLS_CERT_FILE: choose one")
        if (self.xks_port is None) != (self.xks_client_ca_file is None):
            raise ValueError("set both STRONGROOM_XKS_PORT and STRONGROOM_XKS_CLIENT_CA_FILE (the CA bundle AWS "
                             "KMS's client certificates chain to), or neither (XKS on the REST port, SigV4 only)")
        if self.environment != "local":
            if self.insecure_http:
                raise ValueError("plain HTTP is refused in production (it would carry passwords, session "
                                 "cookies and data keys in clear): unset STRONGROOM_INSECURE_HTTP; the port "
                                 "serves HTTPS with STRONGROOM_TLS_CERT_FILE/KEY_FILE or the internal CA")
            if not self.hsm_user_pin or not self.hsm_so_pin:
                raise ValueError(
                    "STRONGROOM_HSM_USER_PIN and STRONGROOM_HSM_SO_PIN must be set "
                    "outside the local environment"
                )
            if self.database_url is None:
                raise ValueError("STRONGROOM_DATABASE_URL must be set outside the local environment")
        return self

    def _pins_from_credentials(self) -> None:
        """PINs not given in the environment are read from systemd credentials
        (`LoadCredential=hsm-user-pin:…`, `LoadCredentialEncrypted=`): files in
        $CREDENTIALS_DIRECTORY that only this service can read, kept off the data
        directory and out of the environment (docs/operations.md "The HSM PIN")."""
        creds = os.environ.get("CREDENTIALS_DIRECTORY")
        if not creds:
            return
        for field, name in (("hsm_user_pin", "hsm-user-pin"), ("hsm_so_pin", "hsm-so-pin")):
            path = Path(creds) / name
            if getattr(self, field) is None and path.is_file():
                pin = path.read_text().rstrip("\r\n")
                if not pin:
                    raise ValueError(f"the systemd credential {name} ({path}) is empty")
                setattr(self, field, pin)

    @property
    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'strongroom.db').resolve()}"

    @property
    def secure_cookies(self) -> bool:
        if self.cookie_secure is not None:
            return self.cookie_secure
        return not self.insecure_http

    @property
    def url(self) -> str:
        """The REST/console port's URL as users reach it."""
        if self.public_url:
            return self.public_url.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'http' if self.insecure_http else 'https'}://{host}:{self.port}"

    def hsm_config(self) -> HsmConfig:
        """HSM settings; in the local environment, PINs are generated once and kept
        (mode 0600) in the data directory so the embedded default needs no set-up."""
        user_pin, so_pin = self.hsm_user_pin, self.hsm_so_pin
        token_dir = self.hsm_softhsm_token_dir
        if self.environment == "local":
            if user_pin is None or so_pin is None:
                local = self._local_pins()
                user_pin = user_pin or local["user_pin"]
                so_pin = so_pin or local["so_pin"]
            if token_dir is None and self.hsm_module == SOFTHSM_MODULE and "SOFTHSM2_CONF" not in os.environ:
                token_dir = self.data_dir / "tokens"
        assert user_pin is not None and so_pin is not None
        return HsmConfig(
            module_path=self.hsm_module,
            token_label=self.hsm_token_label,
            user_pin=user_pin,
            so_pin=so_pin,
            softhsm_token_dir=token_dir.resolve() if token_dir else None,
            pool_size=self.hsm_pool_size,
        )

    def _local_pins(self) -> dict[str, str]:
        path = self.data_dir / "hsm-pins.json"
        if path.exists():
            return dict(json.loads(path.read_text()))
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        pins = {"user_pin": secrets.token_urlsafe(18), "so_pin": secrets.token_urlsafe(18)}
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(pins, f)
        return pins


def from_network(addr: str, networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]) -> bool:
    """Whether the peer address `addr` lies in one of `networks` (a malformed one: no)."""
    if not networks:
        return False
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return False
    return any(ip in n for n in networks)


# --- bad settings, said plainly -------------------------------------------------------------
_SECRET_PARTS = ("pin", "secret", "password")


def settings_problems(exc: ValidationError) -> list[str]:
    """One line per bad setting: `STRONGROOM_X='value': problem; expected form`. Values of
    secrets are not repeated."""
    lines: list[str] = []
    for error in exc.errors(include_url=False):
        loc = error["loc"]
        if not loc:  # a rule across settings: its message names the variables
            lines.append(str(error["msg"]).removeprefix("Value error, "))
            continue
        name = str(loc[0])
        variable = f"STRONGROOM_{name.upper()}"
        where = f" (item {', '.join(str(x) for x in loc[1:])})" if len(loc) > 1 else ""
        shown = ""
        if len(loc) == 1 and not any(part in name for part in _SECRET_PARTS):
            text = str(error.get("input"))
            shown = f"={text[:60]!r}" + ("…" if len(text) > 60 else "")
        field = Settings.model_fields.get(name)
        expected = f"; expected {_expected(field)}" if field is not None and len(loc) == 1 else ""
        lines.append(f"{variable}{shown}{where}: {_problem(error)}{expected}")
    return lines


def _unparsed(message: str) -> str:
    found = re.search(r'field "([a-z0-9_]+)"', message)
    field = Settings.model_fields.get(found.group(1)) if found else None
    if found is None or field is None:
        return message
    return f"STRONGROOM_{found.group(1).upper()}: not valid JSON; expected {_expected(field)}"


def _problem(error: Any) -> str:
    ctx = error.get("ctx") or {}
    kind = error["type"]
    if kind == "int_parsing":
        return "not a whole number"
    if kind in ("float_parsing", "int_from_float"):
        return "not a number" if kind == "float_parsing" else "not a whole number"
    if kind == "bool_parsing":
        return "not true or false"
    if kind == "literal_error":
        return "not one of the allowed values"
    if kind == "json_invalid":
        return "not valid JSON"
    limits = {"less_than_equal": ("too large", "at most", "le"), "less_than": ("too large", "below", "lt"),
              "greater_than_equal": ("too small", "at least", "ge"), "greater_than": ("too small", "above", "gt")}
    if kind in limits:
        what, rule, bound = limits[kind]
        return f"{what} (it must be {rule} {ctx.get(bound):g})"
    return str(error["msg"]).removeprefix("Value error, ").rstrip(".")


def _expected(field: FieldInfo) -> str:
    """The form a setting takes, from its type and bounds."""
    annotation = field.annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Union or type(annotation).__name__ == "UnionType":
        annotation = args[0] if len(args) == 1 else annotation
        args = list(typing.get_args(annotation))
    bounds = {k: getattr(m, k) for m in field.metadata for k in ("ge", "gt", "le", "lt") if hasattr(m, k)}
    low = f"from {bounds['ge']:g}" if "ge" in bounds else f"above {bounds['gt']:g}" if "gt" in bounds else ""
    high = f"to {bounds['le']:g}" if "le" in bounds else f"below {bounds['lt']:g}" if "lt" in bounds else ""
    span = " ".join(x for x in (low, high) if x)
    if annotation is int:
        return "a whole number" + (f" {span}" if span else "")
    if annotation is float:
        return "a number" + (f" {span}" if span else "")
    if annotation is bool:
        return "true or false"
    if typing.get_origin(annotation) is Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(annotation))
    if typing.get_origin(annotation) is list:
        return "a JSON list, e.g. [\"a\", \"b\"]"
    if typing.get_origin(annotation) is dict:
        return "a JSON object, e.g. {\"name\": value}"
    if annotation is Path:
        return "a file system path"
    return "a text value"
