"""Register: AES and HMAC keys (they become managed keys, wrapped under the KEK at once),
public keys (RSA >= 2048 bits, so that Get can deliver keys wrapped under them, or EC on
P-256/P-384 for SignatureVerify; X.509 SubjectPublicKeyInfo, or PKCS#1 for RSA), AES and
HMAC keys wrapped under a key this server holds (unwrapped inside the HSM: wrapped_key.py), private
keys (RSA >= 2048 bits in PKCS#8 or PKCS#1, EC on P-256/P-384 in PKCS#8; they sign inside
the HSM), secret data (Password or Seed) and opaque objects (sealed at once under their
own AES key wrapped under the KEK), and X.509 certificates (stored as they are: they are
public). Transparent key formats are not accepted: PyKMIP's codec, which this server
decodes with, does not parse them."""

from __future__ import annotations

from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from kmip.core import enums
from kmip.core.messages import payloads

from keyserver.core.kmip_model import CERTIFICATE, MAX_SECRET_BYTES, OPAQUE, PRIVATE_KEY, SECRET_DATA
from keyserver.kmip import attributes, cryptoparams
from keyserver.kmip.context import Call
from keyserver.kmip.errors import KmipFailure
from keyserver.kmip.operations import wrapped_key
from keyserver.kmip.operations.create import symmetric_spec

OPERATION = enums.Operation.REGISTER
R = enums.ResultReason
A = enums.AttributeType
SECRET_DATA_TYPES = {enums.SecretDataType.PASSWORD: "password", enums.SecretDataType.SEED: "seed"}
REGISTRABLE = (enums.ObjectType.SYMMETRIC_KEY, enums.ObjectType.PUBLIC_KEY, enums.ObjectType.PRIVATE_KEY,
               enums.ObjectType.SECRET_DATA, enums.ObjectType.CERTIFICATE, enums.ObjectType.OPAQUE_DATA)
KINDS = {enums.ObjectType.SYMMETRIC_KEY: "symmetric-key", enums.ObjectType.PUBLIC_KEY: "public-key",
         enums.ObjectType.PRIVATE_KEY: PRIVATE_KEY, enums.ObjectType.SECRET_DATA: SECRET_DATA,
         enums.ObjectType.CERTIFICATE: CERTIFICATE, enums.ObjectType.OPAQUE_DATA: OPAQUE}
# Opaque Data Type: KMIP 1.4 defines only None (0x80000001); vendor extensions are refused.
OPAQUE_DATA_TYPES = {enums.OpaqueDataType.NONE: "none"}


def _enum(value: Any) -> Any:
    return getattr(value, "value", value)


def handle(call: Call, payload: Any) -> Any:
    if payload.object_type not in REGISTRABLE:
        raise KmipFailure(R.FEATURE_NOT_SUPPORTED, f"{payload.object_type.name} objects cannot be registered")
    kind = KINDS[payload.object_type]
    t = attributes.read_template(payload.template_attribute, kind, object_type=payload.object_type)
    values = t.values
    name = values.get(A.NAME.value)
    client = _stored(payload.template_attribute, t, kind, "AES" if kind == "symmetric-key" else "RSA")
    obj = payload.managed_object
    if payload.object_type == enums.ObjectType.CERTIFICATE:
        return _certificate(call, obj, name, t, client)
    if payload.object_type == enums.ObjectType.OPAQUE_DATA:
        return _opaque(call, obj, name, t, client)
    block = obj.key_block
    fmt = _enum(block.key_format_type)
    if block.key_wrapping_data is not None:
        if payload.object_type != enums.ObjectType.SYMMETRIC_KEY:
            raise KmipFailure(R.FEATURE_NOT_SUPPORTED, "only symmetric keys are registered wrapped; other objects "
                                                       "come as they are")
        if fmt != enums.KeyFormatType.RAW:
            raise KmipFailure(R.KEY_FORMAT_TYPE_NOT_SUPPORTED, "symmetric keys are registered in Raw format")
        return wrapped_key.register(call, payload.template_attribute, block, t, name, _symmetric_algorithm(block),
                                    matches=_matches)
    material = bytes(block.key_value.key_material.value)
    if payload.object_type == enums.ObjectType.PUBLIC_KEY:
        if fmt not in (enums.KeyFormatType.X_509, enums.KeyFormatType.PKCS_1):
            raise KmipFailure(R.KEY_FORMAT_TYPE_NOT_SUPPORTED,
                              "public keys are registered in X.509 (SubjectPublicKeyInfo) or PKCS#1 format")
        public_algorithm = _public_algorithm(material)
        _matches(t, public_algorithm, None)
        cryptoparams.check_defaults(t.parameters, public_algorithm)
        client = _stored(payload.template_attribute, t, kind, public_algorithm)
        row = call.engine.objects.register_public_key(
            call.ctx, material, name=name, attributes=client, activation_date=t.activation,
            deactivation_date=t.deactivation)
        return payloads.RegisterResponsePayload(unique_identifier=str(row.id))
    if payload.object_type == enums.ObjectType.PRIVATE_KEY:
        return _private_key(call, material, fmt, block, name, t, payload.template_attribute)
    if payload.object_type == enums.ObjectType.SECRET_DATA:
        return _secret_data(call, obj, material, name, t, client)
    if fmt != enums.KeyFormatType.RAW:
        raise KmipFailure(R.KEY_FORMAT_TYPE_NOT_SUPPORTED, "symmetric keys are registered in Raw format")
    algorithm = _symmetric_algorithm(block)
    if algorithm == "AES" and len(material) not in (16, 24, 32):
        raise KmipFailure(R.INVALID_FIELD, "AES keys are 16, 24 or 32 bytes long")
    _matches(t, algorithm, len(material) * 8)
    key = call.engine.keys.create(call.ctx, symmetric_spec(
        call, payload.template_attribute, t, name=name, algorithm=algorithm, length=len(material) * 8,
        description="registered over KMIP", material=material))
    return payloads.RegisterResponsePayload(unique_identifier=str(key.versions[-1].id))


