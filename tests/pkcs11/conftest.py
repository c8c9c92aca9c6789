"""`libstrongroom-pkcs11.so` against the real KMIP listener of the test session, through
real PKCS#11 consumers (pkcs11-tool, p11tool, Java SunPKCS11, python-pkcs11).

The module is built with `make -C pkcs11module` (idempotent: a no-op when up to date).
One configuration file serves the whole session: python-pkcs11 initialises a module once
per process, so every identity a test in this process needs is a slot of it. Consumers
run as subprocesses get the same file through `STRONGROOM_PKCS11_CONF`.

The key server here has a store of its own (of the session's kind: `services` is
overridden for this directory): a token shows every object its identity may use, and
the rest of the suite leaves thousands in the session's store, which every listing
(`pkcs11-tool -O`, `p11tool --list-all`) would walk.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pkcs11
import pytest
from cryptography.hazmat.primitives import serialization

from hsm import HsmBackend
from keyserver.core.keys import KeySpec
from keyserver.core.principal import system_context
from keyserver.kmip.listener import KmipListener
from keyserver.kmip.server import build_listener
from keyserver.services import Services
from tests import parallel
from tests.conftest import own_services
from tests.kmip.conftest import ClientFiles, issue_client

ROOT = Path(__file__).resolve().parents[2]
MODULE_DIR = ROOT / "pkcs11module"
BUILD = MODULE_DIR / "build"
PIN = "correct horse battery staple"
CONF_ENV = "STRONGROOM_PKCS11_CONF"


APP_GROUP = "pkcs11-app"  # the KMIP tenancy group of the session's PKCS#11 identities


def make(*targets: str) -> None:
    done = parallel.make(MODULE_DIR, *targets)
    assert done.returncode == 0, f"make -C pkcs11module {' '.join(targets)} failed:\n{done.stdout}\n{done.stderr}"


@dataclass(frozen=True)
class Token:
    """One slot of the configuration: an identity issued by Strongroom's CA."""
    label: str
    files: ClientFiles
    pin: str | None  # the passphrase of an encrypted key: the token requires login


@dataclass(frozen=True)
class P11:
    module: Path
    conf: Path
    user: Token          # kmip-client, may export in plaintext; key unencrypted (no login)
    locked: Token        # kmip-client whose key is encrypted: login with PIN
    noexport: Token      # kmip-client whose key_export is "none"
    outage: Token        # the same kind as `user`, on a listener a test stops
    outage_listener: KmipListener
    port: int

    def env(self, conf: Path | None = None, **extra: str) -> dict[str, str]:
        return {**os.environ, CONF_ENV: str(conf or self.conf), **extra}


def encrypt_key_file(files: ClientFiles, directory: Path, passphrase: str) -> ClientFiles:
    """The issued identity with its private key re-encrypted under `passphrase` (PKCS#8,
    as `openssl pkcs8 -topk8 -v2 aes-256-cbc` writes it)."""
    key = serialization.load_pem_private_key(files.key.read_bytes(), password=None)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "key-encrypted.pem"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.BestAvailableEncryption(passphrase.encode())))
    return ClientFiles(files.name, files.client_id, files.cert, path, files.ca)


def write_conf(path: Path, slots: list[tuple[Token, int]]) -> Path:
    lines: list[str] = []
    for token, port in slots:
        lines += ["[slot]", f"label = {token.label}", f"server = localhost:{port}", f"ca = {token.files.ca}",
                  f"cert = {token.files.cert}", f"key = {token.files.key}", ""]
    path.write_text("\n".join(lines))
    return path


@pytest.fixture(scope="session")
def module_path() -> Path:
    make()
    path = BUILD / "libstrongroom-pkcs11.so"
    assert path.is_file(), f"make -C pkcs11module did not leave {path}"
    return path


@pytest.fixture(scope="session")
def services(hsm_backend: HsmBackend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """Initialised services on a store of their own, of the session's kind, with the
    session's token."""
    with own_services(tmp_path_factory.mktemp("pkcs11-data"), hsm_backend) as svc:
        yield svc


@pytest.fixture(scope="session")
def kmip_listener(services: Services) -> Iterator[KmipListener]:
    """The session's KMIP listener (as tests/kmip starts it), on a free port."""
    listener = build_listener(services, port=0)
    listener.start()
    yield listener
    listener.stop()


@pytest.fixture(scope="session")
def p11(services: Services, kmip_listener: KmipListener, module_path: Path,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[P11]:
    directory = tmp_path_factory.mktemp("pkcs11")
    ctx = system_context("tests")
    # One application's identities: one KMIP tenancy group, which make_key's keys are in.
    user = issue_client(services, directory, "kmip-client", APP_GROUP)
    noexport = issue_client(services, directory, "kmip-client", APP_GROUP)
    services.kmip_clients.update(ctx, uuid.UUID(noexport.client_id), key_export="none")
    plain_locked = issue_client(services, directory, "kmip-client", APP_GROUP)
    locked = encrypt_key_file(plain_locked, directory / plain_locked.name / "enc", PIN)
    outage_files = issue_client(services, directory, "kmip-client", APP_GROUP)
    outage_listener = build_listener(services, port=0)
    outage_listener.start()
    tokens = {"user": Token("strongroom app", user, None), "locked": Token("strongroom locked", locked, PIN),
              "noexport": Token("strongroom no-export", noexport, None),
              "outage": Token("strongroom outage", outage_files, None)}
    conf = write_conf(directory / "strongroom-pkcs11.conf", [
        (tokens["user"], kmip_listener.port), (tokens["locked"], kmip_listener.port),
        (tokens["noexport"], kmip_listener.port), (tokens["outage"], outage_listener.port)])
    previous = os.environ.get(CONF_ENV)
    os.environ[CONF_ENV] = str(conf)
    try:
        yield P11(module=module_path, conf=conf, outage_listener=outage_listener, port=kmip_listener.port,
                  **tokens)
    finally:
        outage_listener.stop()
        if previous is None:
            os.environ.pop(CONF_ENV, None)
        else:
            os.environ[CONF_ENV] = previous


@pytest.fixture(scope="session")
def conf_for(p11: P11, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """A configuration file with only the given tokens (slot 0 is the first), for the
    consumers that take the first slot."""
    directory = tmp_path_factory.mktemp("pkcs11-conf")

    def build(*tokens: Token) -> Path:
        return write_conf(directory / f"{uuid.uuid4().hex[:8]}.conf", [(t, p11.port) for t in tokens])

    return build


@pytest.fixture(scope="session")
def lib(p11: P11) -> Any:
    """python-pkcs11 on the module, in this process (its calls release the GIL, so the
    listener's threads serve them)."""
    return pkcs11.lib(str(p11.module))


@pytest.fixture
def session(lib: Any, p11: P11) -> Iterator[Any]:
    """A read/write session on the `user` token."""
    token = lib.get_token(token_label=p11.user.label)
    with token.open(rw=True) as s:
        yield s


@pytest.fixture
def make_key(services: Services) -> Callable[..., str]:
    """A managed AES key created in Strongroom (as an operator would, for the application's
    KMIP group), by name."""

    def create(prefix: str, **spec: Any) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        services.keys.create(system_context("tests"), KeySpec(name=name, **{"kmip_group": APP_GROUP, **spec}))
        return name

    return create


def run(args: list[str], *, env: dict[str, str], timeout: float = 60, stdin: bytes | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, check=False,
                          input=stdin.decode() if stdin is not None else None)
    if check:
        assert done.returncode == 0, f"{' '.join(args)} → {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done
