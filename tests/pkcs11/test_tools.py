"""OpenSC's pkcs11-tool and GnuTLS's p11tool on the module: tokens and objects listed,
keys generated, data encrypted and decrypted, signatures made and verified by the tool,
and verified again outside it (cryptography) on the public key the tool exports."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest
from cryptography.hazmat.primitives import hashes, padding, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric import padding as asym
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from keyserver.core.principal import system_context
from keyserver.services import Services
from tests.kmip.conftest import make_client
from tests.pkcs11.conftest import P11, run

SPY = "/usr/lib/x86_64-linux-gnu/pkcs11/pkcs11-spy.so"  # OpenSC (opensc-pkcs11), beside pkcs11-tool
DATA = b"invoice 2026-11-26 no. 4711, total 1,234.56 EUR\n"


def id_of(listing: str) -> str:
    """The CKA_ID (hex) pkcs11-tool printed for the object it made. Operations select keys
    by --id: pkcs11-tool 0.23 takes --label for finding an object to read, but for
    --sign/--encrypt it takes the first key of the class unless --id is given."""
    ids = set(re.findall(r"^\s*ID:\s+([0-9a-f]+)$", listing, re.M))
    assert len(ids) == 1, listing
    return str(ids.pop())


@pytest.fixture
def tool(p11: P11, conf_for: Callable[..., Path]) -> Callable[..., str]:
    """pkcs11-tool on the module, slot 0 = the `user` identity (no login)."""
    env = p11.env(conf_for(p11.user))

    def call(*args: str) -> str:
        return run(["pkcs11-tool", "--module", str(p11.module), *args], env=env).stdout

    return call


def test_pkcs11_tool_lists_the_token_and_its_objects(tool: Callable[..., str], p11: P11,
                                                      make_key: Callable[..., str]) -> None:
    listed = tool("-L")
    assert f"token label        : {p11.user.label}" in listed
    name = make_key("tool-listed")
    objects = tool("-O")
    assert "Secret Key Object; AES length 32" in objects
    assert f"label:      {name}" in objects


def test_pkcs11_tool_keygen_and_aes_cbc_pad(tool: Callable[..., str], p11: P11, services: Services,
                                             tmp_path: Path) -> None:
    name = f"tool-aes-{uuid.uuid4().hex[:8]}"
    # --sensitive: CKA_SENSITIVE true, a key not exportable in plaintext (its Strongroom policy)
    closed = tool("--keygen", "--key-type", "AES:16", "--sensitive", "--label", f"{name}-closed")
    assert "Access:     sensitive" in closed and "VALUE:" not in closed
    assert not services.keys.get(system_context("tests"), f"{name}-closed").exportable
    # pkcs11-tool's default template says CKA_SENSITIVE false: an exportable key, whose value
    # pkcs11-tool then reads and prints (a plaintext Get, audited key.export)
    out = tool("--keygen", "--key-type", "AES:32", "--label", name)
    assert "Secret Key Object; AES length 32" in out and "Access:     extractable" in out
    assert "sensitive" not in out
    key_id = id_of(out)
    key = services.keys.get(system_context("tests"), name)  # a Strongroom key now
    assert (key.algorithm, key.length_bits, key.exportable) == ("AES", 256, True)
    plain, sealed, opened = tmp_path / "plain", tmp_path / "sealed", tmp_path / "opened"
    plain.write_bytes(DATA)
    iv = os.urandom(16)
    tool("--encrypt", "-m", "AES-CBC-PAD", "--iv", iv.hex(), "--id", key_id, "-i", str(plain), "-o", str(sealed))
    tool("--decrypt", "-m", "AES-CBC-PAD", "--iv", iv.hex(), "--id", key_id, "-i", str(sealed), "-o", str(opened))
    assert opened.read_bytes() == DATA and sealed.read_bytes() != DATA
    # outside: the ciphertext is AES-256-CBC + PKCS#7 under the key Strongroom holds
    kmip = make_client(p11.user.files, p11.port)
    kmip.open()
    try:
        material = kmip.get(str(key.versions[-1].id)).value
    finally:
        kmip.close()
    assert material.hex() in out.replace(" ", "")  # the value pkcs11-tool read is the server's
    decryptor = Cipher(algorithms.AES(material), modes.CBC(iv)).decryptor()
    unpadder = padding.PKCS7(128).unpadder()
    padded = decryptor.update(sealed.read_bytes()) + decryptor.finalize()
    assert unpadder.update(padded) + unpadder.finalize() == DATA


@pytest.mark.parametrize(("key_type", "mechanism"), [("rsa:2048", "SHA256-RSA-PKCS-PSS"),
                                                      ("rsa:2048", "SHA256-RSA-PKCS"),
                                                      ("EC:prime256v1", "ECDSA-SHA256")])
def test_pkcs11_tool_keypairgen_sign_verify(tool: Callable[..., str], tmp_path: Path, key_type: str,
                                            mechanism: str) -> None:
    name = f"tool-pair-{uuid.uuid4().hex[:8]}"
    out = tool("--keypairgen", "--key-type", key_type, "--label", name)
    assert "Private Key Object" in out and "Public Key Object" in out
    key_id = id_of(out)  # the pair's halves share it
    data, sig, pub = tmp_path / "data", tmp_path / "sig", tmp_path / "pub.der"
    data.write_bytes(DATA)
    fmt = ["-f", "openssl"] if mechanism.startswith("ECDSA") else []
    tool("--sign", "-m", mechanism, *fmt, "--id", key_id, "-i", str(data), "-o", str(sig))
    assert "Signature is valid" in tool("--verify", "-m", mechanism, *fmt, "--id", key_id, "-i", str(data),
                                        "--signature-file", str(sig))
    tool("--read-object", "--type", "pubkey", "--id", key_id, "-o", str(pub))
    public = serialization.load_der_public_key(pub.read_bytes())
    signature = sig.read_bytes()
    if isinstance(public, rsa.RSAPublicKey):
        assert public.key_size == 2048
        pad = (asym.PSS(asym.MGF1(hashes.SHA256()), 32) if mechanism.endswith("PSS") else asym.PKCS1v15())
        public.verify(signature, DATA, pad, hashes.SHA256())
    else:
        assert isinstance(public, ec.EllipticCurvePublicKey) and public.curve.name == "secp256r1"
        public.verify(signature, DATA, ec.ECDSA(hashes.SHA256()))


@pytest.fixture
def p11tool(p11: P11, conf_for: Callable[..., Path]) -> Callable[..., str]:
    env = p11.env(conf_for(p11.user))

    def call(*args: str) -> str:
        done = run(["p11tool", "--provider", str(p11.module), "--batch", *args], env=env)
        return done.stdout + done.stderr  # --test-sign reports on stderr

    return call


def token_url(p11: P11) -> str:
    return f"pkcs11:token={quote(p11.user.label)}"


def test_p11tool_lists_tokens_and_objects_and_signs(p11tool: Callable[..., str], tool: Callable[..., str],
                                                    p11: P11, make_key: Callable[..., str]) -> None:
    tokens = p11tool("--list-tokens")
    assert f"Label: {p11.user.label}" in tokens
    assert f"token={quote(p11.user.label)}" in tokens  # in the token's URL
    aes = make_key("p11tool-aes")
    pair = f"p11tool-rsa-{uuid.uuid4().hex[:8]}"
    tool("--keypairgen", "--key-type", "rsa:2048", "--label", pair)
    listed = p11tool("--list-all", token_url(p11))
    assert f"Label: {aes}" in listed and f"Label: {pair}" in listed
    assert "Type: Secret key" in listed and "Type: Private key" in listed and "Type: Public key" in listed
    tested = p11tool("--test-sign", f"{token_url(p11)};object={quote(pair)};type=private")
    assert "Signing using RSA-SHA256... ok" in tested
    assert "Verifying against public key in the token... ok" in tested
    assert "fail" not in tested.lower()


def test_pkcs11_tool_reads_an_exportable_value_only_with_the_export_right(
        tool: Callable[..., str], p11: P11, conf_for: Callable[..., Path], services: Services,
        make_key: Callable[..., str], tmp_path: Path) -> None:
    """--read-object of an exportable key: the `user` identity gets the server's bytes; the
    `noexport` identity gets CKR_ATTRIBUTE_SENSITIVE from C_GetAttributeValue (seen
    through OpenSC's pkcs11-spy, which logs every call's return code)."""
    name = make_key("tool-read")
    args = ["--read-object", "--type", "secrkey", "--label", name]
    value = tmp_path / "value"
    tool(*args, "-o", str(value))
    key = services.keys.get(system_context("tests"), name)
    kmip = make_client(p11.user.files, p11.port)
    kmip.open()
    try:
        assert value.read_bytes() == kmip.get(str(key.versions[-1].id)).value
    finally:
        kmip.close()
    spy_log = tmp_path / "spy.log"
    done = run(["pkcs11-tool", "--module", SPY, *args],
               env=p11.env(conf_for(p11.noexport), PKCS11SPY=str(p11.module), PKCS11SPY_OUTPUT=str(spy_log)),
               check=False)
    assert done.returncode != 0 and "get CKA_VALUE failed" in done.stderr
    calls = spy_log.read_text().split("\n\n")
    reads = [c for c in calls if "C_GetAttributeValue" in c and "CKA_VALUE " in c]
    assert reads and "CKR_ATTRIBUTE_SENSITIVE" in reads[-1], reads[-1:]
