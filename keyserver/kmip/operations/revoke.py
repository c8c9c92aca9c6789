"""Revoke: with a compromise reason every version becomes Compromised; otherwise the
usable versions are deactivated. Revocation applies to the whole managed key (all its
versions), as the REST `revoke` does, so the two protocols never disagree. Key pairs,
secret data and certificates are revoked one object at a time, as KMIP has it. Revoking
what is revoked already (Deactivated, or Compromised whatever the reason) succeeds and
changes nothing: a client's "locate, revoke, destroy" clean-up loop runs through."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kmip.core import enums
from kmip.core.attributes import UniqueIdentifier
from kmip.core.messages import payloads

from keyserver.core.kmip_model import VersionObject
from keyserver.kmip.context import Call, request_uid
from keyserver.kmip.errors import KmipFailure

OPERATION = enums.Operation.REVOKE
C = enums.RevocationReasonCode
REASONS = {
    C.UNSPECIFIED: "unspecified", C.KEY_COMPROMISE: "key-compromise", C.CA_COMPROMISE: "ca-compromise",
    C.AFFILIATION_CHANGED: "affiliation-changed", C.SUPERSEDED: "superseded",
    C.CESSATION_OF_OPERATION: "cessation-of-operation", C.PRIVILEGE_WITHDRAWN: "privilege-withdrawn",
}


def handle(call: Call, payload: Any) -> Any:
    reason = payload.revocation_reason
    if reason is None:
        raise KmipFailure(enums.ResultReason.MISSING_DATA, "Revoke needs a revocation reason")
    uid = request_uid(payload)
    message = str(reason.revocation_message.value) if reason.revocation_message is not None else ""
    occurred = payload.compromise_occurrence_date
    when = datetime.fromtimestamp(int(occurred.value), UTC) if occurred is not None else None
    code = REASONS[reason.revocation_code.value]
    ref = call.engine.objects.version_ref(call.ctx, uid)
    if ref is not None:
        call.engine.keys.revoke(call.ctx, str(ref.key_id), reason=code, message=message[:1000],
                                compromise_date=when, idempotent=True)
        return payloads.RevokeResponsePayload(unique_identifier=UniqueIdentifier(uid))
    obj = call.engine.objects.resolve(call.ctx, uid, right="destroy")
    if not isinstance(obj, VersionObject):
        call.engine.objects.transition(call.ctx, uid, operation="revoke", reason=code, message=message[:1000],
                                       compromise_date=when)
    else:
        call.engine.keys.revoke(call.ctx, str(obj.key.id), reason=code, message=message[:1000],
                                compromise_date=when, idempotent=True)
    return payloads.RevokeResponsePayload(unique_identifier=UniqueIdentifier(uid))