def _symmetric_algorithm(block: Any) -> str:
    kmip_algorithm = _enum(block.cryptographic_algorithm) if block.cryptographic_algorithm is not None else None
    algorithm = attributes.ALGORITHM_OF_KMIP.get(kmip_algorithm or enums.CryptographicAlgorithm.AES)
    if algorithm is None:
        raise KmipFailure(R.INVALID_FIELD, "AES and HMAC-SHA256/384/512 keys can be registered; legacy ciphers "
                                           "(3DES, RC4, ...) are refused")
    return algorithm


def _stored(template: Any, t: attributes.Template, kind: str, algorithm: str) -> dict[str, Any]:
    """What an object other than a managed key keeps in kmip_attributes: client
    attributes, the usage mask, Cryptographic Parameters and custom x- attributes."""
    return {**attributes.template_client_attributes(template, kind, algorithm), **attributes.kept_attributes(t),
            **t.custom}


def _matches(t: attributes.Template, algorithm: str, bits: int | None) -> None:
    """A template's Cryptographic Algorithm and Length describe the key registered, or are refused."""
    named = t.values.get(A.CRYPTOGRAPHIC_ALGORITHM.value)
    if named is not None and cryptoparams.FAMILIES.get(named) != algorithm:
        raise KmipFailure(R.INVALID_FIELD, f"the template's Cryptographic Algorithm ({named.name}) is not the "
                                           f"key's ({algorithm})")
    length = t.values.get(A.CRYPTOGRAPHIC_LENGTH.value)
    if length is not None and bits is not None and int(length) != bits:
        raise KmipFailure(R.INVALID_FIELD, f"the template's Cryptographic Length ({int(length)}) is not the "
                                           f"key's ({bits} bits)")


def _public_algorithm(der: bytes) -> str:
    """"EC" or "RSA" (what the usage mask may hold); register_public_key checks the rest."""
    try:
        return "EC" if isinstance(serialization.load_der_public_key(der), ec.EllipticCurvePublicKey) else "RSA"
    except (ValueError, TypeError):
        return "RSA"  # PKCS#1, or not a key at all (refused when registered)


