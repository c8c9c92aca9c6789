"""Keys a caller brings wrapped (KMIP Register with Key Wrapping Data, PKCS#11's
C_UnwrapKey): unwrapped inside the token under the key that wrapped them, and wrapped
at once under a KEK. The plaintext exists only as a sensitive session object."""

from __future__ import annotations

from typing import Any, Final

from pkcs11 import Attribute, KeyType, Mechanism, ObjectClass
from pkcs11 import exceptions as p11

from hsm import faults, mechanisms
from hsm.backend import AES_KW, AES_KWP, RSA_OAEP_SHA1, RSA_OAEP_SHA256, ImportedKey, SealedPrivateKey, WrappedKey
from hsm.errors import HsmIntegrityError, HsmInvalidInput
from hsm.faults import Fault
from hsm.handles import AesUnwrapView, RsaPrivateView
from hsm.pkcs11.common import (
    AES_WRAPPING_TEMPLATE,
    INTEGRITY_MESSAGE,
    AesWrapView,
    Lease,
    destroy_quietly,
    integrity_error,
)
from hsm.pkcs11.core import Pkcs11Core

# A client private key opened for one C_UnwrapKey: it unwraps and does nothing else.
_UNWRAPPING_PRIVATE_TEMPLATE: Final = {**mechanisms.opened_private_template(KeyType.RSA), Attribute.SIGN: False,
                                       Attribute.DECRYPT: False, Attribute.UNWRAP: True}
_AES_WRAPS: Final = {AES_KWP: Mechanism.AES_KEY_WRAP_PAD, AES_KW: Mechanism.AES_KEY_WRAP}
AES_BYTES: Final = frozenset({16, 24, 32})
HMAC_BYTES: Final = frozenset(range(16, 129, 8))  # as measured: whole 8-byte blocks


def _measure(session: Any, key: Any) -> int:
    """The unwrapped key's length in bytes, rounded up to a whole 8-byte block, learnt
    without reading it: tokens leave CKA_VALUE_LEN of an unwrapped key unset (SoftHSM2
    answers 0) and do not check an AES key's length on unwrap, so the key is wrapped once
    with CKM_AES_KEY_WRAP_PAD (RFC 5649: 8 bytes more than the key padded to 8) under a
    throw-away session key, and the output dropped."""
    probe = session.generate_key(KeyType.AES, mechanisms.DATA_KEY_BITS, capabilities=0,
                                 template=dict(AES_WRAPPING_TEMPLATE))
    try:
        return len(AesWrapView(session, probe.handle).wrap_key(key, mechanism=Mechanism.AES_KEY_WRAP_PAD)) - 8
    finally:
        destroy_quietly(probe)


class ImportOps(Pkcs11Core):
    """`import_wrapped_key`: under a managed AES key (RFC 5649 or 3394) or a sealed RSA private key (OAEP)."""

    def import_wrapped_key(self, blob: bytes, *, unwrapping: WrappedKey | SealedPrivateKey, mechanism: str,
                           kek_id: str, secret: bool = False) -> ImportedKey:
        self._require(self._capabilities.supports_aes_key_wrap_pad, "CKM_AES_KEY_WRAP_PAD")  # (and _measure)
        if mechanism in _AES_WRAPS:
            if not isinstance(unwrapping, WrappedKey):
                raise HsmInvalidInput(f"{mechanism} unwraps under an AES key (a WrappedKey)")
            param: Any = None
        elif mechanism in (RSA_OAEP_SHA1, RSA_OAEP_SHA256):
            if not isinstance(unwrapping, SealedPrivateKey) or unwrapping.algorithm != "RSA":
                raise HsmInvalidInput("RSA-OAEP unwraps under an RSA private key (a SealedPrivateKey)")
            supported = self._capabilities.rsa_unwrap_mechanisms or {self._capabilities.rsa_wrap_mechanism}
            if mechanism not in supported:
                raise HsmInvalidInput(f"token {self._label!r} unwraps with {', '.join(sorted(supported))} only, "
                                      f"not {mechanism}")
            param = mechanisms.oaep_scheme(mechanism).pkcs11_param
        else:
            raise HsmInvalidInput(f"keys are unwrapped with {AES_KWP}, {AES_KW}, {RSA_OAEP_SHA1} or "
                                  f"{RSA_OAEP_SHA256}, not {mechanism!r}")
        key_type = KeyType.GENERIC_SECRET if secret else KeyType.AES
        template = mechanisms.HMAC_TRANSIT_TEMPLATE if secret else mechanisms.TRANSIT_KEY_TEMPLATE
        sizes = HMAC_BYTES if secret else AES_BYTES
        target = self._wrap_scheme
        body = bytes(blob)

        def run(lease: Lease) -> ImportedKey:
            session = lease.session
            kek = self._kek(session, kek_id)
            unwrapper = self._unwrapper(lease, unwrapping)
            try:
                view: Any = (AesUnwrapView(session, unwrapper.handle) if mechanism in _AES_WRAPS
                             else RsaPrivateView(session, unwrapper.handle))
                try:
                    key = view.unwrap_key(ObjectClass.SECRET_KEY, key_type, body,
                                          mechanism=_AES_WRAPS.get(mechanism, Mechanism.RSA_PKCS_OAEP),
                                          mechanism_param=param, capabilities=0, template=dict(template))
                except p11.PKCS11Error as exc:
                    if faults.classify(exc) is Fault.CRYPTO:
                        raise HsmIntegrityError(INTEGRITY_MESSAGE) from None
                    raise
            finally:
                destroy_quietly(unwrapper)
            try:
                length = _measure(session, key)
                if length not in sizes:
                    kind = "an HMAC key is 16 to 128 bytes long" if secret else "an AES key is 16, 24 or 32 bytes long"
                    raise HsmInvalidInput(f"the unwrapped key is {length} bytes (to the 8-byte block); {kind}")
                wrapped = self._wrap(session, kek.public_handle, key, target)
            finally:
                destroy_quietly(key)
            return ImportedKey(wrapped=WrappedKey(wrapping_key_id=kek_id, mechanism=target.name, ciphertext=wrapped),
                               length_bits=length * 8)

        return self._run("import_wrapped_key", run, on_crypto=integrity_error)

    def _unwrapper(self, lease: Lease, unwrapping: WrappedKey | SealedPrivateKey) -> Any:
        """The caller's unwrapping key as a session object that may only unwrap (not cached:
        the handles other operations cache cannot unwrap)."""
        session = lease.session
        if isinstance(unwrapping, WrappedKey):
            kek = self._kek(session, unwrapping.wrapping_key_id)
            return self._unwrap(session, kek, unwrapping, self._unwrap_scheme(unwrapping),
                                mechanisms.SEALED_DEK_TEMPLATE)
        kek = self._kek(session, unwrapping.dek.wrapping_key_id)
        dek = self._unwrap(session, kek, unwrapping.dek, self._unwrap_scheme(unwrapping.dek),
                           mechanisms.SEALED_DEK_TEMPLATE)
        try:
            return AesUnwrapView(session, dek.handle).unwrap_key(
                ObjectClass.PRIVATE_KEY, KeyType.RSA, bytes(unwrapping.material),
                mechanism=Mechanism.AES_KEY_WRAP_PAD, capabilities=0, template=dict(_UNWRAPPING_PRIVATE_TEMPLATE))
        finally:
            destroy_quietly(dek)
