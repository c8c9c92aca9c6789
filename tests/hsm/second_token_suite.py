"""The HSM layer against a second real PKCS#11 implementation: openCryptoki's soft token.

Not collected on its own (no `test_` prefix): `tests/hsm/test_second_token.py` runs it
with pytest inside `tests.hsm.opencryptoki_sandbox`, which starts `pkcsslotd` and a fresh
token in namespaces of their own and describes it in `STRONGROOM_TEST_OCK_*`.

What runs here: the conformance tests whose mechanisms the token has, the capability
record's choices (OAEP-SHA-256, checked against the token and against a blob made with
`cryptography`), the unwrapped keys' attributes (the token ignores them in the template,
decision 0018), AES-CBC and HMAC inside the token against software, threads, and the
services the token cannot offer refused with the mechanism named.
"""

# ruff: noqa: F811 - the conformance fixtures are imported by name, then asked for by tests

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator

import pytest
from cryptography.hazmat.primitives import hashes, hmac, padding, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from pkcs11 import Attribute
from pkcs11 import exceptions as p11

from hsm.backend import AES_CBC_PAD, AES_GCM, RSA_OAEP_SHA1, RSA_OAEP_SHA256, WrappedKey
from hsm.config import HsmConfig
from hsm.errors import HsmConfigError, HsmIntegrityError, HsmKeyNotFound, HsmUnavailable
from hsm.pkcs11 import Pkcs11Backend, open_backend
from tests.hsm.conformance import (  # noqa: F401 - collected here, against this token
    kek,
    oaep_padding,
    other_kek,
    recipient,
    test_check_passes_on_a_healthy_token,
    test_create_kek_returns_its_rsa_2048_public_key,
    test_duplicate_kek_is_refused,
    test_generated_key_is_wrapped_under_the_kek,
    test_generated_key_unwraps_with_the_kek_public_key_scheme,
    test_generated_keys_differ,
    test_hmac_key_is_created_once_and_is_deterministic,
    test_hmac_keys_are_distinct,
    test_hmac_with_missing_key,
    test_import_refuses_bad_lengths,
    test_import_then_unwrap_round_trips,
    test_integrity_errors_are_opaque,
    test_is_an_hsm_backend,
    test_kek_private_half_is_locked_down,
    test_list_keks_is_sorted_and_complete,
    test_malformed_kek_id_is_invalid_input,
    test_random_has_the_requested_length,
    test_random_is_not_repeating,
    test_random_refuses_negative,
    test_rewrap_for_a_4096_bit_recipient,
    test_rewrap_for_public_key_reaches_the_recipient,
    test_rewrap_for_public_key_refuses_unusable_keys,
    test_rewrap_for_public_key_with_a_tampered_blob,
    test_rewrap_under_kek_keeps_the_key,
    test_rewrap_under_kek_moves_hmac_keys_of_any_length,
    test_rewrap_under_kek_unhappy_paths,
    test_unknown_kek_is_not_found,
    test_unwrap_refuses_tampered_blobs,
    test_unwrap_under_the_wrong_kek_is_an_integrity_error,
    test_unwrap_with_unknown_kek_or_mechanism,
    wrapped,
)
from tests.hsm.test_services import (  # noqa: F401
    test_an_hmac_key_is_exported_only_through_unwrap_secret,
    test_hmac_in_the_token_matches_software,
)

OCK = "STRONGROOM_TEST_OCK_MODULE"
if OCK not in os.environ:  # run directly instead of through test_second_token.py
    raise RuntimeError("run through tests.hsm.opencryptoki_sandbox (tests/hsm/test_second_token.py)")


def ock_config(**overrides: object) -> HsmConfig:
    values: dict[str, object] = {
        "module_path": os.environ[OCK],
        "token_label": os.environ["STRONGROOM_TEST_OCK_LABEL"],
        "user_pin": os.environ["STRONGROOM_TEST_OCK_USER_PIN"],
        "so_pin": os.environ["STRONGROOM_TEST_OCK_SO_PIN"],
    }
    values.update(overrides)
    return HsmConfig(**values)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def backend() -> Iterator[Pkcs11Backend]:
    opened = open_backend(ock_config())
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def hsm_backend(backend: Pkcs11Backend) -> Pkcs11Backend:
    """The name test_services' tests ask for: the same openCryptoki backend."""
    return backend


def _public(backend: Pkcs11Backend, kek_id: str) -> rsa.RSAPublicKey:
    public = serialization.load_pem_public_key(backend.get_kek(kek_id).public_key_pem)
    assert isinstance(public, rsa.RSAPublicKey)
    return public


# --- the capability record ------------------------------------------------------------------
def test_the_token_is_opencryptokis_soft_token(backend: Pkcs11Backend) -> None:
    capabilities = backend.capabilities
    assert (capabilities.manufacturer, capabilities.model) == ("IBM Corp.", "IBM SoftTok")


