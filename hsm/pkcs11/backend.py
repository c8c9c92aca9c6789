"""`Pkcs11Backend`: the `HsmBackend` for any PKCS#11 module, assembled from its parts."""

from __future__ import annotations

from hsm.pkcs11.imports import ImportOps
from hsm.pkcs11.internal_keys import InternalKeys
from hsm.pkcs11.keks import KekOps
from hsm.pkcs11.private_keys import PrivateKeyOps
from hsm.pkcs11.services import CryptoServices
from hsm.pkcs11.wrapping import WrappingOps


class Pkcs11Backend(KekOps, WrappingOps, PrivateKeyOps, CryptoServices, InternalKeys, ImportOps):
    """Thread-safe; one instance per process and token is the intended use.

    Build it with `open_backend`, which loads the module, bootstraps the token and
    logs in; the constructor expects all of that done. Each base holds one concern
    (see hsm/README.md); they share the state and runner of `Pkcs11Core`.
    """
