"""One module per KMIP operation; each has OPERATION and handle(call, payload)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from kmip.core import enums

from keyserver.kmip.context import Call
from keyserver.kmip.operations import (
    activate,
    add_attribute,
    create,
    create_key_pair,
    decrypt,
    delete_attribute,
    destroy,
    discover_versions,
    encrypt,
    get,
    get_attribute_list,
    get_attributes,
    locate,
    mac,
    mac_verify,
    modify_attribute,
    query,
    register,
    rekey,
    revoke,
    rng_retrieve,
    sign,
    signature_verify,
)

Handler = Callable[[Call, Any], Any]
_MODULES: tuple[ModuleType, ...] = (
    discover_versions, query, create, create_key_pair, get, get_attributes, get_attribute_list, locate, activate,
    revoke, destroy, rekey, register, add_attribute, modify_attribute, delete_attribute,
    encrypt, decrypt, sign, signature_verify, mac, mac_verify, rng_retrieve,
)
REGISTRY: dict[enums.Operation, Handler] = {m.OPERATION: m.handle for m in _MODULES}
