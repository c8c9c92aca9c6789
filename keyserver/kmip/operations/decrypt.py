"""Decrypt: the inverse of Encrypt (see encrypt.py for GCM's tag); RSA-OAEP with a private
key opened only inside the HSM. Deactivated and Compromised keys still decrypt."""

from __future__ import annotations

from typing import Any

from kmip.core import enums
from kmip.core.messages import payloads

from hsm import AES_GCM
from keyserver.kmip import cryptoparams
from keyserver.kmip.context import Call, request_uid
from keyserver.kmip.errors import KmipFailure

OPERATION = enums.Operation.DECRYPT


def handle(call: Call, payload: Any) -> Any:
    uid = request_uid(payload)
    if payload.data is None:
        raise KmipFailure(enums.ResultReason.MISSING_DATA, "Decrypt needs Data")
    params, aes = cryptoparams.for_cipher(call, uid, "decrypt", payload.cryptographic_parameters)
    data = bytes(payload.data)
    tag = bytes(payload.auth_tag) if payload.auth_tag is not None else b""
    iv = bytes(payload.iv_counter_nonce) if payload.iv_counter_nonce is not None else None
    cryptoparams.check_lengths(params, aes, iv=iv, tag=tag if payload.auth_tag is not None else None)
    gcm = params.mode in (None, AES_GCM) and iv is not None
    if gcm and not tag:
        if len(data) < params.tag_bytes:
            raise KmipFailure(enums.ResultReason.INVALID_FIELD, "GCM data ends with its tag: too short")
        data, tag = data[:-params.tag_bytes], data[-params.tag_bytes:]
    plain = call.engine.crypto.decrypt(call.ctx, uid, data, mode=params.mode, iv=iv,
                                       aad=bytes(payload.auth_additional_data or b""), tag=tag,
                                       oaep_hash=params.oaep_hash)
    return payloads.DecryptResponsePayload(unique_identifier=uid, data=plain)
