"""Java 17's SunPKCS11 provider on the module (tests/pkcs11/java/StrongroomP11.java, compiled
here with the machine's javac): the key store opened with the PIN of an identity whose key
is encrypted, an AES-GCM round trip with a key found by its alias, RSA signatures from a
key pair generated through the provider — checked here, outside Java, with the key
material (over KMIP) and the public key Java reports."""

from __future__ import annotations

import base64
import hashlib
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from keyserver.core.keys import KeySpec
from keyserver.core.principal import system_context
from keyserver.services import Services
from tests.kmip.conftest import make_client
from tests.pkcs11.conftest import APP_GROUP, P11, run

SOURCE = Path(__file__).parent / "java" / "StrongroomP11.java"


@pytest.fixture(scope="session")
def java_classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert shutil.which("javac") and shutil.which("java"), "Java 17 (javac, java) is needed: scripts/test installs it"
    out = tmp_path_factory.mktemp("java")
    done = run(["javac", "-d", str(out), str(SOURCE)], env={"PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.returncode == 0
    return out


@pytest.fixture(scope="session")
def java_run(p11: P11, services: Services, java_classes: Path, conf_for: Callable[..., Path],
             tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    """One run of the program: the alias of the AES key it used, and its result lines."""
    alias = f"java-aes-{uuid.uuid4().hex[:8]}"
    services.keys.create(system_context("tests"), KeySpec(name=alias, kmip_group=APP_GROUP))  # the app's group
    java_conf = tmp_path_factory.mktemp("sunpkcs11") / "sunpkcs11.cfg"
    java_conf.write_text(f"name = Strongroom\nlibrary = {p11.module}\nslotListIndex = 0\n")
    done = run(["java", "-cp", str(java_classes), "StrongroomP11", str(java_conf), str(p11.locked.pin), alias],
               env=p11.env(conf_for(p11.locked)), timeout=120)
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert lines.get("done") == "ok", done.stdout + done.stderr
    return alias, lines


def test_java_sunpkcs11(p11: P11, services: Services, java_run: tuple[str, dict[str, str]]) -> None:
    alias, lines = java_run
    assert lines["provider"] == "SunPKCS11-Strongroom"
    assert alias in lines["aliases"].split(",")
    assert lines["aes-algorithm"] == "AES"
    assert lines["gcm-roundtrip"] == "ok"

    # the ciphertext Java got is AES-GCM under Strongroom's key
    version = services.keys.get(system_context("tests"), alias).versions[-1]
    kmip = make_client(p11.user.files, p11.port)
    kmip.open()
    try:
        material = kmip.get(str(version.id)).value
    finally:
        kmip.close()
    data = base64.b64decode(lines["gcm-data"])
    assert AESGCM(material).decrypt(bytes.fromhex(lines["gcm-iv"]), bytes.fromhex(lines["gcm-ciphertext"]),
                                    b"table=ledger") == data

    public = serialization.load_der_public_key(base64.b64decode(lines["rsa-public"]))
    assert isinstance(public, rsa.RSAPublicKey) and public.key_size == 2048
    public.verify(base64.b64decode(lines["rsa-pkcs1-signature"]), data, padding.PKCS1v15(), hashes.SHA256())


def test_java_rsassa_pss(java_run: tuple[str, dict[str, str]]) -> None:
    """SunPKCS11's RSASSA-PSS (it needs the token's CKM_SHA256), verified outside Java;
    Java's SHA-256 from the token is the module's local digest."""
    _, lines = java_run
    assert "rsa-pss-error" not in lines, lines.get("rsa-pss-error")
    assert lines["sha256-provider"] == "SunPKCS11-Strongroom"
    assert base64.b64decode(lines["sha256"]) == hashlib.sha256(base64.b64decode(lines["gcm-data"])).digest()
    public = serialization.load_der_public_key(base64.b64decode(lines["rsa-public"]))
    assert isinstance(public, rsa.RSAPublicKey)
    public.verify(base64.b64decode(lines["rsa-pss-signature"]), base64.b64decode(lines["gcm-data"]),
                  padding.PSS(padding.MGF1(hashes.SHA256()), 32), hashes.SHA256())


def test_java_with_a_wrong_pin_is_refused(p11: P11, java_classes: Path, conf_for: Callable[..., Path],
                                          tmp_path: Path) -> None:
    java_conf = tmp_path / "sunpkcs11.cfg"
    java_conf.write_text(f"name = Strongroom\nlibrary = {p11.module}\nslotListIndex = 0\n")
    done = run(["java", "-cp", str(java_classes), "StrongroomP11", str(java_conf), "not the pin", "none"],
               env=p11.env(conf_for(p11.locked)), timeout=120, check=False)
    assert done.returncode != 0
    assert "CKR_PIN_INCORRECT" in done.stderr
