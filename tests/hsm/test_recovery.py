"""Losing the session or the login mid-run: re-open and retry once, then give up clearly."""

from __future__ import annotations

import logging
import os

import pytest

from hsm import testing
from hsm.config import HsmConfig
from hsm.errors import HsmUnavailable
from hsm.pkcs11 import Pkcs11Backend, open_backend


def _logout_behind_its_back(backend: Pkcs11Backend) -> None:
    # Login state is per process and token: a C_Logout on any session ends it for all,
    # and SoftHSM2 invalidates every private object handle with it.
    with backend._borrow() as session:
        assert backend._module.raw.logout(session.handle) == 0


def test_lost_login_is_restored_transparently(
    side_token: Pkcs11Backend, caplog: pytest.LogCaptureFixture
) -> None:
    kek = side_token.create_kek("recover-kek").kek_id
    wrapped = side_token.generate_wrapped_key(kek_id=kek)
    sealed = side_token.encrypt_with(wrapped, b"survives", aad=b"a")  # handle now cached
    _logout_behind_its_back(side_token)
    with caplog.at_level(logging.WARNING, logger="hsm"):
        assert side_token.decrypt_with(wrapped, sealed, aad=b"a") == b"survives"
    assert "retrying once" in caplog.text
    # KEK handles were renumbered by the re-login; they are looked up again.
    assert len(side_token.unwrap_key(side_token.generate_wrapped_key(kek_id=kek))) == 32
    side_token.check()


def test_check_logs_in_again(side_token: Pkcs11Backend) -> None:
    _logout_behind_its_back(side_token)
    side_token.check()
    assert len(side_token.random(8)) == 8


def test_closed_sessions_are_reopened(side_token: Pkcs11Backend) -> None:
    kek = side_token.create_kek("closed-kek").kek_id
    wrapped = side_token.generate_wrapped_key(kek_id=kek)
    sealed = side_token.encrypt_with(wrapped, b"still here", aad=b"")
    # Every session of the token gone, the login anchor included (as after a token
    # removal and re-insertion).
    for session in list(side_token._pool._idle):
        session.close()
    side_token._module._anchors[side_token._token_serial].session.close()
    assert side_token.decrypt_with(wrapped, sealed, aad=b"") == b"still here"
    side_token.check()


def test_changed_pin_gives_up_after_one_retry(side_token: Pkcs11Backend) -> None:
    kek = side_token.create_kek("pin-kek").kek_id
    wrapped = side_token.generate_wrapped_key(kek_id=kek)
    with side_token._borrow() as session:
        session.set_pin(testing.TEST_USER_PIN, "someone-changed-it")
    _logout_behind_its_back(side_token)
    with pytest.raises(HsmUnavailable, match="PIN rejected") as caught:
        side_token.encrypt_with(wrapped, b"x", aad=b"")
    assert "someone-changed-it" not in str(caught.value)
    assert testing.TEST_USER_PIN not in str(caught.value)
    with pytest.raises(HsmUnavailable, match="PIN rejected"):
        side_token.check()


def test_closed_backend_refuses_work(hsm_config: HsmConfig, hsm_backend: Pkcs11Backend) -> None:
    backend = open_backend(hsm_config, create_token=False)
    backend.close()
    backend.close()  # idempotent
    with pytest.raises(HsmUnavailable, match="closed"):
        backend.random(4)
    with pytest.raises(HsmUnavailable, match="closed"):
        backend.check()
    hsm_backend.check()  # the shared login survived


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_backend_from_before_fork_is_refused_in_the_child(
    hsm_config: HsmConfig, hsm_backend: Pkcs11Backend
) -> None:
    kek = hsm_backend.create_kek("fork-kek").kek_id
    wrapped = hsm_backend.generate_wrapped_key(kek_id=kek)
    sealed = hsm_backend.encrypt_with(wrapped, b"across fork", aad=b"f")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child; reports through its exit status only
        code = 0
        try:
            try:
                hsm_backend.random(4)
                code = 10
            except HsmUnavailable:
                pass
            fresh = open_backend(hsm_config, create_token=False)
            if fresh.decrypt_with(wrapped, sealed, aad=b"f") != b"across fork":
                code = 11
            fresh.close()
        except BaseException:
            code = 12
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent is unaffected.
    assert hsm_backend.decrypt_with(wrapped, sealed, aad=b"f") == b"across fork"