def test_the_record_chooses_oaep_sha256_for_wrapping(backend: Pkcs11Backend) -> None:
    capabilities = backend.capabilities
    assert capabilities.rsa_wrap_mechanism == RSA_OAEP_SHA256
    assert capabilities.rsa_unwrap_mechanisms == frozenset({RSA_OAEP_SHA256, RSA_OAEP_SHA1})
    assert capabilities.unwrap_sets_attributes_after


def test_the_quirk_entry_agrees_with_the_real_token(backend: Pkcs11Backend) -> None:
    # Both round trips really work inside the token (the quirk entry skips the probe at open).
    assert backend.probe_oaep(RSA_OAEP_SHA256)
    assert backend.probe_oaep(RSA_OAEP_SHA1)


def test_the_record_says_which_services_the_token_lacks(backend: Pkcs11Backend) -> None:
    capabilities = backend.capabilities
    assert not capabilities.supports_aes_gcm
    assert not capabilities.supports_ecdsa
    assert not capabilities.supports_aes_key_wrap_pad
    assert capabilities.supports_hmac_sha256


def test_generated_keys_are_wrapped_with_oaep_sha256(backend: Pkcs11Backend, kek: str) -> None:
    generated = backend.generate_wrapped_key(kek_id=kek)
    assert generated.mechanism == RSA_OAEP_SHA256
    assert backend.rewrap_under_kek(generated, kek_id=kek).mechanism == RSA_OAEP_SHA256


def test_a_sha256_oaep_blob_made_outside_unwraps_in_the_token(backend: Pkcs11Backend, kek: str) -> None:
    material = os.urandom(32)
    blob = _public(backend, kek).encrypt(material, oaep_padding(RSA_OAEP_SHA256))
    assert backend.unwrap_key(WrappedKey(kek, RSA_OAEP_SHA256, blob)) == material
    # ...and is used inside the token: CBC under it matches software.
    out = backend.symmetric_cipher(WrappedKey(kek, RSA_OAEP_SHA256, blob), b"sixteen byte msg",
                                   encrypt=True, mode=AES_CBC_PAD)
    decryptor = Cipher(algorithms.AES(material), modes.CBC(out.iv)).decryptor()
    unpadder = padding.PKCS7(128).unpadder()
    plain = unpadder.update(decryptor.update(out.data) + decryptor.finalize()) + unpadder.finalize()
    assert plain == b"sixteen byte msg"


def test_a_sha1_blob_from_softhsm_still_unwraps(backend: Pkcs11Backend, kek: str) -> None:
    """A blob recorded under SoftHSM2's scheme stays readable after moving tokens, and
    rewrap_under_kek upgrades it to the token's own scheme."""
    material = os.urandom(32)
    old = WrappedKey(kek, RSA_OAEP_SHA1, _public(backend, kek).encrypt(material, oaep_padding(RSA_OAEP_SHA1)))
    assert backend.unwrap_key(old) == material
    upgraded = backend.rewrap_under_kek(old, kek_id=kek)
    assert upgraded.mechanism == RSA_OAEP_SHA256
    assert backend.unwrap_key(upgraded) == material


def test_a_token_wrap_opens_with_cryptography(backend: Pkcs11Backend, kek: str,
                                              recipient: rsa.RSAPrivateKey) -> None:
    material = os.urandom(32)
    der = recipient.public_key().public_bytes(serialization.Encoding.DER,
                                              serialization.PublicFormat.SubjectPublicKeyInfo)
    delivered = backend.rewrap_for_public_key(backend.import_key(material, kek_id=kek), public_key_der=der)
    assert delivered.mechanism == RSA_OAEP_SHA256
    assert recipient.decrypt(delivered.ciphertext, oaep_padding(RSA_OAEP_SHA256)) == material


# --- what the token does with unwrap templates (decision 0018) --------------------------------
def test_cached_working_keys_are_sensitive_and_never_extractable(backend: Pkcs11Backend, kek: str) -> None:
    """openCryptoki 3.8 makes unwrapped keys readable whatever the template says; the
    backend sets the attributes afterwards. Read back from the token, not remembered."""
    import hashlib

    generated = backend.generate_wrapped_key(kek_id=kek)
    backend.symmetric_cipher(generated, b"x", encrypt=True, mode=AES_CBC_PAD)
    entry = backend._cache.lease(
        (generated.wrapping_key_id, generated.mechanism, hashlib.sha256(generated.ciphertext).digest()))
    assert entry is not None
    try:
        attrs = entry.owner.get_attributes([Attribute.SENSITIVE, Attribute.EXTRACTABLE, Attribute.TOKEN])
        with pytest.raises(p11.AttributeSensitive):
            entry.owner[Attribute.VALUE]
    finally:
        backend._cache.release(entry)
    assert attrs == {Attribute.SENSITIVE: True, Attribute.EXTRACTABLE: False, Attribute.TOKEN: False}


