"""Objects with a lifecycle of their own, besides managed keys: registered public keys,
key pairs generated in the HSM, secret data, certificates and opaque objects; their
sealed export, and Activate, Revoke and Destroy."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from hsm import (
    AES_KW,
    AES_KWP,
    HsmError,
    HsmIntegrityError,
    HsmInvalidInput,
    ImportedKey,
    SealedPrivateKey,
    WrappedKey,
)
from keyserver.core.audit import PendingRecord
from keyserver.core.errors import (
    Conflict,
    IntegrityFailure,
    InvalidInput,
    NotFound,
    ServiceUnavailable,
    hsm_failure,
)
from keyserver.core.keys import (
    COMPROMISE_REASONS,
    REVOCATION_REASONS,
    version_wrapped,
)
from keyserver.core.kmip_base import KmipObjectBase
from keyserver.core.kmip_model import (
    CERTIFICATE,
    EC_PAIR_CURVES,
    MAX_SECRET_BYTES,
    PRIVATE_KEY,
    RSA_PAIR_BITS,
    SEALED_TYPES,
    CreatedPair,
    StandaloneObject,
    VersionObject,
    audit_details,
    load_public_der,
    object_type_of,
    public_bits,
    usage_of,
    use_refusal,
)
from keyserver.core.kmip_sealed import UnsealError, seal, unseal
from keyserver.core.names import UUID_RE, check_name
from keyserver.core.permissions import Permission
from keyserver.core.principal import RequestContext
from keyserver.core.states import DESTROYED_STATES, RETRIEVABLE, KeyState, check_transition
from keyserver.core.usage import Usage
from keyserver.store.models import KmipPublicKey, KmipSealedObject
from keyserver.store.notify import Topic


class KmipRegistry(KmipObjectBase):
    # --- registered public keys -----------------------------------------------------
    def register_public_key(self, ctx: RequestContext, der: bytes, *, name: str | None,
                            attributes: dict[str, Any] | None = None,
                            activation_date: datetime | None = None,
                            deactivation_date: datetime | None = None) -> KmipPublicKey:
        """An RSA public key (for wrapped delivery and signature verification) or an EC
        one on P-256/P-384 (verification only). Pre-Active unless `activation_date` is
        not in the future, like every registered object (KMIP 1.4 §4.3)."""
        self._policy.require(ctx, Permission.KEYS_CREATE, action="kmip.register", object_type="public_key",
                             object_id=name)
        self._check_name(name)
        try:
            key = load_public_der(der)
        except ValueError:
            raise InvalidInput("the public key must be DER (SubjectPublicKeyInfo or PKCS#1)") from None
        public: rsa.RSAPublicKey | ec.EllipticCurvePublicKey
        if ((isinstance(key, rsa.RSAPublicKey) and key.key_size >= 2048)
                or (isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name in ("secp256r1", "secp384r1"))):
            public = key
        else:
            raise InvalidInput("public keys are RSA of at least 2048 bits or EC on P-256 or P-384")
        spki = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        now = self._now()
        state, activated = self._initial_state(now, activation_date, deactivation_date)
        row = KmipPublicKey(id=uuid.uuid4(), name=name, owner=ctx.principal.name, kmip_group=ctx.principal.kmip_group,
                            der=spki,
                            length_bits=public_bits(public), state=state.value, created_at=now,
                            activation_date=activated, deactivation_date=deactivation_date,
                            kmip_attributes=dict(attributes or {}))
        with self._db.begin() as s:
            s.add(row)
            self._audit.add(s, ctx, action="kmip.register", object_type="public_key", object_id=str(row.id),
                            details={"name": name, "algorithm": "EC" if isinstance(public, ec.EllipticCurvePublicKey)
                                     else "RSA", "bits": public_bits(public), "state": state.value})
        return row


    # --- keys registered wrapped (KMIP Register with Key Wrapping Data) ---------------
    @property
    def rsa_unwrap_mechanisms(self) -> frozenset[str]:
        """The RSA-OAEP mechanisms the token unwraps with (SoftHSM2 2.6: SHA-1 only)."""
        caps = self._hsm.capabilities
        return caps.rsa_unwrap_mechanisms or frozenset({caps.rsa_wrap_mechanism})

    def unwrap_for_import(self, ctx: RequestContext, uid: str, blob: bytes, *, secret: bool,
                          mechanism: str | None = None) -> tuple[ImportedKey, dict[str, Any]]:
        """A key a client wrapped under the object `uid` — an AES key version (`mechanism`
        AES Key Wrap with Padding, RFC 5649, the default, or AES_KW, RFC 3394) or an RSA
        private key (an RSA-OAEP `mechanism`, by default the token's own) — unwrapped inside
        the HSM and wrapped under the current KEK at once, for KeyService.create (`secret`:
        an HMAC key). The unwrapping key is used as Decrypt uses a key: Active or
        Deactivated (it processes, KMIP 1.4 §3.22), its usage mask allowing Unwrap Key, its
        dates allowing processing. Returns the key and what its audit record says of it."""
        target = self.resolve_for_export(ctx, uid, action="key.unwrap", permission=Permission.KEYS_DECRYPT)
        what = object_type_of(target)
        unwrapping: WrappedKey | SealedPrivateKey
        if isinstance(target, VersionObject) and target.key.algorithm == "AES":
            if mechanism not in (None, AES_KWP, AES_KW):
                raise InvalidInput(f"an AES key unwraps with {AES_KWP} or {AES_KW}, not {mechanism}")
            unwrapping, mechanism = version_wrapped(target.version), mechanism or AES_KWP
        elif isinstance(target, KmipSealedObject) and target.object_type == PRIVATE_KEY and \
                target.algorithm in (None, "RSA") and target.material and target.dek_ciphertext:
            assert target.dek_wrapping_key_id and target.dek_mechanism
            unwrapping = SealedPrivateKey(dek=WrappedKey(target.dek_wrapping_key_id, target.dek_mechanism,
                                                         target.dek_ciphertext), material=target.material)
            mechanism = mechanism or self.rsa_wrap_mechanism
        else:
            raise Conflict(f"a {what if not isinstance(target, VersionObject) else target.key.algorithm + ' key'} "
                           "cannot unwrap keys; use an AES key or an RSA private key", code="wrong_object_type")
        state = KeyState(target.version.state if isinstance(target, VersionObject) else target.state)
        if state not in (KeyState.ACTIVE, KeyState.DEACTIVATED):
            raise Conflict(f"the unwrapping {what} is {state.value}: unwrapping needs an Active or Deactivated key",
                           code="illegal_state")
        if not usage_of(target) & Usage.UNWRAP_KEY:
            raise Conflict(f"the unwrapping {what}'s Cryptographic Usage Mask does not allow Unwrap Key",
                           code="usage_not_allowed")
        if (refusal := use_refusal(target, "unwrap", self._now())) is not None:
            raise Conflict(refusal, code="illegal_state")
        try:
            imported = self._hsm.import_wrapped_key(blob, unwrapping=unwrapping, mechanism=mechanism,
                                                    kek_id=self._kek(), secret=secret)
        except HsmIntegrityError:
            raise IntegrityFailure() from None
        except HsmInvalidInput as exc:
            raise InvalidInput(str(exc)) from exc
        except HsmError as exc:
            raise hsm_failure("unwrap the key", exc) from exc
        return imported, {"wrapped": True, "unwrapped_by": uid, "unwrapping_key_name": audit_details(target)["name"],
                          "unwrapping_mechanism": mechanism}

    # --- key pairs, secret data, certificates ---------------------------------------
    def _kek(self) -> str:
        if self._current_kek is None:
            raise ServiceUnavailable("this server was built without a KEK source")
        return self._current_kek()

    def create_key_pair(
        self, ctx: RequestContext, *, bits: int, private_name: str | None, public_name: str | None,
        activation_date: datetime | None, private_attributes: dict[str, Any] | None = None,
        public_attributes: dict[str, Any] | None = None, algorithm: str = "RSA",
        deactivation_date: datetime | None = None,
    ) -> CreatedPair:
        """An RSA key pair (or `algorithm` "EC": `bits` 256 or 384, curve P-256 or P-384)
        generated in the HSM; the private key leaves it only sealed.
        Both halves are Pre-Active unless `activation_date` is not in the future."""
        self._policy.require(ctx, Permission.KEYS_CREATE, action="kmip.create_key_pair",
                             object_type="private_key", object_id=private_name)
        if algorithm == "EC" and bits not in EC_PAIR_CURVES:
            raise InvalidInput("EC key pairs are 256 (P-256) or 384 (P-384) bits long")
        if algorithm == "RSA" and bits not in RSA_PAIR_BITS:
            raise InvalidInput(f"RSA key pairs are {', '.join(map(str, sorted(RSA_PAIR_BITS)))} bits long")
        if algorithm not in ("RSA", "EC"):
            raise InvalidInput("key pairs are RSA or EC")
        self._check_name(private_name)
        self._check_name(public_name)
        try:
            with self._pair_slots:
                pair = (self._hsm.generate_wrapped_ec_pair(kek_id=self._kek(), curve=EC_PAIR_CURVES[bits])
                        if algorithm == "EC" else self._hsm.generate_wrapped_rsa_pair(kek_id=self._kek(), bits=bits))
        except HsmError as exc:
            raise hsm_failure("generate a key pair", exc) from exc
        now = self._now()
        state, activated = self._initial_state(now, activation_date, deactivation_date)
        private_id, public_id = uuid.uuid4(), uuid.uuid4()
        private = KmipSealedObject(
            id=private_id, object_type=PRIVATE_KEY, name=private_name, owner=ctx.principal.name, algorithm=algorithm,
            length_bits=bits, data_type="pkcs8", state=state.value, public_key_id=public_id,
            dek_wrapping_key_id=pair.dek.wrapping_key_id, dek_mechanism=pair.dek.mechanism,
            dek_ciphertext=pair.dek.ciphertext, mechanism=pair.mechanism, material=pair.private_key,
            created_at=now, updated_at=now, activation_date=activated, deactivation_date=deactivation_date,
            kmip_attributes=dict(private_attributes or {}), kmip_group=ctx.principal.kmip_group)
        public = KmipPublicKey(id=public_id, name=public_name, owner=ctx.principal.name, der=pair.public_key_der,
                               length_bits=bits, state=state.value, created_at=now, private_key_id=private_id,
                               activation_date=activated, deactivation_date=deactivation_date,
                               kmip_attributes=dict(public_attributes or {}), kmip_group=ctx.principal.kmip_group)
        with self._db.begin() as s:
            s.add_all([private, public])
            self._audit.add(s, ctx, action="kmip.create_key_pair", object_type="private_key",
                            object_id=str(private_id),
                            details={"public_key": str(public_id), "algorithm": algorithm, "bits": bits,
                                     "state": state.value,
                                     "private_name": private_name, "public_name": public_name})
        return CreatedPair(private=private, public=public)

    def register_object(
        self, ctx: RequestContext, *, object_type: str, material: bytes, name: str | None,
        data_type: str | None = None, algorithm: str | None = None, length_bits: int | None = None,
        activation_date: datetime | None = None, attributes: dict[str, Any] | None = None,
        deactivation_date: datetime | None = None,
    ) -> KmipSealedObject:
        """Register a private key (PKCS#8 DER), secret data, or a certificate (DER).
        Secret material is sealed at once; the caller validated its format."""
        self._policy.require(ctx, Permission.KEYS_CREATE, action="kmip.register",
                             object_type=object_type.replace("-", "_"), object_id=name)
        if object_type not in SEALED_TYPES:
            raise InvalidInput(f"cannot register a {object_type}")
        if not 1 <= len(material) <= MAX_SECRET_BYTES:
            raise InvalidInput(f"the object must be 1 to {MAX_SECRET_BYTES} bytes long")
        self._check_name(name)
        now = self._now()
        state, activated = self._initial_state(now, activation_date, deactivation_date)
        row = KmipSealedObject(id=uuid.uuid4(), object_type=object_type, name=name, owner=ctx.principal.name,
                               algorithm=algorithm, length_bits=length_bits, data_type=data_type,
                               state=state.value, created_at=now, updated_at=now, activation_date=activated,
                               deactivation_date=deactivation_date, kmip_attributes=dict(attributes or {}),
                               kmip_group=ctx.principal.kmip_group)
        if object_type == CERTIFICATE:
            row.material, row.mechanism = material, None  # public: kept as it is
        else:
            try:
                sealed = seal(self._hsm, material, kek_id=self._kek())
            except HsmError as exc:
                raise hsm_failure("seal the object", exc) from exc
            row.dek_wrapping_key_id, row.dek_mechanism = sealed.dek.wrapping_key_id, sealed.dek.mechanism
            row.dek_ciphertext, row.mechanism, row.material = sealed.dek.ciphertext, sealed.mechanism, sealed.material
        with self._db.begin() as s:
            s.add(row)
            self._audit.add(s, ctx, action="kmip.register", object_type=object_type.replace("-", "_"),
                            object_id=str(row.id),
                            details={"name": name, "bytes": len(material), "state": state.value,
                                     **({"type": data_type} if data_type else {})})
        return row

    def export_object(self, ctx: RequestContext, obj: KmipSealedObject) -> bytes:
        """A sealed object's plaintext (private key: PKCS#8 DER), or a certificate's DER.
        Secret material needs keys:export and is always audited, like key export."""
        audit_type = obj.object_type.replace("-", "_")
        if obj.object_type != CERTIFICATE:
            self._require(ctx, Permission.KEYS_EXPORT, "key.export", obj, str(obj.id))
        state = KeyState(obj.state)
        if state not in RETRIEVABLE:
            raise Conflict(f"the {obj.object_type} is {state.value}: its material is erased", code="key_destroyed")
        if obj.material is None:
            raise Conflict(f"the {obj.object_type} has no material (destroyed)", code="key_destroyed")
        if obj.object_type == CERTIFICATE:
            return obj.material
        assert obj.dek_wrapping_key_id and obj.dek_mechanism and obj.dek_ciphertext and obj.mechanism
        dek = WrappedKey(wrapping_key_id=obj.dek_wrapping_key_id, mechanism=obj.dek_mechanism,
                         ciphertext=obj.dek_ciphertext)
        try:
            plain = unseal(self._hsm, dek, obj.material, mechanism=obj.mechanism,
                           der=obj.object_type == PRIVATE_KEY)
        except (HsmIntegrityError, UnsealError):
            raise IntegrityFailure() from None
        except HsmError as exc:
            raise hsm_failure("open the object", exc) from exc
        self._audit.commit(PendingRecord(
            ctx=ctx, action="key.export", object_type=audit_type, object_id=str(obj.id),
            details={**audit_details(obj), "state": state.value, "plaintext": True}))
        return plain

    def transition(
        self, ctx: RequestContext, uid: str, *, operation: str, reason: str | None = None, message: str = "",
        compromise_date: datetime | None = None,
    ) -> StandaloneObject:
        """Activate, revoke or destroy a public key, private key, secret data or certificate.
        Each object has its own lifecycle (as in KMIP): revoking a private key does not
        revoke its public key. Revoke with a compromise reason → Compromised, otherwise
        Deactivated; Destroy needs a revoked (or never activated) object and erases sealed
        material."""
        permission = {"activate": Permission.KEYS_ACTIVATE, "revoke": Permission.KEYS_REVOKE,
                      "destroy": Permission.KEYS_DESTROY}[operation]
        with self._read() as s:
            subject = self._find(s, uid)
        # outside the read: a refusal is written in a transaction of its own (decision 0010)
        self._require(ctx, permission, f"kmip.{operation}", subject, uid)
        if operation == "revoke" and reason not in REVOCATION_REASONS:
            raise InvalidInput(f"reason must be one of: {', '.join(sorted(REVOCATION_REASONS))}")
        now = self._now()
        with self._db.begin() as s:
            obj: StandaloneObject | None = None
            if UUID_RE.match(uid):
                wanted = uuid.UUID(uid)
                obj = (s.get(KmipPublicKey, wanted, with_for_update=True)
                       or s.get(KmipSealedObject, wanted, with_for_update=True))
            if obj is None:
                raise NotFound(f"no KMIP object with unique identifier '{uid}'", code="object_not_found")
            current = KeyState(obj.state)
            what = f"{object_type_of(obj)} {uid}"
            if operation == "activate":
                target = KeyState.ACTIVE
            elif operation == "revoke":
                if reason in COMPROMISE_REASONS:
                    target = (KeyState.DESTROYED_COMPROMISED if current in DESTROYED_STATES
                              else KeyState.COMPROMISED)
                else:
                    target = KeyState.DEACTIVATED
            else:
                target = KeyState.DESTROYED_COMPROMISED if current is KeyState.COMPROMISED else KeyState.DESTROYED
            if operation == "revoke" and (current is target or (
                    target is KeyState.DEACTIVATED and current is KeyState.COMPROMISED)):
                # Revoked already (a compromise outranks any other reason): the request's
                # outcome holds, so it succeeds unchanged, and a client's "revoke, then
                # destroy" loop runs through every object it located.
                self._audit.add(s, ctx, action="kmip.revoke", object_type=object_type_of(obj).replace("-", "_"),
                                object_id=uid, details={"state": current.value, "unchanged": True,
                                                        "reason": reason})
                return obj
            check_transition(current, target, what=what)
            obj.state = target.value
            if target is KeyState.ACTIVE:
                obj.activation_date = now
            elif target is KeyState.DEACTIVATED:
                obj.deactivation_date = now
            elif target in (KeyState.COMPROMISED, KeyState.DESTROYED_COMPROMISED) and operation == "revoke":
                obj.compromise_date = compromise_date or now
            else:
                obj.destroy_date = now
                if isinstance(obj, KmipSealedObject) and obj.object_type != CERTIFICATE:
                    obj.material = obj.dek_ciphertext = None
            if operation == "revoke":
                obj.revocation_reason = reason
            if isinstance(obj, KmipSealedObject):
                obj.updated_at = now
            if self._notifier is not None:
                self._notifier.publish(s, Topic.KEYS)  # replicas drop what Get cached of it
            self._audit.add(s, ctx, action=f"kmip.{operation}", object_type=object_type_of(obj).replace("-", "_"),
                            object_id=uid, details={"state": target.value, "from": current.value,
                                                    **({"reason": reason, "message": message[:200]}
                                                       if operation == "revoke" else {})})
        return obj


    def _initial_state(self, now: datetime, activation_date: datetime | None,
                       deactivation_date: datetime | None = None) -> tuple[KeyState, datetime | None]:
        """State and Activation Date of a new object from its template's dates: a
        Deactivation Date already past makes it Deactivated at once (it may process,
        never protect), as the scheduler would have a moment later."""
        if activation_date is not None and deactivation_date is not None and deactivation_date <= activation_date:
            raise InvalidInput("the Deactivation Date must be after the Activation Date")
        if deactivation_date is not None and deactivation_date <= now:
            return KeyState.DEACTIVATED, activation_date
        if activation_date is not None and activation_date <= now:
            return KeyState.ACTIVE, now
        return KeyState.PRE_ACTIVE, activation_date

    @staticmethod
    def _check_name(name: str | None) -> None:
        if name is not None:
            check_name(name)

