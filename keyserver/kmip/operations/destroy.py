"""Destroy: erase one key version's material, or a private key's or secret data's
(metadata stays). An Active object must be revoked first (KMIP 1.4 §4.21).

Under the two-person rule (key.destroy held) a Destroy waits for approval: the client
is answered Permission Denied naming the request (core/approvals.py ApprovalPending),
and once a person approves it in the console or over REST the destroy runs as this
client. A Destroy that could never run (the version Active, or destroyed already —
also the client asking again after it ran) is refused before anything is held, with
the answer it gets without the rule. A version still in use (core/inventory.py) is
refused with Permission Denied and the holders counted in the reason: KMIP never shreds."""

from __future__ import annotations

from typing import Any

from kmip.core import enums
from kmip.core.attributes import UniqueIdentifier
from kmip.core.messages import payloads

from keyserver.core.errors import Conflict
from keyserver.core.kmip_model import VersionObject
from keyserver.core.states import DESTROYED_STATES, KeyState, check_transition
from keyserver.kmip.context import Call, request_uid
from keyserver.kmip.errors import KmipFailure

OPERATION = enums.Operation.DESTROY


def _could_run(obj: VersionObject) -> None:
    current = KeyState(obj.version.state)
    if current in DESTROYED_STATES:
        raise Conflict(f"key '{obj.key.name}' is already destroyed", code="illegal_state")
    check_transition(current, KeyState.DESTROYED_COMPROMISED if current is KeyState.COMPROMISED
                     else KeyState.DESTROYED, what=f"version {obj.version.version} of '{obj.key.name}'")


def handle(call: Call, payload: Any) -> Any:
    uid = request_uid(payload)
    obj = call.engine.objects.resolve(call.ctx, uid, right="destroy")
    if not isinstance(obj, VersionObject):
        call.engine.objects.transition(call.ctx, uid, operation="destroy")
        return payloads.DestroyResponsePayload(unique_identifier=UniqueIdentifier(uid))
    _could_run(obj)
    try:
        call.engine.keys.destroy(call.ctx, str(obj.key.id), version=obj.version.version)
    except Conflict as exc:
        if exc.code != "version_in_use":
            raise
        # Object in use (decision 0024): refused, never shredded over KMIP; the refusal is audited.
        held = "; ".join(str(h["name"]) for h in (exc.errors or [])[:5])
        raise KmipFailure(enums.ResultReason.PERMISSION_DENIED, (
            f"object in use: version {obj.version.version} of '{obj.key.name}' still protects data ({held}); "
            "retire the version first (its inventory: GET /api/v1/keys/{key}/versions/{n}/inventory)")) from None
    return payloads.DestroyResponsePayload(unique_identifier=UniqueIdentifier(uid))
