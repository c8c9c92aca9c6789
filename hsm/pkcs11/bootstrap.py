"""Opening a token: load the module, find or create the token under a cross-process lock, log in."""

from __future__ import annotations

import contextlib
import fcntl
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pkcs11
from pkcs11 import exceptions as p11

from hsm import cryptoki, faults
from hsm.config import HsmConfig
from hsm.errors import HsmError, HsmUnavailable
from hsm.module import LoadedModule, load_module
from hsm.pkcs11.backend import Pkcs11Backend

log = logging.getLogger(__name__)


def open_backend(config: HsmConfig, *, create_token: bool = True) -> Pkcs11Backend:
    """Load the module, find (or create and initialise) the token, log in.

    With `create_token`, a missing token is initialised in a free slot with the SO
    PIN, then given the user PIN: the `keyserver init` path, and the embedded
    SoftHSM2 default that bootstraps itself on first start.
    """
    with _bootstrap_lock(config.softhsm_token_dir):
        module = load_module(config.module_path, softhsm_token_dir=config.softhsm_token_dir)
        try:
            token = _find_or_create_token(module, config, create_token=create_token)
            module.login(token, user_pin=config.user_pin)
        except (p11.PKCS11Error, cryptoki.CryptokiError) as exc:
            raise _open_error(config, exc) from None
    try:
        return Pkcs11Backend(config=config, module=module, token=token)
    except BaseException:
        module.logout(token.serial)
        raise


def _find_or_create_token(module: LoadedModule, config: HsmConfig, *, create_token: bool) -> Any:
    label, path = config.token_label, config.module_path
    token = module.find_token(label)
    if token is None:
        if not create_token:
            raise HsmUnavailable(
                f"token {label!r} not found in module {path}: run `keyserver init`"
            )
        slot = module.free_slot()
        if slot is None:
            raise HsmUnavailable(
                f"token {label!r} not found in module {path} and no uninitialised slot is "
                "free: create the token with the HSM vendor's tools"
            )
        log.info("initialising token %r in slot %s of %s", label, slot.slot_id, path)
        module.init_token(slot, label=label, so_pin=config.so_pin)
        token = module.find_token(label)
        if token is None:
            raise HsmUnavailable(f"token {label!r} did not appear after C_InitToken in {path}")
    if not token.flags & pkcs11.TokenFlag.USER_PIN_INITIALIZED:
        if not create_token:
            raise HsmUnavailable(f"token {label!r} has no user PIN yet: run `keyserver init`")
        log.info("setting the user PIN of token %r", label)
        module.init_user_pin(token, so_pin=config.so_pin, user_pin=config.user_pin)
        token = module.find_token(label) or token
    if token.flags & pkcs11.TokenFlag.USER_PIN_LOCKED:
        raise HsmUnavailable(
            f"the user PIN of token {label!r} is locked: the security officer must reset it"
        )
    return token


def _open_error(config: HsmConfig, exc: BaseException) -> HsmError:
    name = faults.describe(exc)
    if faults.is_pin_problem(exc):
        return HsmUnavailable(
            f"PIN rejected by token {config.token_label!r} ({name}): check the configured "
            "user PIN (and the SO PIN when the token is being created)"
        )
    return HsmUnavailable(
        f"cannot open token {config.token_label!r} in module {config.module_path} ({name})"
    )


@contextlib.contextmanager
def _bootstrap_lock(token_dir: Path | None) -> Iterator[None]:
    """Serialise first start across processes sharing a SoftHSM2 token directory.

    Two processes starting on an empty directory would otherwise both find a free
    slot and create two tokens with one label. Held across C_Initialize as well, since
    SoftHSM2 only sees tokens that existed when it was initialised.
    """
    if token_dir is None:
        yield
        return
    directory = token_dir.expanduser()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(directory / ".strongroom-bootstrap.lock", "a+b") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


