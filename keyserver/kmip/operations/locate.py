"""Locate: by Unique Identifier (that object, if it meets the rest), Name,
Object Type, State, Cryptographic Algorithm and Length, Object Group,
Contact Information and Certificate Type, with paging by MaximumItems/OffsetItems.
Within a key, the newest version comes first. Destroyed objects are found only by
asking for their state. Audited (kmip.locate, with the criteria and the count)."""

from __future__ import annotations

import uuid
from typing import Any

from kmip.core import enums
from kmip.core.messages import payloads

from keyserver.core.kmip_model import CONTACT_INFORMATION, OBJECT_GROUP, LocateQuery
from keyserver.kmip import attributes
from keyserver.kmip.context import Call
from keyserver.kmip.errors import KmipFailure

OPERATION = enums.Operation.LOCATE
A = enums.AttributeType
OBJECT_TYPES = {enums.ObjectType.SYMMETRIC_KEY: "symmetric-key", enums.ObjectType.PUBLIC_KEY: "public-key",
                enums.ObjectType.PRIVATE_KEY: "private-key", enums.ObjectType.SECRET_DATA: "secret-data",
                enums.ObjectType.CERTIFICATE: "certificate", enums.ObjectType.OPAQUE_DATA: "opaque-object"}
ALGORITHMS = {enums.CryptographicAlgorithm.AES: "AES", enums.CryptographicAlgorithm.RSA: "RSA",
              enums.CryptographicAlgorithm.EC: "EC", enums.CryptographicAlgorithm.ECDSA: "EC",
              enums.CryptographicAlgorithm.HMAC_SHA256: "HMAC-SHA256",
              enums.CryptographicAlgorithm.HMAC_SHA384: "HMAC-SHA384",
              enums.CryptographicAlgorithm.HMAC_SHA512: "HMAC-SHA512"}
CERTIFICATE_TYPES = {enums.CertificateType.X_509: "x509"}
SUPPORTED = {A.UNIQUE_IDENTIFIER.value,
             A.NAME.value, A.OBJECT_TYPE.value, A.STATE.value, A.CRYPTOGRAPHIC_ALGORITHM.value,
             A.CRYPTOGRAPHIC_LENGTH.value, OBJECT_GROUP, CONTACT_INFORMATION, A.CERTIFICATE_TYPE.value}


def handle(call: Call, payload: Any) -> Any:
    if payload.storage_status_mask or payload.object_group_member:
        raise KmipFailure(enums.ResultReason.FEATURE_NOT_SUPPORTED,
                          "Locate by storage status or Object Group Member (KMIP 1.3+) is not supported; "
                          "Locate by the Object Group attribute is")
    for attr in payload.attributes or []:
        name = str(attr.attribute_name.value)
        if name not in SUPPORTED:
            raise KmipFailure(enums.ResultReason.FEATURE_NOT_SUPPORTED,
                              f"Locate by '{name}' is not supported; use {', '.join(sorted(SUPPORTED))}")
    values = attributes.attribute_values(payload.attributes or [])
    object_type = values.get(A.OBJECT_TYPE.value)
    algorithm = values.get(A.CRYPTOGRAPHIC_ALGORITHM.value)
    certificate_type = values.get(A.CERTIFICATE_TYPE.value)
    state = values.get(A.STATE.value)
    uid = _uid(values.get(A.UNIQUE_IDENTIFIER.value))
    no_match = ((object_type is not None and object_type not in OBJECT_TYPES)
                or (algorithm is not None and algorithm not in ALGORITHMS)
                or (certificate_type is not None and certificate_type not in CERTIFICATE_TYPES)
                or uid == NO_OBJECT)
    query = LocateQuery(
        name=values.get(A.NAME.value),
        object_type=OBJECT_TYPES.get(object_type) if object_type is not None else None,
        state=attributes.KMIP_TO_STATE[state] if state is not None else None,
        algorithm=ALGORITHMS.get(algorithm) if algorithm is not None else None,
        length_bits=values.get(A.CRYPTOGRAPHIC_LENGTH.value),
        object_group=_text(values.get(OBJECT_GROUP)),
        contact_information=_text(values.get(CONTACT_INFORMATION)),
        certificate_type=CERTIFICATE_TYPES.get(certificate_type) if certificate_type is not None else None,
        unique_identifier=uid,
        maximum_items=payload.maximum_items, offset_items=payload.offset_items or 0,
    )
    # A value no object can have still asks the permission and leaves its audit record.
    uids = call.engine.objects.locate(call.ctx, query, nothing=no_match)
    return payloads.LocateResponsePayload(unique_identifiers=uids)


def _uid(value: Any) -> uuid.UUID | None:
    """The Unique Identifier criterion (None when absent); NO_OBJECT when no object can
    have it (every identifier of ours is a UUID)."""
    if value is None:
        return None
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return NO_OBJECT


NO_OBJECT = uuid.UUID(int=0)  # no object has the nil UUID


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
