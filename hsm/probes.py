"""The token's raw RSA-2048 OAEP unwrap, for measuring its ceiling: what bounds every path
that unwraps (host delivery, decrypt). Kept in `hsm` because it speaks PKCS#11; the
timing, threads and reporting are the benchmark's (kmsbench/hsm_ceiling.py).

A throw-away session key pair, so it neither needs nor touches a KEK."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from pkcs11 import KeyType, Mechanism, ObjectClass

from hsm import mechanisms
from hsm.backend import HsmBackend
from hsm.handles import RsaPrivateView
from hsm.pkcs11 import session_rsa_pair


class UnwrapProbe:
    """`session()` borrows a pooled session and yields one C_UnwrapKey + C_DestroyObject
    of an AES-256 key under the throw-away RSA-2048 key per call."""

    def __init__(self, borrow: Callable[[], contextlib.AbstractContextManager[Any]], private_handle: int,
                 blob: bytes, scheme: mechanisms.OaepScheme) -> None:
        self._borrow = borrow
        self._private = private_handle
        self._blob = blob
        self._scheme = scheme

    @contextlib.contextmanager
    def session(self) -> Iterator[Callable[[], None]]:
        with self._borrow() as session:
            view = RsaPrivateView(session, self._private)

            def unwrap_once() -> None:
                key = view.unwrap_key(ObjectClass.SECRET_KEY, KeyType.AES, self._blob,
                                      mechanism=Mechanism.RSA_PKCS_OAEP, mechanism_param=self._scheme.pkcs11_param,
                                      capabilities=0, template=dict(mechanisms.WORKING_KEY_TEMPLATE))
                key.destroy()

            yield unwrap_once


@contextlib.contextmanager
def unwrap_probe(backend: HsmBackend) -> Iterator[UnwrapProbe]:
    # Through attribute lookup so that wrappers forwarding attributes to a Pkcs11Backend
    # (the key server's lazy backend) work too.
    borrow: Callable[[], contextlib.AbstractContextManager[Any]] | None = getattr(backend, "_borrow", None)
    if borrow is None:
        raise TypeError("the unwrap probe needs a PKCS#11 backend (hsm.pkcs11.Pkcs11Backend)")
    scheme = mechanisms.oaep_scheme(backend.capabilities.rsa_wrap_mechanism)
    with borrow() as session:
        public, private = session_rsa_pair(session)
        key = session.generate_key(KeyType.AES, mechanisms.DATA_KEY_BITS, capabilities=0,
                                   template=dict(mechanisms.TRANSIT_KEY_TEMPLATE))
        try:
            blob = bytes(public.wrap_key(key, mechanism=Mechanism.RSA_PKCS_OAEP,
                                         mechanism_param=scheme.pkcs11_param))
        finally:
            key.destroy()
    # The session goes back to the pool (the measuring threads may need it); its objects
    # live on until it is closed, and are destroyed explicitly below.
    try:
        yield UnwrapProbe(borrow, private.handle, blob, scheme)
    finally:
        for obj in (public, private):
            with contextlib.suppress(Exception):
                obj.destroy()
