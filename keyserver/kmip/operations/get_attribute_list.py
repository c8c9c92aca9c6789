"""GetAttributeList: the names of the attributes one object has."""

from __future__ import annotations

from typing import Any

from kmip.core import enums
from kmip.core.messages import payloads

from keyserver.kmip import attributes
from keyserver.kmip.context import Call, request_uid

OPERATION = enums.Operation.GET_ATTRIBUTE_LIST


def handle(call: Call, payload: Any) -> Any:
    uid = request_uid(payload)
    values = attributes.values_of(call.engine.objects.resolve(call.ctx, uid))
    return payloads.GetAttributeListResponsePayload(unique_identifier=uid, attribute_names=list(values))
