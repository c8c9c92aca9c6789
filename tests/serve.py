"""`keyserver serve` in its own process, as `scripts/start` runs it, for the tests that
drive the product only from outside. Its output is collected by a thread (it is not a
terminal: as under a service manager), so a test never blocks on a line that does not
come."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

import httpx

from kmsbench.ports import free_port

KEYSERVER = str(Path(sys.executable).with_name("keyserver"))



def eventually(check: Callable[[], object], what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def server_env(data: Path, port: int, **extra: str) -> dict[str, str]:
    """This environment without the caller's STRONGROOM_* settings: a fresh embedded
    default in `data`, on free ports (runs may overlap)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STRONGROOM_", "SOFTHSM2_CONF"))}
    env.update(STRONGROOM_DATA_DIR=str(data), STRONGROOM_PORT=str(port), STRONGROOM_AGENT_PORT=str(free_port()),
               STRONGROOM_KMIP_PORT="0", STRONGROOM_LOG_LEVEL="WARNING")
    env.update(extra)  # the caller's settings win over these defaults
    return env


class Server:
    """A throwaway key server: `keyserver serve ARGS` on `data`, on free ports, with `env`
    over a clean environment. The one way the tests start one; a subclass runs another
    server (a previous release's tree: test_upgrade) by setting `command`, `cwd`,
    `plain_http` (it serves HTTP without being asked) and `ready_path`."""

    command: Sequence[str] = (KEYSERVER, "serve")
    cwd: Path | None = None
    plain_http = False
    ready_path = "/readyz"

    def __init__(self, data: Path, *args: str, **env: str) -> None:
        self.data, self.port = data, free_port()
        self.env = server_env(data, self.port, **env)
        self.insecure = self.plain_http or "--insecure-http" in args or env.get("STRONGROOM_INSECURE_HTTP") == "true"
        self.url = f"{'http' if self.insecure else 'https'}://127.0.0.1:{self.port}"
        self.cli = KEYSERVER
        self.proc = subprocess.Popen([*self.command, *args], cwd=self.cwd, env=self.env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def tls(self) -> ssl.SSLContext | bool:
        """What a client verifies this server with: its data directory's ca.pem."""
        return False if self.insecure else ssl.create_default_context(cafile=str(self.data / "ca.pem"))

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, verify=self.tls(), timeout=30, **kwargs)  # type: ignore[arg-type]

    def ready(self) -> bool:
        assert self.proc.poll() is None, f"keyserver serve exited with {self.proc.returncode}:\n{self.output}"
        if not self.insecure and not (self.data / "ca.pem").exists():
            return False
        try:
            return httpx.get(f"{self.url}{self.ready_path}", verify=self.tls(), timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def __enter__(self) -> Server:
        try:
            eventually(self.ready, "the key server to be ready")
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
