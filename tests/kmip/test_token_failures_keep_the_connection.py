"""A token operation that fails inside OpenSSL (SoftHSM2's RSA-OAEP decoding, an RFC 5649
integrity check) leaves this thread's OpenSSL error queue dirty; Python's TLS shares that
libcrypto, and the next read that had to wait for the client reported the stale entry as
its own failure, dropping the connection (hsm/openssl_errors.py). The client gets its
Cryptographic Failure and keeps its connection."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
from cryptography.hazmat.primitives.keywrap import aes_key_wrap_with_padding
from kmip.core import enums
from kmip.pie import objects as pie
from kmip.pie.exceptions import KmipOperationFailure

M = enums.CryptographicUsageMask
OAEP = {"padding_method": enums.PaddingMethod.OAEP, "hashing_algorithm": enums.HashingAlgorithm.SHA_1,
        "cryptographic_algorithm": enums.CryptographicAlgorithm.RSA}


def test_a_bad_oaep_ciphertext_and_a_bad_wrapped_key_leave_the_connection_usable(kmip: Any) -> None:
    _, private = kmip.create_key_pair(enums.CryptographicAlgorithm.RSA, 2048, public_usage_mask=[M.ENCRYPT],
                                      private_usage_mask=[M.DECRYPT])
    kmip.activate(private)
    wrapper = kmip.create(enums.CryptographicAlgorithm.AES, 256,
                          cryptographic_usage_mask=[M.ENCRYPT, M.DECRYPT, M.UNWRAP_KEY])
    kmip.activate(wrapper)
    bad_blob = aes_key_wrap_with_padding(os.urandom(32), os.urandom(32))  # not under `wrapper`
    wrapping = {"wrapping_method": enums.WrappingMethod.ENCRYPT,
                "encryption_key_information": {"unique_identifier": wrapper},
                "encoding_option": enums.EncodingOption.NO_ENCODING}
    for _ in range(2):
        with pytest.raises(KmipOperationFailure) as e:
            kmip.decrypt(os.urandom(256), uid=private, cryptographic_parameters=OAEP)
        assert e.value.reason == enums.ResultReason.CRYPTOGRAPHIC_FAILURE
        time.sleep(0.3)  # the server's next read waits for data: where the stale error struck
        assert kmip.get_attributes(private)[0] == private
        with pytest.raises(KmipOperationFailure) as e:
            kmip.register(pie.SymmetricKey(enums.CryptographicAlgorithm.AES, 256, bad_blob,
                                           key_wrapping_data=wrapping))
        assert e.value.reason == enums.ResultReason.CRYPTOGRAPHIC_FAILURE
        time.sleep(0.3)
        assert kmip.get_attributes(wrapper)[0] == wrapper
