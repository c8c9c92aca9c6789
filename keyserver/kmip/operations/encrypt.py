"""Encrypt: AES-GCM (default) or AES-CBC with PKCS#5 padding under a symmetric key, inside
the HSM; RSA-OAEP with a public key. GCM's tag: in the Authenticated Encryption Tag when
the request carries Authenticated Encryption Additional Data (KMIP 1.4), otherwise
appended to Data (PyKMIP's client and KMIP 1.2/1.3 have no tag field). The IV is
returned when the server made it."""

from __future__ import annotations

from typing import Any

from kmip.core import enums
from kmip.core.messages import payloads

from keyserver.kmip import cryptoparams
from keyserver.kmip.context import Call, request_uid
from keyserver.kmip.errors import KmipFailure

OPERATION = enums.Operation.ENCRYPT


def handle(call: Call, payload: Any) -> Any:
    uid = request_uid(payload)
    if payload.data is None:
        raise KmipFailure(enums.ResultReason.MISSING_DATA, "Encrypt needs Data")
    params, aes = cryptoparams.for_cipher(call, uid, "encrypt", payload.cryptographic_parameters)
    aad = payload.auth_additional_data
    iv = payload.iv_counter_nonce
    cryptoparams.check_lengths(params, aes, iv=bytes(iv) if iv is not None else None)
    out = call.engine.crypto.encrypt(call.ctx, uid, bytes(payload.data), mode=params.mode,
                                     iv=bytes(iv) if iv is not None else None, aad=bytes(aad or b""),
                                     tag_bytes=params.tag_bytes, oaep_hash=params.oaep_hash)
    separate = aad is not None
    return payloads.EncryptResponsePayload(
        unique_identifier=uid, data=out.data if separate else out.data + out.tag,
        iv_counter_nonce=out.iv if (out.iv and iv is None) else None,
        auth_tag=out.tag if (separate and out.tag) else None)
