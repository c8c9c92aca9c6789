"""Root of trust: the only package that talks PKCS#11. See `hsm/README.md`."""

from hsm.backend import (
    AES_256_GCM,
    AES_KWP,
    RSA_OAEP_SHA1,
    RSA_OAEP_SHA256,
    HsmBackend,
    KekAttributes,
    KekInfo,
    TokenCapabilities,
    WrappedKey,
    WrappedKeyPair,
)
from hsm.errors import (
    HsmConfigError,
    HsmError,
    HsmIntegrityError,
    HsmInvalidInput,
    HsmKeyNotFound,
    HsmUnavailable,
)

__all__ = [
    "AES_256_GCM",
    "AES_KWP",
    "RSA_OAEP_SHA1",
    "RSA_OAEP_SHA256",
    "HsmBackend",
    "HsmConfigError",
    "HsmError",
    "HsmIntegrityError",
    "HsmInvalidInput",
    "HsmKeyNotFound",
    "HsmUnavailable",
    "KekAttributes",
    "KekInfo",
    "TokenCapabilities",
    "WrappedKey",
    "WrappedKeyPair",
]
