"""GetAttributeList: the names of the attributes one object has. Audited like every
operation (kmip.get_attribute_list)."""

from __future__ import annotations

from typing import Any

from kmip.core import enums
from kmip.core.messages import payloads

from keyserver.kmip import attributes
from keyserver.kmip.context import Call, request_uid

OPERATION = enums.Operation.GET_ATTRIBUTE_LIST


def handle(call: Call, payload: Any) -> Any:
    uid = request_uid(payload)
    values = attributes.values_of(call.engine.objects.read(call.ctx, uid, action="kmip.get_attribute_list"))
    return payloads.GetAttributeListResponsePayload(unique_identifier=uid, attribute_names=list(values))
