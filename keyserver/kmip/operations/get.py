"""Get: a key version's material, in plaintext (needs keys:export, audited) or wrapped
inside the HSM under a registered RSA public key (RSA-OAEP; the token's mechanism) or an
AES key (RFC 5649). Public keys (X.509) and certificates come as they are; private keys
(PKCS#8, or PKCS#1 on request) and secret data need keys:export and are audited."""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives import serialization
from kmip.core import enums, objects
from kmip.core.factories.secrets import SecretFactory
from kmip.core.messages import payloads

from hsm import RSA_OAEP_SHA1
from hsm.backend import AES_KWP
from keyserver.core.kmip_model import (
    CERTIFICATE,
    OPAQUE,
    PRIVATE_KEY,
    PublicKeyObject,
    SealedObject,
    VersionObject,
    public_key_algorithm,
)
from keyserver.core.states import DESTROYED_STATES, KeyState
from keyserver.kmip import attributes
from keyserver.kmip.context import Call, request_uid
from keyserver.kmip.errors import KmipFailure

OPERATION = enums.Operation.GET
R = enums.ResultReason
_secrets = SecretFactory()


def _parameters(mechanism: str) -> Any:
    """The Cryptographic Parameters that describe how we wrapped."""
    if mechanism == AES_KWP:
        return objects.CryptographicParameters(block_cipher_mode=enums.BlockCipherMode.AES_KEY_WRAP_PADDING,
                                               cryptographic_algorithm=enums.CryptographicAlgorithm.AES)
    hashing = enums.HashingAlgorithm.SHA_1 if mechanism == RSA_OAEP_SHA1 else enums.HashingAlgorithm.SHA_256
    return objects.CryptographicParameters(
        padding_method=enums.PaddingMethod.OAEP, hashing_algorithm=hashing,
        cryptographic_algorithm=enums.CryptographicAlgorithm.RSA)


def _check_requested(params: Any, *, symmetric: bool, rsa_mechanism: str) -> None:
    """Refuse parameters we would not honour, rather than wrap some other way."""
    if params is None:
        return
    if symmetric:
        if params.block_cipher_mode not in (None, enums.BlockCipherMode.AES_KEY_WRAP_PADDING):
            raise KmipFailure(R.FEATURE_NOT_SUPPORTED,
                              "keys are wrapped under AES keys with AES Key Wrap with Padding (RFC 5649) only")
        return
    if params.padding_method not in (None, enums.PaddingMethod.OAEP):
        raise KmipFailure(R.FEATURE_NOT_SUPPORTED, "keys are wrapped under RSA keys with OAEP only")
    ours = _parameters(rsa_mechanism).hashing_algorithm
    if params.hashing_algorithm not in (None, ours):
        raise KmipFailure(R.FEATURE_NOT_SUPPORTED, f"this server's HSM wraps with OAEP {ours.name} only")


def _wrapping_target(spec: Any) -> str:
    if spec.wrapping_method != enums.WrappingMethod.ENCRYPT:
        raise KmipFailure(R.FEATURE_NOT_SUPPORTED, "only the Encrypt wrapping method is supported")
    if spec.mac_signature_key_information is not None:
        raise KmipFailure(R.FEATURE_NOT_SUPPORTED, "MAC/signature key wrapping is not supported")
    if spec.attribute_names:
        raise KmipFailure(R.FEATURE_NOT_SUPPORTED, "wrapping attributes with the key is not supported")
    if spec.encoding_option not in (None, enums.EncodingOption.NO_ENCODING):
        raise KmipFailure(R.ENCODING_OPTION_ERROR, "only the No Encoding option is supported")
    info = spec.encryption_key_information
    if info is None or not info.unique_identifier:
        raise KmipFailure(R.MISSING_DATA, "the wrapping specification names no encryption key")
    return str(info.unique_identifier)


SECRET_DATA_TYPES = {"password": enums.SecretDataType.PASSWORD, "seed": enums.SecretDataType.SEED}


def _public_key(uid: str, found: PublicKeyObject, fmt: Any) -> Any:
    if fmt not in (None, enums.KeyFormatType.X_509, enums.KeyFormatType.PKCS_1):
        raise KmipFailure(R.KEY_FORMAT_TYPE_NOT_SUPPORTED, "public keys are delivered in X.509 or PKCS#1 format")
    if KeyState(found.state) in DESTROYED_STATES:
        raise KmipFailure(R.ILLEGAL_OPERATION, f"the public key is {found.state}")
    der = found.der
    algorithm = public_key_algorithm(found)
    if fmt == enums.KeyFormatType.PKCS_1 and algorithm != "RSA":
        raise KmipFailure(R.KEY_FORMAT_TYPE_NOT_SUPPORTED, "PKCS#1 is for RSA keys; EC public keys are X.509")
    if fmt == enums.KeyFormatType.PKCS_1:
        der = serialization.load_der_public_key(der).public_bytes(serialization.Encoding.DER,
                                                                   serialization.PublicFormat.PKCS1)
    secret = _secrets.create(enums.ObjectType.PUBLIC_KEY, {
        "cryptographic_algorithm": attributes.PAIR_ALGORITHMS[algorithm], "cryptographic_length": found.length_bits,
        "key_format_type": fmt or enums.KeyFormatType.X_509, "key_value": der})
    return payloads.GetResponsePayload(object_type=enums.ObjectType.PUBLIC_KEY, unique_identifier=uid, secret=secret)


