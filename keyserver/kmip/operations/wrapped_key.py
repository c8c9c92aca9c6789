"""Register of a symmetric key that comes wrapped (Key Block with Key Wrapping Data): the
server half of PKCS#11's C_UnwrapKey. The key is unwrapped inside the HSM under a key
this server holds — an AES key (AES Key Wrap with Padding, RFC 5649, or NIST Key Wrap,
RFC 3394) or an RSA private
key (OAEP with the hashes the token unwraps with) — and wrapped under the current KEK at
once (KmipRegistry.unwrap_for_import): its plaintext never exists outside the token. It
then becomes a managed key like a registered plaintext one, audited `imported` with
`wrapped: true` and the unwrapping key. The mirror of Get with a Key Wrapping
Specification (get.py): the same method, encoding and parameter rules, and refusals."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from kmip.core import enums
from kmip.core.messages import payloads

from hsm import AES_KW, RSA_OAEP_SHA1, RSA_OAEP_SHA256
from keyserver.core.keys import HMAC_ALGORITHMS
from keyserver.core.kmip_model import VersionObject
from keyserver.core.permissions import Permission
from keyserver.kmip import attributes
from keyserver.kmip.context import Call
from keyserver.kmip.errors import KmipFailure
from keyserver.kmip.operations.create import symmetric_spec

R = enums.ResultReason
A = enums.AttributeType
AES_WRAPS = {None: None, enums.BlockCipherMode.AES_KEY_WRAP_PADDING: None, enums.BlockCipherMode.NIST_KEY_WRAP: AES_KW}
OAEP_HASHES = {enums.HashingAlgorithm.SHA_1: RSA_OAEP_SHA1, enums.HashingAlgorithm.SHA_256: RSA_OAEP_SHA256}


def unwrapping_key(data: Any) -> str:
    """The Key Wrapping Data's unwrapping key, or the refusal Get gives its specification."""
    if data.wrapping_method != enums.WrappingMethod.ENCRYPT:
        raise KmipFailure(R.FEATURE_NOT_SUPPORTED, "only the Encrypt wrapping method is supported")
    if data.mac_signature_key_information is not None or data.mac_signature is not None:
        raise KmipFailure(R.FEATURE_NOT_SUPPORTED, "MAC/signature key wrapping is not supported")
    if data.encoding_option not in (None, enums.EncodingOption.NO_ENCODING):
        raise KmipFailure(R.ENCODING_OPTION_ERROR, "only the No Encoding option is supported")
    if data.iv_counter_nonce is not None:
        raise KmipFailure(R.FEATURE_NOT_SUPPORTED, "AES Key Wrap (RFC 5649, RFC 3394) and RSA-OAEP take no "
                                                   "IV/Counter/Nonce")
    info = data.encryption_key_information
    if info is None or not info.unique_identifier:
        raise KmipFailure(R.MISSING_DATA, "the Key Wrapping Data names no encryption key")
    return str(info.unique_identifier)


def mechanism_of(call: Call, params: Any, *, symmetric: bool) -> str | None:
    """The unwrapping mechanism the parameters ask for (None: the key's default — RFC 5649
    under an AES key, the token's own OAEP under an RSA one), or the refusal Get gives them."""
    if symmetric:
        mode = params.block_cipher_mode if params is not None else None
        if mode not in AES_WRAPS:
            raise KmipFailure(R.FEATURE_NOT_SUPPORTED, "keys are unwrapped under AES keys with AES Key Wrap with "
                                                       "Padding (RFC 5649) or NIST Key Wrap (RFC 3394) only")
        return AES_WRAPS[mode]
    supported = call.engine.objects.rsa_unwrap_mechanisms
    if params is not None and params.padding_method not in (None, enums.PaddingMethod.OAEP):
        raise KmipFailure(R.FEATURE_NOT_SUPPORTED, "keys are unwrapped under RSA keys with OAEP only")
    hashing = params.hashing_algorithm if params is not None else None
    mechanism = call.engine.objects.rsa_wrap_mechanism if hashing is None else OAEP_HASHES.get(hashing)
    if mechanism not in supported:
        names = " or ".join(sorted(m.removeprefix("RSA-OAEP-") for m in supported))
        raise KmipFailure(R.FEATURE_NOT_SUPPORTED, f"this server's HSM unwraps with OAEP {names} only")
    return mechanism


def register(call: Call, template: Any, block: Any, t: attributes.Template, name: str | None, algorithm: str, *,
             matches: Callable[[attributes.Template, str, int | None], None]) -> Any:
    # Refused before anything is unwrapped: a caller who may not create keys, a bad wrapping, another algorithm.
    call.engine.objects.require(call.ctx, Permission.KEYS_CREATE, action="key.create")
    uid = unwrapping_key(block.key_wrapping_data)
    matches(t, algorithm, None)
    target = call.engine.objects.resolve_for_export(call.ctx, uid, right="use")
    mechanism = mechanism_of(call, block.key_wrapping_data.encryption_key_information.cryptographic_parameters,
                             symmetric=isinstance(target, VersionObject))
    wrapped = bytes(block.key_value.key_material.value)
    imported, details = call.engine.objects.unwrap_for_import(call.ctx, uid, wrapped, secret=algorithm != "AES",
                                                              mechanism=mechanism)
    # The token measures the key to the 8-byte block (hsm.ImportedKey): a stated length
    # must round to it, and is the key's length; none stated, the measured one is.
    stated = block.cryptographic_length if block.cryptographic_length is not None else \
        t.values.get(A.CRYPTOGRAPHIC_LENGTH.value)
    length = imported.length_bits
    if stated is not None:
        bits = int(getattr(stated, "value", stated))
        if bits % 8 or -(-bits // 64) * 64 != length:
            raise KmipFailure(R.INVALID_FIELD, f"the unwrapped key is {length // 8} bytes (to the 8-byte block), "
                                               f"not the {bits} bits its Cryptographic Length says")
        length = bits
    if algorithm in HMAC_ALGORITHMS and length < HMAC_ALGORITHMS[algorithm]:
        raise KmipFailure(R.INVALID_FIELD, f"{algorithm} key material is {HMAC_ALGORITHMS[algorithm] // 8} to 128 "
                                           "bytes long")
    matches(t, algorithm, length)
    spec = symmetric_spec(call, template, t, name=name, algorithm=algorithm, length=length,
                          description="registered wrapped over KMIP")
    key = call.engine.keys.create(call.ctx, dataclasses.replace(spec, wrapped=imported.wrapped,
                                                                 import_details=details))
    return payloads.RegisterResponsePayload(unique_identifier=str(key.versions[-1].id))
