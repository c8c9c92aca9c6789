"""Managed keys seen as KMIP objects: one object per key version.

A KMIP Unique Identifier is a `KeyVersion.id`, so ReKey gives a new identifier linked
to the old one, and a REST key's current version is a KMIP object at once (and a key
created over KMIP is a REST key). Lifecycle changes go through `KeyService`; this
module adds only what KMIP needs beyond it: resolving identifiers, Locate, key export
(plain or wrapped) and registered RSA public keys. Every call asks the policy layer.

The service is assembled from one room per concern: `kmip_model` (names, object kinds,
date and use rules), `kmip_base` (finding an object, the Get cache), `kmip_registry`
(registration and the lifecycle of objects that are not key versions),
`kmip_attribute_edits` (the attributes clients own); Locate and export are here.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, select

from hsm import HsmError, HsmIntegrityError, HsmInvalidInput
from hsm.backend import AES_KWP
from keyserver.core.audit import PendingRecord
from keyserver.core.errors import (
    Conflict,
    IntegrityFailure,
    InvalidInput,
    hsm_failure,
)
from keyserver.core.keys import (
    version_wrapped,
)
from keyserver.core.kmip_attribute_edits import KmipAttributeEdits
from keyserver.core.kmip_model import (
    CERTIFICATE,
    CONTACT_INFORMATION,
    MAX_LOCATE,
    OBJECT_GROUP,
    SCAN_LIMIT,
    SEALED_TYPES,
    ExportedKey,
    LocateQuery,
    VersionObject,
    audit_details,
    object_type_of,
    public_key_algorithm,
    use_refusal,
)
from keyserver.core.kmip_registry import KmipRegistry
from keyserver.core.kmip_tenancy import scoped
from keyserver.core.permissions import Permission
from keyserver.core.principal import RequestContext
from keyserver.core.states import DESTROYED_STATES, RETRIEVABLE, KeyState
from keyserver.store.models import KeyVersion, KmipPublicKey, KmipSealedObject, ManagedKey


class KmipObjectService(KmipRegistry, KmipAttributeEdits):
    """Resolving (KmipObjectBase), registration and lifecycle (KmipRegistry), client
    attributes (KmipAttributeEdits); Locate and key export here."""

    # --- Locate --------------------------------------------------------------------
    def locate(self, ctx: RequestContext, q: LocateQuery, *, nothing: bool = False) -> list[str]:
        """Unique identifiers matching every given criterion: symmetric keys newest
        version first within a key, keys by name, then public keys, then the others.
        Destroyed objects only when the query asks for a destroyed state (a client's
        "locate everything, revoke, destroy" loop must not meet what it destroyed)."""
        self._policy.require(ctx, Permission.KEYS_READ, action="kmip.locate")
        if (q.maximum_items is not None and q.maximum_items < 0) or q.offset_items < 0:
            raise InvalidInput("MaximumItems and OffsetItems must not be negative")
        end = q.offset_items + (q.maximum_items if q.maximum_items else MAX_LOCATE)
        hidden = [st.value for st in DESTROYED_STATES]
        by_attributes = q.object_group is not None or q.contact_information is not None

        def wanted(attrs: dict[str, Any] | None) -> bool:
            attrs = attrs or {}
            groups = attrs.get(OBJECT_GROUP) or []
            return ((q.object_group is None or q.object_group in groups)
                    and (q.contact_information is None or attrs.get(CONTACT_INFORMATION) == q.contact_information))

        # Attribute filters are applied here, over at most SCAN_LIMIT candidates per kind
        # (JSON containment differs between PostgreSQL and SQLite).
        limit = SCAN_LIMIT if by_attributes else end
        uids: list[str] = []
        # Tenancy filters in SQL, before the limit: paging counts only what the caller sees.
        readable = self._tenancy.readable(ctx.principal) if scoped(ctx.principal) else None
        with self._read() as s:
            if nothing:  # a criterion no object can meet (an unknown object type or algorithm)
                pass
            elif q.object_type in (None, "symmetric-key") and q.certificate_type is None and q.algorithm != "RSA":
                stmt: Select[Any] = select(KeyVersion.id, ManagedKey.kmip_attributes).join(ManagedKey).where(
                    self._tenancy.locate_filter(ctx.principal, readable, ManagedKey))
                if q.name is not None:
                    stmt = stmt.where(ManagedKey.name == q.name)
                if q.unique_identifier is not None:
                    stmt = stmt.where(KeyVersion.id == q.unique_identifier)
                stmt = stmt.where(KeyVersion.state == q.state.value) if q.state is not None else \
                    stmt.where(KeyVersion.state.not_in(hidden))
                if q.algorithm is not None:
                    stmt = stmt.where(ManagedKey.algorithm == q.algorithm)
                if q.length_bits is not None:
                    stmt = stmt.where(ManagedKey.length_bits == q.length_bits)
                stmt = stmt.order_by(ManagedKey.name, ManagedKey.created_at, KeyVersion.version.desc())
                uids.extend(str(i) for i, attrs in s.execute(stmt.limit(limit)) if wanted(attrs))
            if not nothing and q.object_type in (None, "public-key") and q.certificate_type is None \
                    and q.algorithm in (None, "RSA", "EC"):
                pstmt: Select[Any] = select(KmipPublicKey.id, KmipPublicKey.kmip_attributes).order_by(
                    KmipPublicKey.created_at).where(self._tenancy.locate_filter(ctx.principal, readable, KmipPublicKey))
                pstmt = pstmt.where(KmipPublicKey.state == q.state.value) if q.state is not None else \
                    pstmt.where(KmipPublicKey.state.not_in(hidden))
                if q.name is not None:
                    pstmt = pstmt.where(KmipPublicKey.name == q.name)
                if q.unique_identifier is not None:
                    pstmt = pstmt.where(KmipPublicKey.id == q.unique_identifier)
                if q.length_bits is not None:
                    pstmt = pstmt.where(KmipPublicKey.length_bits == q.length_bits)
                if q.algorithm is not None:  # no algorithm column: RSA keys are >= 2048 bits, EC ones 256/384
                    pstmt = pstmt.where(KmipPublicKey.length_bits < 1024 if q.algorithm == "EC"
                                        else KmipPublicKey.length_bits >= 1024)
                uids.extend(str(i) for i, attrs in s.execute(pstmt.limit(limit)) if wanted(attrs))
            if not nothing and (q.object_type is None or q.object_type in SEALED_TYPES):
                sstmt: Select[Any] = select(KmipSealedObject.id, KmipSealedObject.kmip_attributes).order_by(
                    KmipSealedObject.created_at).where(
                    self._tenancy.locate_filter(ctx.principal, readable, KmipSealedObject))
                if q.object_type is not None:
                    sstmt = sstmt.where(KmipSealedObject.object_type == q.object_type)
                if q.certificate_type is not None:
                    sstmt = sstmt.where(KmipSealedObject.object_type == CERTIFICATE,
                                        KmipSealedObject.data_type == q.certificate_type)
                if q.name is not None:
                    sstmt = sstmt.where(KmipSealedObject.name == q.name)
                if q.unique_identifier is not None:
                    sstmt = sstmt.where(KmipSealedObject.id == q.unique_identifier)
                sstmt = sstmt.where(KmipSealedObject.state == q.state.value) if q.state is not None else \
                    sstmt.where(KmipSealedObject.state.not_in(hidden))
                if q.algorithm is not None:
                    sstmt = sstmt.where(KmipSealedObject.algorithm == q.algorithm)
                if q.length_bits is not None:
                    sstmt = sstmt.where(KmipSealedObject.length_bits == q.length_bits)
                uids.extend(str(i) for i, attrs in s.execute(sstmt.limit(limit)) if wanted(attrs))
        found = uids[q.offset_items:end]
        self._audit.commit(PendingRecord(ctx=ctx, action="kmip.locate", details={
            "criteria": q.criteria(), "found": len(found)}))
        return found

    # --- key material out ----------------------------------------------------------
    def export(self, ctx: RequestContext, obj: VersionObject, *, wrap_under: str | None = None) -> ExportedKey:
        """A key version's material (`obj` from `resolve`), in plaintext or wrapped
        (inside the HSM) under a registered RSA public key. Always audited."""
        self._require(ctx, Permission.KEYS_EXPORT if wrap_under is None else Permission.KEYS_EXPORT_WRAPPED,
                      "key.export", obj, obj.uid)
        if wrap_under is None and not obj.key.exportable:
            self._policy.deny(ctx, action="key.export", object_type="key", object_id=str(obj.key.id),
                              details={"reason": "not_exportable", "version": obj.version.version},
                              message=f"key '{obj.key.name}' is not exportable in plaintext (its policy); Get it "
                                      "wrapped under another key (a Key Wrapping Specification), or have a key "
                                      "officer change the policy")
        if wrap_under is None and self._approvals is not None and self._approvals.holds("key.export") and \
                not self._approvals.take_grant(ctx, action="key.export", target=str(obj.key.id)):
            self._approvals.hold(ctx, action="key.export", target=str(obj.key.id),
                                 params={"key": str(obj.key.id), "name": obj.key.name, "version": obj.version.version})
        state = KeyState(obj.version.state)
        if state not in RETRIEVABLE:
            raise Conflict(f"version {obj.version.version} of '{obj.key.name}' is {state.value}: "
                           "its material is erased", code="key_destroyed")
        wrapped = version_wrapped(obj.version)
        details: dict[str, object] = {**audit_details(obj), "state": state.value}
        try:
            hmac = obj.key.algorithm != "AES"
            if wrap_under is None:
                material = (self._hsm.unwrap_secret if hmac else self._hsm.unwrap_key)(wrapped)
                mechanism = None
            elif hmac:
                raise InvalidInput("HMAC keys are delivered in plaintext (with keys:export) only, not wrapped")
            else:
                target = self.resolve_for_export(ctx, wrap_under, right="use")
                if isinstance(target, VersionObject) and target.key.algorithm != "AES":
                    raise Conflict("an HMAC key cannot wrap keys", code="wrong_object_type")
                refusal = use_refusal(target, "wrap", self._now())
                if refusal is not None:
                    raise Conflict(refusal, code="illegal_state")
                if isinstance(target, VersionObject):
                    # AES key wrap inside the token, under an Active AES key version.
                    if KeyState(target.version.state) is not KeyState.ACTIVE:
                        raise Conflict("the wrapping key must be active", code="illegal_state")
                    material = self._hsm.wrap_with_key(wrapped, wrapping=version_wrapped(target.version))
                    mechanism = AES_KWP
                elif isinstance(target, KmipPublicKey):
                    if public_key_algorithm(target) != "RSA":
                        raise Conflict("an EC public key cannot wrap keys (ECDSA only); use an RSA public key or "
                                       "an AES key", code="wrong_object_type")
                    if KeyState(target.state) is not KeyState.ACTIVE:
                        raise Conflict("the wrapping key must be active", code="illegal_state")
                    rewrapped = self._hsm.rewrap_for_public_key(wrapped, public_key_der=target.der)
                    material, mechanism = rewrapped.ciphertext, rewrapped.mechanism
                else:
                    raise Conflict(f"a {object_type_of(target)} cannot wrap keys", code="wrong_object_type")
                details.update(wrapped_under=wrap_under, mechanism=mechanism)
        except HsmIntegrityError:
            raise IntegrityFailure() from None
        except HsmInvalidInput as exc:
            raise InvalidInput(str(exc)) from exc
        except HsmError as exc:
            raise hsm_failure("export the key", exc) from exc
        details["plaintext"] = mechanism is None
        # Committed before the material is returned: no key leaves without its record.
        self._audit.commit(PendingRecord(ctx=ctx, action="key.export", object_type="key",
                                                  object_id=str(obj.key.id), details=details))
        return ExportedKey(obj=obj, material=material, wrapping_mechanism=mechanism)

