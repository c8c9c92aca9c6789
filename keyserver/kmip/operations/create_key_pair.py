"""CreateKeyPair: an RSA key pair (2048, 3072 or 4096 bits) or an EC one (Cryptographic
Algorithm EC or ECDSA; Cryptographic Length 256 for P-256, 384 for P-384; PyKMIP 0.11
cannot carry Recommended Curve) generated inside the HSM.
The private key leaves the token only sealed (AES Key Wrap with Padding under its own
AES key, which is wrapped under the KEK); the public key is stored as it is and can be
fetched with Get and used to wrap keys. Both halves are Pre-Active unless the templates
carry an Activation Date not in the future, and each names the other in a custom
attribute (x-strongroom-linked-public-key / x-strongroom-linked-private-key)."""

from __future__ import annotations

from typing import Any

from kmip.core import enums
from kmip.core.messages import payloads

from keyserver.kmip import attributes
from keyserver.kmip.context import Call
from keyserver.kmip.errors import KmipFailure
from keyserver.kmip.operations.create import activation_of

OPERATION = enums.Operation.CREATE_KEY_PAIR
A = enums.AttributeType
R = enums.ResultReason
# EC and ECDSA name one kind of key pair (ECDSA is what it is for: Sign / SignatureVerify).
ALGORITHMS = {enums.CryptographicAlgorithm.RSA: "RSA", enums.CryptographicAlgorithm.EC: "EC",
              enums.CryptographicAlgorithm.ECDSA: "EC"}
LENGTHS = {"RSA": "2048, 3072 or 4096", "EC": "256 (P-256) or 384 (P-384)"}


def handle(call: Call, payload: Any) -> Any:
    common = attributes.template_values(payload.common_template_attribute)
    private = {**common, **attributes.template_values(payload.private_key_template_attribute)}
    public = {**common, **attributes.template_values(payload.public_key_template_attribute)}
    kinds: set[str] = set()
    for values in (private, public):
        algorithm = values.get(A.CRYPTOGRAPHIC_ALGORITHM.value)
        if algorithm is None:
            raise KmipFailure(R.MISSING_DATA, "CreateKeyPair needs a Cryptographic Algorithm (RSA, or EC/ECDSA)")
        if algorithm not in ALGORITHMS:
            raise KmipFailure(R.INVALID_FIELD, "only RSA and EC (ECDSA) key pairs can be created")
        kinds.add(ALGORITHMS[algorithm])
    if len(kinds) != 1:
        raise KmipFailure(R.INVALID_FIELD, "the two halves of a key pair have one Cryptographic Algorithm")
    [kind] = kinds
    if private.get(A.CRYPTOGRAPHIC_LENGTH.value) != public.get(A.CRYPTOGRAPHIC_LENGTH.value):
        raise KmipFailure(R.INVALID_FIELD, "the two halves of a key pair have one Cryptographic Length")
    length = private.get(A.CRYPTOGRAPHIC_LENGTH.value)
    lengths = (2048, 3072, 4096) if kind == "RSA" else (256, 384)
    if length is None:
        raise KmipFailure(R.MISSING_DATA, f"CreateKeyPair needs a Cryptographic Length ({LENGTHS[kind]})")
    if int(length) not in lengths:
        raise KmipFailure(R.INVALID_FIELD, f"{kind} key pairs are {LENGTHS[kind]} bits long")
    _, activation_date = activation_of(private)
    pair = call.engine.objects.create_key_pair(
        call.ctx, bits=int(length), private_name=private.get(A.NAME.value), public_name=public.get(A.NAME.value),
        activation_date=activation_date, algorithm=kind,
        private_attributes=_attributes(payload.common_template_attribute, payload.private_key_template_attribute,
                                       "private-key", kind),
        public_attributes=_attributes(payload.common_template_attribute, payload.public_key_template_attribute,
                                      "public-key", kind))
    return payloads.CreateKeyPairResponsePayload(private_key_unique_identifier=str(pair.private.id),
                                                 public_key_unique_identifier=str(pair.public.id))


def _attributes(common: Any, own: Any, kind: str, algorithm: str) -> dict[str, Any]:
    """One half's client attributes: its own template's over the common one's (a usage
    mask in its own template replaces the common one, as for every attribute)."""
    return {**attributes.template_client_attributes(common, kind, algorithm),
            **attributes.template_client_attributes(own, kind, algorithm)}
