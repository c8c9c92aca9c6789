"""Activate: a Pre-Active key version becomes Active (through KeyService, which refuses a
replaced version); other objects (key pairs, secret data, certificates) through their
own lifecycle."""

from __future__ import annotations

from typing import Any

from kmip.core import enums
from kmip.core.attributes import UniqueIdentifier
from kmip.core.messages import payloads

from keyserver.core.kmip_model import VersionObject
from keyserver.kmip.context import Call, request_uid

OPERATION = enums.Operation.ACTIVATE


def handle(call: Call, payload: Any) -> Any:
    uid = request_uid(payload)
    ref = call.engine.objects.version_ref(call.ctx, uid)
    if ref is not None:
        call.engine.keys.activate(call.ctx, str(ref.key_id), version=ref.version)
        return payloads.ActivateResponsePayload(unique_identifier=UniqueIdentifier(uid))
    found = call.engine.objects.resolve(call.ctx, uid, right="manage")
    if isinstance(found, VersionObject):
        call.engine.keys.activate(call.ctx, str(found.key.id), version=found.version.version)
    else:
        call.engine.objects.transition(call.ctx, uid, operation="activate")
    return payloads.ActivateResponsePayload(unique_identifier=UniqueIdentifier(uid))
