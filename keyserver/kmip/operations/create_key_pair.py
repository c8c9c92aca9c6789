"""CreateKeyPair: an RSA key pair (2048, 3072 or 4096 bits) or an EC one (Cryptographic
Algorithm EC or ECDSA; Cryptographic Length 256 for P-256, 384 for P-384; PyKMIP 0.11
cannot carry Recommended Curve) generated inside the HSM.
The private key leaves the token only sealed (AES Key Wrap with Padding under its own
AES key, which is wrapped under the KEK); the public key is stored as it is and can be
fetched with Get and used to wrap keys. Both halves are Pre-Active unless the templates
carry an Activation Date not in the future, and each names the other in a custom
attribute (x-strongroom-linked-public-key / x-strongroom-linked-private-key)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kmip.core import enums
from kmip.core.messages import payloads

from keyserver.core.kmip_model import CRYPTOGRAPHIC_PARAMETERS
from keyserver.kmip import attributes, cryptoparams
from keyserver.kmip.context import Call
from keyserver.kmip.errors import KmipFailure

OPERATION = enums.Operation.CREATE_KEY_PAIR
A = enums.AttributeType
R = enums.ResultReason
# EC and ECDSA name one kind of key pair (ECDSA is what it is for: Sign / SignatureVerify).
ALGORITHMS = {enums.CryptographicAlgorithm.RSA: "RSA", enums.CryptographicAlgorithm.EC: "EC",
              enums.CryptographicAlgorithm.ECDSA: "EC"}
LENGTHS = {"RSA": "2048, 3072 or 4096", "EC": "256 (P-256) or 384 (P-384)"}


def handle(call: Call, payload: Any) -> Any:
    templates = [attributes.read_template(t, half, object_type=kind) for t, half, kind in (
        (payload.common_template_attribute, "private-key", None),
        (payload.private_key_template_attribute, "private-key", enums.ObjectType.PRIVATE_KEY),
        (payload.public_key_template_attribute, "public-key", enums.ObjectType.PUBLIC_KEY))]
    common, own_private, own_public = templates
    if A.OBJECT_TYPE.value in common.values:
        raise KmipFailure(R.INVALID_FIELD, "the common template names no Object Type (the halves' templates may)")
    private = {**common.values, **own_private.values}
    public = {**common.values, **own_public.values}
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
    # One lifecycle for both halves at creation: dates that differ are refused, not half applied.
    dates = []
    for date in (A.ACTIVATION_DATE.value, A.DEACTIVATION_DATE.value):
        if private.get(date) != public.get(date):
            raise KmipFailure(R.INVALID_FIELD, f"the two halves of a key pair are created with one {date}; "
                                               "change one half's lifecycle afterwards")
        dates.append(datetime.fromtimestamp(int(private[date]), UTC) if private.get(date) is not None else None)
    if dates[0] is not None and dates[1] is not None and dates[1] <= dates[0]:
        raise KmipFailure(R.INVALID_FIELD, "the Deactivation Date must be after the Activation Date")
    halves = {}
    for half, own in (("private-key", own_private), ("public-key", own_public)):
        parameters = own.parameters or common.parameters
        cryptoparams.check_defaults(parameters, kind)
        halves[half] = {**_attributes(payload.common_template_attribute, payload.private_key_template_attribute
                                      if half == "private-key" else payload.public_key_template_attribute,
                                      half, kind),
                        **({CRYPTOGRAPHIC_PARAMETERS: parameters} if parameters else {}),
                        **common.custom, **own.custom}
    pair = call.engine.objects.create_key_pair(
        call.ctx, bits=int(length), private_name=private.get(A.NAME.value), public_name=public.get(A.NAME.value),
        activation_date=dates[0], deactivation_date=dates[1], algorithm=kind,
        private_attributes=halves["private-key"], public_attributes=halves["public-key"])
    return payloads.CreateKeyPairResponsePayload(private_key_unique_identifier=str(pair.private.id),
                                                 public_key_unique_identifier=str(pair.public.id))


def _attributes(common: Any, own: Any, kind: str, algorithm: str) -> dict[str, Any]:
    """One half's client attributes: its own template's over the common one's (a usage
    mask in its own template replaces the common one, as for every attribute)."""
    return {**attributes.template_client_attributes(common, kind, algorithm),
            **attributes.template_client_attributes(own, kind, algorithm)}
