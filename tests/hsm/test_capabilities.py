"""The capability record: quirk table first, probing only for tokens it does not know."""

from __future__ import annotations

import pytest
from pkcs11 import Mechanism

from hsm.backend import RSA_OAEP_SHA1, RSA_OAEP_SHA256
from hsm.capabilities import KNOWN_QUIRKS, NoUsableOaep, TokenIdentity, detect

SOFTHSM = TokenIdentity("SoftHSM project", "SoftHSM v2", (2, 6))
OTHER = TokenIdentity("Acme HSM Corp", "Vault 9000", (7, 1))
FULL = {Mechanism.RSA_PKCS_OAEP, Mechanism.AES_GCM, Mechanism.SHA256_HMAC, Mechanism.AES_KEY_GEN}


def _never(name: str) -> bool:
    raise AssertionError(f"known tokens are not probed (asked about {name})")


def test_softhsm2_uses_oaep_sha1_without_probing() -> None:
    capabilities = detect(SOFTHSM, FULL, probe_oaep=_never)
    assert capabilities.rsa_wrap_mechanism == RSA_OAEP_SHA1
    assert capabilities.rsa_unwrap_mechanisms == frozenset({RSA_OAEP_SHA1})
    assert (capabilities.manufacturer, capabilities.model, capabilities.firmware) == (
        "SoftHSM project", "SoftHSM v2", "2.6",
    )


@pytest.mark.parametrize("firmware", [(2, 0), (2, 7), (2, 255)])
def test_softhsm2_quirk_covers_the_2_x_line(firmware: tuple[int, int]) -> None:
    token = TokenIdentity(SOFTHSM.manufacturer, SOFTHSM.model, firmware)
    assert detect(token, FULL, probe_oaep=_never).rsa_wrap_mechanism == RSA_OAEP_SHA1


def test_a_future_softhsm_is_probed_not_assumed() -> None:
    token = TokenIdentity(SOFTHSM.manufacturer, SOFTHSM.model, (3, 0))
    asked: list[str] = []

    def probe(name: str) -> bool:
        asked.append(name)
        return True

    capabilities = detect(token, FULL, probe_oaep=probe)
    assert asked
    assert capabilities.rsa_wrap_mechanism == RSA_OAEP_SHA256


def test_token_with_oaep_sha256_wraps_with_it() -> None:
    capabilities = detect(OTHER, FULL, probe_oaep=lambda name: True)
    assert capabilities.rsa_wrap_mechanism == RSA_OAEP_SHA256
    assert capabilities.rsa_unwrap_mechanisms == frozenset({RSA_OAEP_SHA1, RSA_OAEP_SHA256})


def test_token_with_only_sha1_falls_back() -> None:
    capabilities = detect(OTHER, FULL, probe_oaep=lambda name: name == RSA_OAEP_SHA1)
    assert capabilities.rsa_wrap_mechanism == RSA_OAEP_SHA1
    assert capabilities.rsa_unwrap_mechanisms == frozenset({RSA_OAEP_SHA1})


def test_fips_style_token_without_sha1() -> None:
    capabilities = detect(OTHER, FULL, probe_oaep=lambda name: name == RSA_OAEP_SHA256)
    assert capabilities.rsa_unwrap_mechanisms == frozenset({RSA_OAEP_SHA256})


def test_mechanism_flags_come_from_the_list() -> None:
    capabilities = detect(OTHER, {Mechanism.RSA_PKCS_OAEP}, probe_oaep=lambda name: True)
    assert not capabilities.supports_aes_gcm
    assert not capabilities.supports_hmac_sha256
    assert detect(OTHER, FULL, probe_oaep=lambda name: True).supports_aes_gcm


def test_token_without_oaep_is_refused() -> None:
    with pytest.raises(NoUsableOaep):
        detect(OTHER, {Mechanism.AES_GCM}, probe_oaep=lambda name: True)
    with pytest.raises(NoUsableOaep):
        detect(OTHER, FULL, probe_oaep=lambda name: False)


def test_quirk_entries_explain_themselves() -> None:
    for quirk in KNOWN_QUIRKS:
        assert quirk.why and quirk.rsa_oaep
        assert quirk.firmware_from <= quirk.firmware_to
