"""The attributes KMIP clients own (Name, Contact Information, Object Group, Application
Specific Information, custom `x-` ones): AddAttribute, ModifyAttribute, DeleteAttribute."""

from __future__ import annotations

from typing import Any

from keyserver.core.errors import (
    Conflict,
    InvalidInput,
    NotFound,
)
from keyserver.core.keys import (
    validate_tags,
)
from keyserver.core.kmip_base import KmipObjectBase
from keyserver.core.kmip_model import (
    APPLICATION_SPECIFIC_INFORMATION,
    CLIENT_ATTRIBUTES,
    MAX_INSTANCES,
    MAX_TEXT,
    MULTI_INSTANCE,
    NAME,
    VersionObject,
    audit_details,
    audit_identity,
)
from keyserver.core.names import check_name
from keyserver.core.permissions import Permission
from keyserver.core.principal import RequestContext
from keyserver.store.models import KmipPublicKey, KmipSealedObject, ManagedKey
from keyserver.store.notify import Topic


class KmipAttributeEdits(KmipObjectBase):
    # --- attributes clients set -------------------------------------------------------
    def change_attribute(
        self, ctx: RequestContext, uid: str, *, operation: str, name: str, value: Any = None, index: int = 0,
    ) -> Any:
        """Add, modify or delete one instance of an attribute clients own: Name, Contact
        Information, Object Group, Application Specific Information, or a custom `x-`
        one (a symmetric key's custom attributes are its REST tags). Returns the value
        added or set, or the one deleted. Values: text, or for Application Specific
        Information a dict with `namespace` and `data`."""
        if operation not in ("add", "modify", "delete"):
            raise InvalidInput(f"unknown attribute operation '{operation}'")
        action = f"kmip.{operation}_attribute"
        with self._read() as s:
            found = self._find(s, uid)
        self._require(ctx, Permission.KEYS_UPDATE, action, found, uid)
        if found is None:
            raise NotFound(f"no KMIP object with unique identifier '{uid}'", code="object_not_found")
        if name not in CLIENT_ATTRIBUTES and not name.startswith("x-"):
            raise InvalidInput(f"'{name}' cannot be changed by a client")
        if operation != "delete":
            value = _checked_value(name, value)
        now = self._now()
        row: ManagedKey | KmipPublicKey | KmipSealedObject | None
        with self._db.begin() as s:
            if isinstance(found, VersionObject):
                row = s.get(ManagedKey, found.key.id, with_for_update=True)
            elif isinstance(found, KmipPublicKey):
                row = s.get(KmipPublicKey, found.id, with_for_update=True)
            else:
                row = s.get(KmipSealedObject, found.id, with_for_update=True)
            if row is None:
                raise NotFound(f"no KMIP object with unique identifier '{uid}'", code="object_not_found")
            result = _apply_attribute(row, operation, name, value, index)
            if isinstance(row, ManagedKey):
                row.updated_at, row.revision = now, row.revision + 1
            elif isinstance(row, KmipSealedObject):
                row.updated_at = now
            if self._notifier is not None:
                self._notifier.publish(s, Topic.KEYS)  # replicas drop what Get cached of it
            object_type, object_id = audit_identity(found)
            self._audit.add(s, ctx, action=action, object_type=object_type, object_id=object_id,
                            details={**audit_details(found), "attribute": name, "index": index})
        return result


def _checked_value(name: str, value: Any) -> Any:
    if name == NAME:
        return check_name(value)
    if name == APPLICATION_SPECIFIC_INFORMATION:
        if (not isinstance(value, dict) or not isinstance(value.get("namespace"), str)
                or not isinstance(value.get("data"), str) or not 1 <= len(value["namespace"]) <= 256
                or len(value["data"]) > MAX_TEXT):
            raise InvalidInput("Application Specific Information is a namespace (1-256 characters) and "
                               f"data (at most {MAX_TEXT} characters)")
        return {"namespace": value["namespace"], "data": value["data"]}
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_TEXT:
        raise InvalidInput(f"'{name}' takes a text value of 1 to {MAX_TEXT} characters")
    return value


def _apply_attribute(row: ManagedKey | KmipPublicKey | KmipSealedObject, operation: str, name: str,
                     value: Any, index: int) -> Any:
    """Change `row` in place; the value added/set or deleted. Conflict when adding a
    second instance of a single-instance attribute, NotFound for a missing instance."""
    missing = NotFound(f"the object has no attribute '{name}' at index {index}", code="attribute_not_found")
    if name == NAME:
        if index != 0:
            raise missing
        current = row.name
        if operation == "add" and current is not None:
            raise Conflict(f"the object has a {NAME} already; use ModifyAttribute to change it",
                           code="attribute_exists")
        if operation != "add" and current is None:
            raise missing
        if operation == "delete":
            if isinstance(row, ManagedKey):
                raise Conflict("a managed key always has a name: modify it instead", code="illegal_state")
            row.name = None
            return current
        row.name = value
        return value
    if isinstance(row, ManagedKey) and name.startswith("x-"):
        tags = dict(row.tags)
        store: dict[str, Any] = {f"x-{k}": v for k, v in tags.items()}
    else:
        store = dict(row.kmip_attributes or {})
    if name in MULTI_INSTANCE:
        instances = list(store.get(name) or [])
        if operation == "add":
            if len(instances) >= MAX_INSTANCES:
                raise InvalidInput(f"at most {MAX_INSTANCES} instances of '{name}'")
            instances.append(value)
            result = value
        else:
            if not 0 <= index < len(instances):
                raise missing
            result = instances[index] if operation == "delete" else value
            if operation == "delete":
                del instances[index]
            else:
                instances[index] = value
        store[name] = instances
        if not instances:
            del store[name]
    else:
        if index != 0:
            raise missing
        if operation == "add" and name in store:
            raise Conflict(f"the object has the attribute '{name}' already; use ModifyAttribute to change it",
                           code="attribute_exists")
        if operation != "add" and name not in store:
            raise missing
        result = store.pop(name) if operation == "delete" else value
        if operation != "delete":
            store[name] = value
    if isinstance(row, ManagedKey) and name.startswith("x-"):
        row.tags = validate_tags({k[2:]: v for k, v in store.items()})
    else:
        row.kmip_attributes = store
    return result
