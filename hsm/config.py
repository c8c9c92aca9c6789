"""How to reach the token. Built by the keyserver's settings; nothing is read at import."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from hsm.errors import HsmConfigError

DEFAULT_MODULE_PATH: Final = "/usr/lib/softhsm/libsofthsm2.so"

# PINs that ship in vendor manuals, tutorials and softhsm2-util examples. Refused unless
# the operator says, in so many words, that this is a throwaway local setup.
KNOWN_DEFAULT_PINS: Final = frozenset(
    {"", "0000", "1234", "123456", "12345678", "changeme", "password",
     "87654321"}  # openCryptoki's factory SO PIN
)

# CK_TOKEN_INFO.label is a fixed 32-byte field.
_MAX_LABEL_BYTES: Final = 32


# Keyword-only: two PIN strings side by side are too easy to swap positionally.
@dataclass(frozen=True, kw_only=True)
class HsmConfig:
    module_path: str = DEFAULT_MODULE_PATH
    token_label: str = "strongroom"  # noqa: S105 - a label, not a secret
    user_pin: str = field(repr=False)
    so_pin: str = field(repr=False)
    # When set, the backend points SoftHSM2 at this directory (writes softhsm2.conf
    # inside it and sets SOFTHSM2_CONF before the module is initialised).
    softhsm_token_dir: Path | None = None
    pool_size: int = 8
    allow_default_pins: bool = False
    handle_cache_size: int = 4096
    handle_cache_ttl_seconds: float = 300.0

    def __post_init__(self) -> None:
        if not self.allow_default_pins:
            for name, pin in (("user_pin", self.user_pin), ("so_pin", self.so_pin)):
                # Say which setting is wrong, never echo the PIN itself.
                if pin.strip().lower() in KNOWN_DEFAULT_PINS:
                    raise HsmConfigError(
                        f"HSM {name} is empty or a well-known default PIN: choose a long "
                        "random PIN (e.g. `openssl rand -hex 16`), or set "
                        "allow_default_pins=True for a throwaway local token only"
                    )
        if self.user_pin == self.so_pin and self.user_pin:
            raise HsmConfigError(
                "HSM user_pin and so_pin are identical: the security officer PIN must "
                "differ from the PIN the server logs in with"
            )
        label_bytes = len(self.token_label.encode("utf-8"))
        if not 0 < label_bytes <= _MAX_LABEL_BYTES:
            raise HsmConfigError(
                f"HSM token_label must be 1..{_MAX_LABEL_BYTES} bytes of UTF-8, "
                f"got {label_bytes}"
            )
        if not self.module_path:
            raise HsmConfigError("HSM module_path is empty: give the path of a PKCS#11 module")
        if self.pool_size < 1:
            raise HsmConfigError(f"HSM pool_size must be at least 1, got {self.pool_size}")
        if self.handle_cache_size < 0:
            raise HsmConfigError(
                f"HSM handle_cache_size must be >= 0 (0 disables it), got {self.handle_cache_size}"
            )
        if not self.handle_cache_ttl_seconds > 0:
            raise HsmConfigError(
                "HSM handle_cache_ttl_seconds must be positive, "
                f"got {self.handle_cache_ttl_seconds}"
            )