def test_without_the_quirk_the_token_would_leave_unwrapped_keys_readable(backend: Pkcs11Backend, kek: str) -> None:
    """The reason for the quirk, shown on the real token: the template asks for a sensitive
    key and the token makes a readable one. If a release fixes this, this test fails and the
    quirk entry gets a bound."""
    from pkcs11 import KeyType, Mechanism, ObjectClass

    from hsm import mechanisms
    from hsm.handles import RsaPrivateView

    material = os.urandom(32)
    blob = _public(backend, kek).encrypt(material, oaep_padding(RSA_OAEP_SHA256))
    template = {a: v for a, v in mechanisms.WORKING_KEY_TEMPLATE.items() if a != Attribute.EXTRACTABLE}
    assert template[Attribute.SENSITIVE] is True
    with backend._borrow() as session:
        private = backend._kek(session, kek).private_handle
        key = RsaPrivateView(session, private).unwrap_key(
            ObjectClass.SECRET_KEY, KeyType.AES, blob, mechanism=Mechanism.RSA_PKCS_OAEP,
            mechanism_param=mechanisms.oaep_scheme(RSA_OAEP_SHA256).pkcs11_param, capabilities=0,
            template=template)
        try:
            assert key[Attribute.SENSITIVE] is False
            assert bytes(key[Attribute.VALUE]) == material
        finally:
            key.destroy()


def test_destroy_kek_removes_it_for_good(backend: Pkcs11Backend, other_kek: str) -> None:
    """The conformance test of the same name, with AES-CBC where it uses AES-GCM."""
    doomed = backend.create_kek(f"doomed-{uuid.uuid4().hex[:8]}").kek_id
    old = backend.generate_wrapped_key(kek_id=doomed)
    backend.symmetric_cipher(old, b"cached", encrypt=True, mode=AES_CBC_PAD)  # a cached handle
    moved = backend.rewrap_under_kek(old, kek_id=other_kek)
    backend.destroy_kek(doomed)
    assert doomed not in {info.kek_id for info in backend.list_keks()}
    for use in (lambda: backend.get_kek(doomed), lambda: backend.unwrap_key(old),
                lambda: backend.symmetric_cipher(old, b"x", encrypt=True, mode=AES_CBC_PAD),
                lambda: backend.generate_wrapped_key(kek_id=doomed), lambda: backend.destroy_kek(doomed)):
        with pytest.raises(HsmKeyNotFound):
            use()
    out = backend.symmetric_cipher(moved, b"still here", encrypt=True, mode=AES_CBC_PAD)
    assert backend.symmetric_cipher(moved, out.data, encrypt=False, mode=AES_CBC_PAD, iv=out.iv).data == b"still here"


# --- services inside the token ----------------------------------------------------------------
def test_aes_cbc_in_the_token_matches_software(backend: Pkcs11Backend, kek: str) -> None:
    key, data = os.urandom(32), os.urandom(1000)
    wrapped_key = backend.import_key(key, kek_id=kek)
    out = backend.symmetric_cipher(wrapped_key, data, encrypt=True, mode=AES_CBC_PAD)
    encryptor = Cipher(algorithms.AES(key), modes.CBC(out.iv)).encryptor()
    padder = padding.PKCS7(128).padder()
    assert out.data == encryptor.update(padder.update(data) + padder.finalize()) + encryptor.finalize()
    back = backend.symmetric_cipher(wrapped_key, out.data, encrypt=False, mode=AES_CBC_PAD, iv=out.iv)
    assert back.data == data
    with pytest.raises(HsmIntegrityError):
        backend.symmetric_cipher(wrapped_key, out.data[:-1], encrypt=False, mode=AES_CBC_PAD, iv=out.iv)


def test_hmac_sha256_chain_key_inside_the_token(backend: Pkcs11Backend) -> None:
    key_id = f"chain-{uuid.uuid4().hex[:8]}"
    backend.ensure_hmac_key(key_id)
    first = backend.hmac_sha256(b"record", key_id=key_id)
    assert first == backend.hmac_sha256(b"record", key_id=key_id) and len(first) == 32


def test_eight_threads_share_the_backend(backend: Pkcs11Backend, kek: str) -> None:
    """The locking decision (0002) on this module: OS locking accepted, 8 threads of
    unwrap + CBC + HMAC, every result checked against software."""
    assert backend._module.thread_safe
    errors: list[BaseException] = []
    secret = backend.generate_wrapped_secret(kek_id=kek, bits=256)
    secret_value = backend.unwrap_secret(secret)

    def worker(index: int) -> None:
        try:
            for round_ in range(6):
                key = os.urandom(32)
                blob = backend.import_key(key, kek_id=kek)
                assert backend.unwrap_key(blob) == key
                data = f"{index}-{round_}".encode()
                out = backend.symmetric_cipher(blob, data, encrypt=True, mode=AES_CBC_PAD)
                assert backend.symmetric_cipher(blob, out.data, encrypt=False, mode=AES_CBC_PAD,
                                                iv=out.iv).data == data
                mac = hmac.HMAC(secret_value, hashes.SHA256())
                mac.update(data)
                assert backend.hmac(secret, data, hash="SHA-256") == mac.finalize()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