def _private_key(call: Call, material: bytes, fmt: Any, block: Any, name: str | None,
                 t: attributes.Template, template: Any) -> Any:
    if fmt not in (enums.KeyFormatType.PKCS_8, enums.KeyFormatType.PKCS_1):
        raise KmipFailure(R.KEY_FORMAT_TYPE_NOT_SUPPORTED, "private keys are registered in PKCS#8 or PKCS#1 format")
    algorithm = _enum(block.cryptographic_algorithm) if block.cryptographic_algorithm is not None else None
    if algorithm not in (None, enums.CryptographicAlgorithm.RSA, enums.CryptographicAlgorithm.EC,
                         enums.CryptographicAlgorithm.ECDSA):
        raise KmipFailure(R.FEATURE_NOT_SUPPORTED, "RSA and EC private keys can be registered")
    if len(material) > MAX_SECRET_BYTES:
        raise KmipFailure(R.INVALID_FIELD, "the private key is too large")
    try:
        key = serialization.load_der_private_key(material, None)
    except (ValueError, TypeError):
        raise KmipFailure(R.INVALID_FIELD, "the private key is not DER in the stated format "
                          "(unencrypted PKCS#8 or PKCS#1)") from None
    if isinstance(key, ec.EllipticCurvePrivateKey):
        if key.curve.name not in ("secp256r1", "secp384r1"):
            raise KmipFailure(R.INVALID_FIELD, "EC private keys are on P-256 or P-384")
        kind, bits = "EC", key.curve.key_size
    elif isinstance(key, rsa.RSAPrivateKey):
        if key.key_size < 2048:
            raise KmipFailure(R.INVALID_FIELD, "RSA private keys must have at least 2048 bits")
        kind, bits = "RSA", key.key_size
    else:
        raise KmipFailure(R.FEATURE_NOT_SUPPORTED, "RSA and EC private keys can be registered")
    if (algorithm == enums.CryptographicAlgorithm.RSA) != (kind == "RSA") and algorithm is not None:
        raise KmipFailure(R.INVALID_FIELD, f"the Cryptographic Algorithm does not match the key (an {kind} key)")
    length = block.cryptographic_length
    if length is not None and int(_enum(length)) != bits:
        raise KmipFailure(R.INVALID_FIELD, "the Cryptographic Length does not match the key")
    _matches(t, kind, bits)
    cryptoparams.check_defaults(t.parameters, kind)
    client = _stored(template, t, PRIVATE_KEY, kind)
    pkcs8 = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption())
    row = call.engine.objects.register_object(call.ctx, object_type=PRIVATE_KEY, material=pkcs8, name=name,
                                              data_type="pkcs8", algorithm=kind, length_bits=bits,
                                              activation_date=t.activation, deactivation_date=t.deactivation,
                                              attributes=client)
    return payloads.RegisterResponsePayload(unique_identifier=str(row.id))


def _secret_data(call: Call, obj: Any, material: bytes, name: str | None, t: attributes.Template,
                 client: dict[str, Any]) -> Any:
    kind = SECRET_DATA_TYPES.get(_enum(obj.secret_data_type))
    if kind is None:
        raise KmipFailure(R.INVALID_FIELD, "secret data is of type Password or Seed")
    if not 1 <= len(material) <= MAX_SECRET_BYTES:
        raise KmipFailure(R.INVALID_FIELD, f"secret data is 1 to {MAX_SECRET_BYTES} bytes long")
    row = call.engine.objects.register_object(call.ctx, object_type=SECRET_DATA, material=material, name=name,
                                              data_type=kind, activation_date=t.activation,
                                              deactivation_date=t.deactivation, attributes=client)
    return payloads.RegisterResponsePayload(unique_identifier=str(row.id))


def _opaque(call: Call, obj: Any, name: str | None, t: attributes.Template, client: dict[str, Any]) -> Any:
    kind = OPAQUE_DATA_TYPES.get(_enum(obj.opaque_data_type))
    if kind is None:
        raise KmipFailure(R.INVALID_FIELD, "an opaque object's Opaque Data Type is None (the only one KMIP 1.4 "
                                           "defines)")
    material = bytes(_enum(obj.opaque_data_value))
    if not 1 <= len(material) <= MAX_SECRET_BYTES:
        raise KmipFailure(R.INVALID_FIELD, f"an opaque object is 1 to {MAX_SECRET_BYTES} bytes long")
    row = call.engine.objects.register_object(call.ctx, object_type=OPAQUE, material=material, name=name,
                                              data_type=kind, activation_date=t.activation,
                                              deactivation_date=t.deactivation, attributes=client)
    return payloads.RegisterResponsePayload(unique_identifier=str(row.id))


def _certificate(call: Call, obj: Any, name: str | None, t: attributes.Template, client: dict[str, Any]) -> Any:
    if _enum(obj.certificate_type) != enums.CertificateType.X_509:
        raise KmipFailure(R.FEATURE_NOT_SUPPORTED, "only X.509 certificates can be registered")
    der = bytes(_enum(obj.certificate_value))
    if len(der) > MAX_SECRET_BYTES:
        raise KmipFailure(R.INVALID_FIELD, "the certificate is too large")
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError:
        raise KmipFailure(R.INVALID_FIELD, "the certificate is not DER-encoded X.509") from None
    public = cert.public_key()
    algorithm = "RSA" if isinstance(public, rsa.RSAPublicKey) else None
    row = call.engine.objects.register_object(
        call.ctx, object_type=CERTIFICATE, material=der, name=name, data_type="x509", algorithm=algorithm,
        length_bits=public.key_size if isinstance(public, rsa.RSAPublicKey) else None,
        activation_date=t.activation, deactivation_date=t.deactivation, attributes=client)
    return payloads.RegisterResponsePayload(unique_identifier=str(row.id))
