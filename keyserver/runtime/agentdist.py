"""The agent package a host installs: a wheel of `agents/`, built by the key server from
its own copy of the agent's sources, so the agent a host downloads always matches the
server that serves it (docs/decisions/0007-agent-port-and-distribution.md).

The wheel is assembled in memory, reproducibly (sorted entries, fixed timestamps): every
worker serves the same bytes, and the installer checks them against the SHA-256 it was
given over the same pinned-CA connection.

It carries the compiled format engine, `agents/dataplane/build/libsrcf.so`, the guard
points' data plane, `agents/dataplane/fuse/strongroom-fuse` (libsrcf compiled in), and the
volumes' userspace data plane, `agents/dataplane/volume/strongroom-volume`, as built
on this server (`scripts/start` builds them): hosts of the server's architecture with glibc
and OpenSSL 3 use it with no compiler of their own; on any other host the agent says
why it cannot load it and uses the Python reference (docs/agents.md). The wheel stays
`py3-none-any` so that every host can install the agent.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import logging
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

DIST_NAME = "strongroom-agent"
REQUIRES = ["cryptography>=46", "httpx>=0.28", "typer>=0.16", "rich>=14"]
ENTRY_POINTS = "[console_scripts]\nkms-agent = agents.cli:main\n"
_EPOCH = (2026, 1, 1, 0, 0, 0)  # zip entries need a date; a fixed one keeps builds identical
NATIVE_LIBRARY = "dataplane/build/libsrcf.so"  # inside the agents package (agents/cryptfile/native.py)
# The native daemons, each with what a host cannot do without it.
DATA_PLANES = {
    "dataplane/fuse/strongroom-fuse": "serve guard points",  # agents/guardpoint/dataplane.py
    "dataplane/volume/strongroom-volume": "open volumes without dm-crypt",  # agents/volume/manager.py
}

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AgentWheel:
    filename: str
    version: str
    data: bytes
    sha256: str


def _agents_dir() -> Path:
    spec = importlib.util.find_spec("agents")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the agents package is not installed beside the key server")
    return Path(next(iter(spec.submodule_search_locations)))


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(source: Path | None = None) -> AgentWheel:
    """A PEP 427 wheel of the agent package found at `source` (default: `agents/`)."""
    import agents

    root = source or _agents_dir()
    version = agents.__version__
    dist_info = f"{DIST_NAME.replace('-', '_')}-{version}.dist-info"
    files: list[tuple[str, bytes]] = [
        (f"agents/{p.relative_to(root).as_posix()}", p.read_bytes())
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.suffix in (".py", ".md") and "__pycache__" not in p.parts
    ]
    native = root / NATIVE_LIBRARY
    if native.is_file():
        files.append((f"agents/{NATIVE_LIBRARY}", native.read_bytes()))
    else:
        log.warning("agent wheel without the compiled format engine: %s is not built "
                    "(make -C agents/dataplane lib); hosts will use the Python reference", native)
    for plane, purpose in DATA_PLANES.items():
        daemon = root / plane
        if daemon.is_file():
            files.append((f"agents/{plane}", daemon.read_bytes()))
        else:
            log.warning("agent wheel without %s: it is not built (make -C %s); hosts cannot %s", daemon,
                        daemon.parent, purpose)
    files.sort()
    metadata = "\n".join([
        "Metadata-Version: 2.1", f"Name: {DIST_NAME}", f"Version: {version}",
        "Summary: Strongroom host agent: encrypted files, guard points, key delivery over mutual TLS",
        "License: Apache-2.0", "Requires-Python: >=3.11", *(f"Requires-Dist: {r}" for r in REQUIRES), "",
    ])
    wheel = "Wheel-Version: 1.0\nGenerator: strongroom-keyserver\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files += [(f"{dist_info}/METADATA", metadata.encode()), (f"{dist_info}/WHEEL", wheel.encode()),
              (f"{dist_info}/entry_points.txt", ENTRY_POINTS.encode())]
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files)
    files.append((f"{dist_info}/RECORD", (record + f"{dist_info}/RECORD,,\n").encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in files:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = (0o755 if name.removeprefix("agents/") in DATA_PLANES else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    data = buf.getvalue()
    filename = f"{DIST_NAME.replace('-', '_')}-{version}-py3-none-any.whl"
    return AgentWheel(filename, version, data, hashlib.sha256(data).hexdigest())


_lock = threading.Lock()
_cached: AgentWheel | None = None


def agent_wheel() -> AgentWheel:
    """Built once per process, on first use."""
    global _cached
    with _lock:
        if _cached is None:
            _cached = build_wheel()
        return _cached
