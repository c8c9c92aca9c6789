"""Opening backends: token creation, reopening, and the refusals with advice."""

from __future__ import annotations

from pathlib import Path

import pytest

from hsm import testing
from hsm.config import HsmConfig
from hsm.errors import HsmConfigError, HsmUnavailable
from hsm.pkcs11 import Pkcs11Backend, open_backend


def test_a_new_token_is_created_in_a_free_slot(hsm_token_base: Path) -> None:
    config = testing.make_test_config(hsm_token_base, token_label="bootstrap-new")
    with pytest.raises(HsmUnavailable, match="keyserver init"):
        open_backend(config, create_token=False)
    backend = open_backend(config)
    try:
        assert backend.list_keks() == []
        backend.create_kek("first")
    finally:
        backend.close()
    reopened = open_backend(config, create_token=False)
    try:
        assert [info.kek_id for info in reopened.list_keks()] == ["first"]
    finally:
        reopened.close()


def test_reopening_the_shared_token_sees_the_same_keys(
    hsm_config: HsmConfig, hsm_backend: Pkcs11Backend
) -> None:
    kek = hsm_backend.create_kek("reopen-kek").kek_id
    wrapped = hsm_backend.generate_wrapped_key(kek_id=kek)
    second = open_backend(hsm_config, create_token=False)
    try:
        assert second.get_kek(kek) == hsm_backend.get_kek(kek)
        assert second.unwrap_key(wrapped) == hsm_backend.unwrap_key(wrapped)
    finally:
        second.close()
    # Closing one backend must not log out the other (login is per process and token).
    assert len(hsm_backend.unwrap_key(wrapped)) == 32


def test_second_backend_with_a_wrong_pin_is_refused(
    hsm_config: HsmConfig, hsm_backend: Pkcs11Backend
) -> None:
    import dataclasses

    wrong = dataclasses.replace(hsm_config, user_pin="not-the-right-pin")
    with pytest.raises(HsmUnavailable, match="PIN rejected"):
        open_backend(wrong, create_token=False)
    hsm_backend.check()


def test_one_token_directory_per_process(hsm_backend: Pkcs11Backend, tmp_path: Path) -> None:
    with pytest.raises(HsmConfigError, match="process of its own"):
        open_backend(testing.make_test_config(tmp_path))


def test_missing_module_gives_install_advice(tmp_path: Path) -> None:
    config = HsmConfig(
        module_path=str(tmp_path / "libnothing.so"),
        user_pin="a-user-pin-0",
        so_pin="a-so-pin-0",
    )
    with pytest.raises(HsmUnavailable, match=r"not loadable.*install softhsm2"):
        open_backend(config)


def test_a_file_that_is_not_a_module(tmp_path: Path) -> None:
    fake = tmp_path / "libfake.so"
    fake.write_bytes(b"\x7fELF but not really")
    config = HsmConfig(module_path=str(fake), user_pin="a-user-pin-0", so_pin="a-so-pin-0")
    with pytest.raises(HsmUnavailable, match="STRONGROOM_HSM_MODULE"):
        open_backend(config)
