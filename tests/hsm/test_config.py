"""HsmConfig refuses unsafe or inconsistent settings before anything touches a token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hsm.config import KNOWN_DEFAULT_PINS, HsmConfig
from hsm.errors import HsmConfigError

GOOD: dict[str, Any] = {"user_pin": "u-7f3a9c1e5b", "so_pin": "s-2d8e4f6a0c"}


@pytest.mark.parametrize("pin", [*sorted(KNOWN_DEFAULT_PINS), "CHANGEME", " 1234 "])
@pytest.mark.parametrize("which", ["user_pin", "so_pin"])
def test_default_pins_are_refused(which: str, pin: str) -> None:
    with pytest.raises(HsmConfigError, match=which) as caught:
        HsmConfig(**{**GOOD, which: pin})
    message = str(caught.value)
    assert "allow_default_pins" in message
    if pin.strip():
        assert pin.strip() not in message  # the PIN itself is never echoed


def test_default_pins_allowed_when_asked_for() -> None:
    config = HsmConfig(user_pin="1234", so_pin="0000", allow_default_pins=True)
    assert config.user_pin == "1234"


def test_identical_user_and_so_pins_are_refused() -> None:
    with pytest.raises(HsmConfigError, match="differ"):
        HsmConfig(user_pin="same-pin-twice", so_pin="same-pin-twice")


def test_pins_stay_out_of_repr() -> None:
    text = repr(HsmConfig(**GOOD))
    assert GOOD["user_pin"] not in text and GOOD["so_pin"] not in text


def test_defaults() -> None:
    config = HsmConfig(**GOOD)
    assert config.module_path == "/usr/lib/softhsm/libsofthsm2.so"
    assert config.token_label == "strongroom"
    assert config.softhsm_token_dir is None
    assert config.pool_size == 8
    assert config.handle_cache_size == 4096
    assert config.handle_cache_ttl_seconds == 300.0
    assert not config.allow_default_pins


def test_keyword_only() -> None:
    with pytest.raises(TypeError):
        HsmConfig("/usr/lib/softhsm/libsofthsm2.so", "strongroom", "u-pin-x1", "s-pin-x1")  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("token_label", "", "token_label"),
        ("token_label", "x" * 33, "token_label"),
        ("token_label", "é" * 17, "token_label"),
        ("module_path", "", "module_path"),
        ("pool_size", 0, "pool_size"),
        ("handle_cache_size", -1, "handle_cache_size"),
        ("handle_cache_ttl_seconds", 0.0, "ttl"),
    ],
)
def test_bad_values_are_refused(field: str, value: object, match: str) -> None:
    with pytest.raises(HsmConfigError, match=match):
        HsmConfig(**{**GOOD, field: value})


def test_cache_can_be_disabled_and_dir_is_a_path(tmp_path: Path) -> None:
    config = HsmConfig(**GOOD, handle_cache_size=0, softhsm_token_dir=tmp_path)
    assert config.handle_cache_size == 0
    assert config.softhsm_token_dir == tmp_path
