"""The agent's configuration: one TOML file, written by the installer.

```toml
server_url = "https://keys.example.com:8443"   # the key server's agent port
ca_file = "/etc/strongroom-agent/server-ca.pem" # pinned for enrollment
state_dir = "/var/lib/strongroom-agent"         # host key (0600), certificates, event spool
key_cache_ttl_seconds = 300                     # keep working this long through a server outage
key_cache_max_entries = 1024
request_timeout_seconds = 10
chunk_size = 4096                               # of files this host encrypts
run_dir = "/run/strongroom-agent"               # open volumes' mounts and state (gone at reboot)
volumes_file = "/etc/strongroom-agent/volumes.tab"  # volumes opened at boot (docs/volumes.md)
```
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from agents.cryptfile.header import check_chunk_size
from agents.errors import AgentError, Exit

DEFAULT_CONFIG = Path("/etc/strongroom-agent/agent.toml")
CONFIG_ENV = "STRONGROOM_AGENT_CONFIG"


class ConfigError(AgentError):
    """The configuration file is missing or wrong; the message says which line to fix."""

    exit_status = Exit.USAGE


def _flag(raw: dict[str, Any], name: str, default: bool, path: Path) -> bool:
    value = raw.get(name, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{path}: '{name}' must be true or false, not {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class AgentConfig:
    server_url: str
    ca_file: Path
    state_dir: Path
    key_cache_ttl_seconds: float = 300.0
    key_cache_max_entries: int = 1024
    request_timeout_seconds: float = 10.0
    chunk_size: int = 4096
    run_dir: Path = Path("/run/strongroom-agent")
    volumes_file: Path = Path("/etc/strongroom-agent/volumes.tab")
    # Guard points' FUSE transport (docs/guardpoints.md, "Transport"). The writeback cache
    # makes write() return once the kernel has the data (fsync and close still reach the
    # backing file); off keeps the older rule that a returned write() survives a crash of
    # the data plane. io_uring is a host-wide kernel switch: true sets
    # /sys/module/fuse/parameters/enable_uring for every FUSE file system on the host.
    fuse_writeback_cache: bool = True
    fuse_io_uring: bool = False

    @property
    def spool_dir(self) -> Path:
        return self.state_dir / "spool"

    @classmethod
    def load(cls, path: Path | None = None) -> AgentConfig:
        path = path or Path(os.environ.get(CONFIG_ENV, DEFAULT_CONFIG))
        try:
            raw: dict[str, Any] = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"no agent configuration at {path}: install the agent with the key server's "
                              f"install.sh, or pass --config") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"{path}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        for required in ("server_url", "ca_file", "state_dir"):
            if not isinstance(raw.get(required), str) or not raw[required]:
                raise ConfigError(f"{path}: '{required}' must be set (a string)")
        if not raw["server_url"].startswith("https://"):
            raise ConfigError(f"{path}: server_url must be an https:// URL (the key server's agent port)")
        try:
            config = cls(server_url=raw["server_url"].rstrip("/"), ca_file=Path(raw["ca_file"]),
                         state_dir=Path(raw["state_dir"]),
                         key_cache_ttl_seconds=float(raw.get("key_cache_ttl_seconds", 300)),
                         key_cache_max_entries=int(raw.get("key_cache_max_entries", 1024)),
                         request_timeout_seconds=float(raw.get("request_timeout_seconds", 10)),
                         chunk_size=int(raw.get("chunk_size", 4096)),
                         run_dir=Path(raw.get("run_dir", "/run/strongroom-agent")),
                         volumes_file=Path(raw.get("volumes_file", "/etc/strongroom-agent/volumes.tab")),
                         fuse_writeback_cache=_flag(raw, "fuse_writeback_cache", True, path),
                         fuse_io_uring=_flag(raw, "fuse_io_uring", False, path))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
        if config.key_cache_ttl_seconds <= 0 or config.key_cache_max_entries < 1:
            raise ConfigError(f"{path}: key_cache_ttl_seconds must be > 0 and key_cache_max_entries >= 1")
        try:
            check_chunk_size(config.chunk_size)
        except ValueError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        return config
