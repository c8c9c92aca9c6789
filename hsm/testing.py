"""Helpers for test suites that need a real SoftHSM2 token (no pytest import here).

SoftHSM2 reads its configuration once per process, so a pytest run can serve exactly
one token directory. `shared_test_backend` hands every caller in the process the same
backend on the same directory, whichever conftest asks first:

    # tests/conftest.py
    @pytest.fixture(scope="session")
    def hsm_backend(tmp_path_factory):
        return hsm.testing.shared_test_backend(lambda: tmp_path_factory.mktemp("softhsm"))
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

from hsm.config import HsmConfig
from hsm.pkcs11 import Pkcs11Backend, open_backend

# Not defaults, so HsmConfig accepts them; not secrets either: test tokens only.
TEST_USER_PIN: Final = "strongroom-test-user-pin"
TEST_SO_PIN: Final = "strongroom-test-so-pin"
TEST_TOKEN_LABEL: Final = "strongroom-test"  # noqa: S105 - a label, not a secret


def make_test_config(
    tmp_path: Path,
    *,
    token_label: str = TEST_TOKEN_LABEL,
    pool_size: int = 8,
    handle_cache_size: int = 4096,
    handle_cache_ttl_seconds: float = 300.0,
) -> HsmConfig:
    """A config for a SoftHSM2 token under `tmp_path/softhsm-tokens` (created on open)."""
    return HsmConfig(
        token_label=token_label,
        user_pin=TEST_USER_PIN,
        so_pin=TEST_SO_PIN,
        softhsm_token_dir=Path(tmp_path) / "softhsm-tokens",
        pool_size=pool_size,
        handle_cache_size=handle_cache_size,
        handle_cache_ttl_seconds=handle_cache_ttl_seconds,
    )


_lock = threading.Lock()
_shared: tuple[HsmConfig, Pkcs11Backend] | None = None


def shared_test_config(base_dir: Callable[[], Path]) -> HsmConfig:
    """The process-wide test config; `base_dir` is only called the first time."""
    return _shared_pair(base_dir)[0]


def shared_test_backend(base_dir: Callable[[], Path]) -> Pkcs11Backend:
    """The process-wide test backend (token created on first use, closed at exit)."""
    return _shared_pair(base_dir)[1]


def _shared_pair(base_dir: Callable[[], Path]) -> tuple[HsmConfig, Pkcs11Backend]:
    global _shared
    with _lock:
        if _shared is None:
            config = make_test_config(base_dir())
            backend = open_backend(config)
            atexit.register(backend.close)
            _shared = (config, backend)
        return _shared