def _sealed(call: Call, uid: str, found: SealedObject, fmt: Any) -> Any:
    if found.object_type == PRIVATE_KEY:
        if fmt not in (None, enums.KeyFormatType.PKCS_8, enums.KeyFormatType.PKCS_1):
            raise KmipFailure(R.KEY_FORMAT_TYPE_NOT_SUPPORTED, "private keys are delivered in PKCS#8 or PKCS#1 format")
        if fmt == enums.KeyFormatType.PKCS_1 and found.algorithm != "RSA":
            raise KmipFailure(R.KEY_FORMAT_TYPE_NOT_SUPPORTED, "PKCS#1 is for RSA keys; EC private keys are PKCS#8")
    elif fmt is not None and not (found.object_type != CERTIFICATE and fmt == enums.KeyFormatType.OPAQUE):
        raise KmipFailure(R.KEY_FORMAT_TYPE_NOT_SUPPORTED, f"a {found.object_type} has no key format to choose")
    material = call.engine.objects.export_object(call.ctx, found)
    if found.object_type == CERTIFICATE:
        secret = _secrets.create(enums.ObjectType.CERTIFICATE, {
            "certificate_type": enums.CertificateType.X_509, "certificate_value": material})
        return payloads.GetResponsePayload(object_type=enums.ObjectType.CERTIFICATE, unique_identifier=uid,
                                           secret=secret)
    if found.object_type == OPAQUE:
        secret = _secrets.create(enums.ObjectType.OPAQUE_DATA, {
            "opaque_data_type": enums.OpaqueDataType.NONE, "opaque_data_value": material})
        return payloads.GetResponsePayload(object_type=enums.ObjectType.OPAQUE_DATA, unique_identifier=uid,
                                           secret=secret)
    if found.object_type == PRIVATE_KEY:
        if fmt == enums.KeyFormatType.PKCS_1:
            material = serialization.load_der_private_key(material, None).private_bytes(
                serialization.Encoding.DER, serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption())
        secret = _secrets.create(enums.ObjectType.PRIVATE_KEY, {
            "cryptographic_algorithm": attributes.PAIR_ALGORITHMS.get(found.algorithm or "RSA",
                                                                      enums.CryptographicAlgorithm.RSA),
            "cryptographic_length": found.length_bits,
            "key_format_type": fmt or enums.KeyFormatType.PKCS_8, "key_value": material})
        return payloads.GetResponsePayload(object_type=enums.ObjectType.PRIVATE_KEY, unique_identifier=uid,
                                           secret=secret)
    secret = _secrets.create(enums.ObjectType.SECRET_DATA, {
        "secret_data_type": SECRET_DATA_TYPES.get(found.data_type or "", enums.SecretDataType.PASSWORD),
        "key_format_type": enums.KeyFormatType.OPAQUE, "key_value": material})
    return payloads.GetResponsePayload(object_type=enums.ObjectType.SECRET_DATA, unique_identifier=uid,
                                       secret=secret)


def handle(call: Call, payload: Any) -> Any:
    if payload.key_compression_type is not None:
        raise KmipFailure(R.KEY_COMPRESSION_TYPE_NOT_SUPPORTED, "key compression is not supported")
    uid = request_uid(payload)
    spec = payload.key_wrapping_specification
    fmt = payload.key_format_type
    found = call.engine.objects.resolve_for_export(call.ctx, uid, right="export")
    if not isinstance(found, VersionObject):
        if spec is not None:
            raise KmipFailure(R.FEATURE_NOT_SUPPORTED,
                              "only symmetric keys are delivered wrapped; other objects come as they are")
        if isinstance(found, PublicKeyObject):
            return _public_key(uid, found, fmt)
        return _sealed(call, uid, found, fmt)
    if fmt not in (None, enums.KeyFormatType.RAW):
        raise KmipFailure(R.KEY_FORMAT_TYPE_NOT_SUPPORTED, "symmetric keys are delivered in Raw format only")
    wrap_under = _wrapping_target(spec) if spec is not None else None
    if spec is not None and wrap_under is not None:
        wrapping_key = call.engine.objects.resolve_for_export(call.ctx, wrap_under, right="use")
        _check_requested(spec.encryption_key_information.cryptographic_parameters,
                         symmetric=isinstance(wrapping_key, VersionObject),
                         rsa_mechanism=call.engine.objects.rsa_wrap_mechanism)
    exported = call.engine.objects.export(call.ctx, found, wrap_under=wrap_under)
    secret = _secrets.create(enums.ObjectType.SYMMETRIC_KEY, {
        "cryptographic_algorithm": attributes.KEY_ALGORITHMS[exported.obj.key.algorithm],
        "cryptographic_length": exported.obj.key.length_bits,
        "key_format_type": enums.KeyFormatType.RAW, "key_value": exported.material})
    if exported.wrapping_mechanism is not None:
        assert wrap_under is not None
        secret.key_block.key_wrapping_data = objects.KeyWrappingData(
            wrapping_method=enums.WrappingMethod.ENCRYPT,
            encryption_key_information=objects.EncryptionKeyInformation(
                unique_identifier=wrap_under,
                cryptographic_parameters=_parameters(exported.wrapping_mechanism)),
            encoding_option=enums.EncodingOption.NO_ENCODING)
    return payloads.GetResponsePayload(object_type=enums.ObjectType.SYMMETRIC_KEY, unique_identifier=uid,
                                       secret=secret)
