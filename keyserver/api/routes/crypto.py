"""Cryptographic services over REST: the key stays in the HSM (docs/api.md "Cryptographic
services"). `{key}` is a managed key (UUID or name: its newest version, or the `version`
a request names) or a KMIP object's identifier (a key pair's private or public half)."""

from __future__ import annotations

import base64
from typing import Annotated

from fastapi import APIRouter, Query

from keyserver.api.deps import Ctx, ServicesDep
from keyserver.api.schemas import (
    DecryptRequest,
    DecryptResult,
    EncryptRequest,
    EncryptResult,
    MacRequest,
    MacResult,
    RandomResult,
    SignRequest,
    SignResult,
    VerifyRequest,
    VerifyResult,
)

router = APIRouter(tags=["cryptographic services"])
KeyRef = Annotated[str, "key UUID or name, or a KMIP object's identifier"]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _mode(mode: str | None) -> str | None:
    return None if mode in (None, "RSA-OAEP") else mode


@router.post("/keys/{key_ref}/encrypt", operation_id="encryptWithKey", response_model=EncryptResult,
             summary="Encrypt with a key that stays in the HSM (AES-GCM by default; RSA-OAEP with a public key)")
def encrypt(key_ref: KeyRef, body: EncryptRequest, ctx: Ctx, services: ServicesDep) -> EncryptResult:
    uid = services.kmip_objects.uid_of(key_ref)
    out = services.crypto.encrypt(ctx, uid, body.plaintext, mode=_mode(body.mode), iv=body.iv, aad=body.aad,
                                  oaep_hash=body.oaep_hash)
    return EncryptResult(key_id=uid, version=out.version, ciphertext=_b64(out.data),
                         iv=_b64(out.iv) if out.iv else None, tag=_b64(out.tag) if out.tag else None)


@router.post("/keys/{key_ref}/decrypt", operation_id="decryptWithKey", response_model=DecryptResult,
             summary="Decrypt with a key that stays in the HSM (Deactivated and Compromised keys still decrypt)")
def decrypt(key_ref: KeyRef, body: DecryptRequest, ctx: Ctx, services: ServicesDep) -> DecryptResult:
    uid = services.kmip_objects.uid_of(key_ref, body.version)
    plain = services.crypto.decrypt(ctx, uid, body.ciphertext, mode=_mode(body.mode), iv=body.iv, aad=body.aad,
                                    tag=body.tag, oaep_hash=body.oaep_hash)
    return DecryptResult(plaintext=_b64(plain))


@router.post("/keys/{key_ref}/sign", operation_id="signWithKey", response_model=SignResult,
             summary="Sign with a private key that stays in the HSM (RSA-PSS by default; ECDSA with an EC key)")
def sign(key_ref: KeyRef, body: SignRequest, ctx: Ctx, services: ServicesDep) -> SignResult:
    uid = services.kmip_objects.uid_of(key_ref)
    return SignResult(signature=_b64(services.crypto.sign(ctx, uid, body.data, scheme=body.scheme, hash=body.hash)))


@router.post("/keys/{key_ref}/verify", operation_id="verifyWithKey", response_model=VerifyResult,
             summary="Verify a signature with a public key or certificate (RSA or EC)")
def verify(key_ref: KeyRef, body: VerifyRequest, ctx: Ctx, services: ServicesDep) -> VerifyResult:
    uid = services.kmip_objects.uid_of(key_ref)
    return VerifyResult(valid=services.crypto.verify(ctx, uid, body.data, body.signature, scheme=body.scheme,
                                                     hash=body.hash))


@router.post("/keys/{key_ref}/mac", operation_id="macWithKey", response_model=MacResult,
             summary="Compute (or, given `mac`, verify in constant time) an HMAC with an HMAC key")
def mac(key_ref: KeyRef, body: MacRequest, ctx: Ctx, services: ServicesDep) -> MacResult:
    uid = services.kmip_objects.uid_of(key_ref, body.version)
    if body.mac is not None:
        return MacResult(mac=None, valid=services.crypto.mac_verify(ctx, uid, body.data, body.mac))
    return MacResult(mac=_b64(services.crypto.mac(ctx, uid, body.data)), valid=None)


@router.get("/random", operation_id="getRandom", response_model=RandomResult,
            summary="Random bytes from the HSM's generator")
def random(ctx: Ctx, services: ServicesDep,
           bytes_: Annotated[int, Query(alias="bytes", ge=1, le=65536)] = 32) -> RandomResult:
    return RandomResult(random=_b64(services.crypto.random(ctx, bytes_)))