# --- what the token cannot do: refused, naming the mechanism ----------------------------------
def test_aes_gcm_is_refused_naming_the_mechanism(backend: Pkcs11Backend, wrapped: WrappedKey) -> None:
    with pytest.raises(HsmUnavailable, match="lacks CKM_AES_GCM"):
        backend.encrypt_with(wrapped, b"data", aad=b"")
    with pytest.raises(HsmUnavailable, match="lacks CKM_AES_GCM"):
        backend.symmetric_cipher(wrapped, b"data", encrypt=True, mode=AES_GCM)


def test_ec_keys_are_refused_naming_the_mechanism(backend: Pkcs11Backend, kek: str) -> None:
    with pytest.raises(HsmUnavailable, match="lacks CKM_EC_KEY_PAIR_GEN/CKM_ECDSA"):
        backend.generate_wrapped_ec_pair(kek_id=kek, curve="P-256")
    with pytest.raises(HsmUnavailable, match="lacks CKM_EC_KEY_PAIR_GEN/CKM_ECDSA"):
        backend.ensure_signing_key("checkpoint-key")


def test_sealed_private_keys_and_aes_wrapping_are_refused(backend: Pkcs11Backend, kek: str,
                                                         wrapped: WrappedKey) -> None:
    with pytest.raises(HsmUnavailable, match="lacks CKM_AES_KEY_WRAP_PAD"):
        backend.generate_wrapped_rsa_pair(kek_id=kek, bits=2048)
    with pytest.raises(HsmUnavailable, match="lacks CKM_AES_KEY_WRAP_PAD"):
        backend.wrap_with_key(wrapped, wrapping=backend.generate_wrapped_key(kek_id=kek))


# --- error mapping ----------------------------------------------------------------------------
def test_a_wrong_user_pin_is_a_clear_unavailable_error() -> None:
    with pytest.raises(HsmUnavailable, match="PIN rejected"):
        open_backend(ock_config(user_pin="wrongpin"), create_token=False)


def test_a_missing_token_says_to_run_init() -> None:
    with pytest.raises(HsmUnavailable, match="keyserver init"):
        open_backend(ock_config(token_label="no-such-token"), create_token=False)


def test_the_vendor_default_so_pin_is_refused_in_config() -> None:
    with pytest.raises(HsmConfigError, match="so_pin"):
        ock_config(so_pin="87654321")


def test_the_startup_line_names_what_the_token_lacks(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="hsm.pkcs11.core"):
        opened = open_backend(ock_config(), create_token=False)
    opened.close()
    text = caplog.text
    assert "wrapping with RSA-OAEP-SHA256" in text
    assert "lacks CKM_AES_GCM (data-key and AES-GCM encryption); CKM_ECDSA" in text
    assert "CKM_AES_KEY_WRAP_PAD" in text


def test_the_key_server_refuses_to_initialise_on_this_token_naming_the_mechanism(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """The key server built on this token (Settings → build_services, embedded store):
    first-run set-up makes the audit chain's HMAC key, then stops at the checkpoint
    signing key (ECDSA P-256 in the token) with the mechanism named — never a server that
    starts and fails later. Decision 0018 says what running it would need."""
    from keyserver.core.errors import ServiceUnavailable
    from keyserver.services import build_services
    from keyserver.settings import Settings

    settings = Settings(data_dir=tmp_path_factory.mktemp("ock-server"), database_url=None,
                        hsm_module=os.environ[OCK], hsm_token_label=os.environ["STRONGROOM_TEST_OCK_LABEL"],
                        hsm_user_pin=os.environ["STRONGROOM_TEST_OCK_USER_PIN"],
                        hsm_so_pin=os.environ["STRONGROOM_TEST_OCK_SO_PIN"],
                        scheduler_interval_seconds=3600, agent_port=0)
    services = build_services(settings)
    try:
        with pytest.raises(ServiceUnavailable, match=r"audit checkpoint key: .* lacks CKM_EC_KEY_PAIR_GEN/CKM_ECDSA"):
            services.initialize()
        assert services.hsm.capabilities.rsa_wrap_mechanism == RSA_OAEP_SHA256
        assert services.hsm.hmac_sha256(b"x", key_id=settings.audit_hmac_key_id)
    finally:
        services.close()
