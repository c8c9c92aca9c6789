"""The process-wide side of PKCS#11: one initialised module per path, one login per token.

Two facts force this state to live at process level rather than in a backend object:

* C_Initialize happens once per process. We make it ourselves, with CKF_OS_LOCKING_OK,
  before python-pkcs11 gets the chance to call C_Initialize(NULL), which would leave
  SoftHSM2 running without locks (docs/decisions/0002-pkcs11-locking.md).
* Login state belongs to the (process, token) pair: every session of the process is
  logged in or none is, and a C_Logout anywhere logs them all out. So the login is a
  reference-counted "anchor" session per token, shared by every backend on that token,
  logged out only when the last backend closes.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pkcs11
from pkcs11 import _pkcs11
from pkcs11 import exceptions as p11

from hsm import cryptoki, softhsm
from hsm.errors import HsmConfigError, HsmUnavailable

log = logging.getLogger(__name__)

_MODULE_ENV_HINT = "install softhsm2 or set STRONGROOM_HSM_MODULE to a PKCS#11 module"


class _PreinitialisedLib(_pkcs11.lib):
    """python-pkcs11's `lib`, minus its own C_Initialize(NULL).

    `lib.__init__` calls `self.initialize()`, a cpdef method, so a Python subclass
    can replace it. We have already initialised the module with OS locking; python-
    pkcs11's call would fail with CKR_CRYPTOKI_ALREADY_INITIALIZED (which 0.10.1 raises
    as a bare PKCS11Error) or, worse, succeed first and disable SoftHSM2's locks.
    `initialized` stays False, so python-pkcs11 never calls C_Finalize behind our back.
    """

    def initialize(self) -> None:
        return None


@dataclass
class _Anchor:
    session: Any  # pkcs11.Session; the one session that carries the login
    pin: str
    refs: int


class LoadedModule:
    def __init__(
        self,
        *,
        path: str,
        raw: cryptoki.RawModule,
        lib: Any,
        thread_safe: bool,
        softhsm_conf: str | None,
        epoch: int,
    ) -> None:
        self.path = path
        self.raw = raw
        self.lib = lib
        self.thread_safe = thread_safe
        self.softhsm_conf = softhsm_conf
        self.epoch = epoch
        # A module that cannot lock (CKR_CANT_LOCK) is used by one thread at a time.
        self.call_lock: threading.RLock | None = None if thread_safe else threading.RLock()
        self._lock = self.call_lock or threading.RLock()
        self._anchors: dict[bytes, _Anchor] = {}

    # --- tokens ----------------------------------------------------------------
    def find_token(self, label: str) -> Any | None:
        """The token with this label, or None. Raises HsmConfigError if it is ambiguous."""
        found = []
        for slot in self.lib.get_slots(token_present=True):
            try:
                token = slot.get_token()
            except (p11.TokenNotPresent, p11.TokenNotRecognised):
                continue
            if token.label == label and token.flags & pkcs11.TokenFlag.TOKEN_INITIALIZED:
                found.append(token)
        if len(found) > 1:
            raise HsmConfigError(
                f"{len(found)} tokens are labelled {label!r} in module {self.path}: "
                "give each token a unique label"
            )
        return found[0] if found else None

    def free_slot(self) -> Any | None:
        for slot in self.lib.get_slots(token_present=True):
            try:
                token = slot.get_token()
            except (p11.TokenNotPresent, p11.TokenNotRecognised):
                continue
            if not token.flags & pkcs11.TokenFlag.TOKEN_INITIALIZED:
                return slot
        return None

    def init_token(self, slot: Any, *, label: str, so_pin: str) -> None:
        self.raw.init_token(slot.slot_id, so_pin=so_pin, label=label)

    def init_user_pin(self, token: Any, *, so_pin: str, user_pin: str) -> None:
        """C_InitPIN as the security officer, on a session of its own."""
        session = token.open(rw=True)
        try:
            rv = self.raw.login(session.handle, user_type=cryptoki.CKU_SO, pin=so_pin)
            if rv != cryptoki.CKR_OK:
                raise cryptoki.CryptokiError("C_Login(SO)", rv)
            try:
                session.init_pin(user_pin)
            finally:
                self.raw.logout(session.handle)
        finally:
            session.close()

    # --- login -----------------------------------------------------------------
    def login(self, token: Any, *, user_pin: str) -> None:
        """Take a reference on the token's login, logging in if nobody has yet."""
        with self._lock:
            anchor = self._anchors.get(token.serial)
            if anchor is not None:
                # Same process, same token, so the login is shared; still refuse a
                # second backend whose PIN is wrong rather than let it ride along.
                if not hmac.compare_digest(anchor.pin.encode(), user_pin.encode()):
                    raise cryptoki.CryptokiError("C_Login", cryptoki.CKR_PIN_INCORRECT)
                self._relogin_locked(token, anchor)
                anchor.refs += 1
                return
            session = self._login_session(token, user_pin)
            self._anchors[token.serial] = _Anchor(session=session, pin=user_pin, refs=1)

    def ensure_logged_in(self, token: Any) -> None:
        """After a failure: make sure the token's login is alive again (no new reference)."""
        with self._lock:
            anchor = self._anchors.get(token.serial)
            if anchor is None:
                raise HsmUnavailable(f"token {token.label!r} has no login in this process")
            self._relogin_locked(token, anchor)

    def logout(self, token_serial: bytes) -> None:
        """Drop a reference; the last one logs out and closes the anchor session."""
        with self._lock:
            anchor = self._anchors.get(token_serial)
            if anchor is None:
                return
            anchor.refs -= 1
            if anchor.refs > 0:
                return
            del self._anchors[token_serial]
            self.raw.logout(anchor.session.handle)
            _close_quietly(anchor.session)

    def _relogin_locked(self, token: Any, anchor: _Anchor) -> None:
        try:
            state = self.raw.session_state(anchor.session.handle)
        except cryptoki.CryptokiError:
            state = None  # the anchor session itself is gone (token removed, closed...)
        if state in (cryptoki.CKS_RW_USER_FUNCTIONS, cryptoki.CKS_RO_USER_FUNCTIONS):
            return
        log.warning("re-establishing the login on token %r", token.label)
        if state is not None:
            rv = self.raw.login(anchor.session.handle, user_type=cryptoki.CKU_USER, pin=anchor.pin)
            if rv in (cryptoki.CKR_OK, cryptoki.CKR_USER_ALREADY_LOGGED_IN):
                return
            if rv != cryptoki.CKR_SESSION_HANDLE_INVALID:
                raise cryptoki.CryptokiError("C_Login", rv)
        _close_quietly(anchor.session)
        anchor.session = self._login_session(token, anchor.pin)

    def _login_session(self, token: Any, user_pin: str) -> Any:
        # A plain session plus our own C_Login: python-pkcs11's open(user_pin=) would
        # leak the session when the PIN is wrong and C_Logout everything on close().
        session = token.open(rw=True)
        rv = self.raw.login(session.handle, user_type=cryptoki.CKU_USER, pin=user_pin)
        if rv not in (cryptoki.CKR_OK, cryptoki.CKR_USER_ALREADY_LOGGED_IN):
            _close_quietly(session)
            raise cryptoki.CryptokiError("C_Login", rv)
        return session


def _close_quietly(session: Any) -> None:
    try:
        session.close()
    except p11.PKCS11Error as exc:
        log.debug("closing a session failed: %s", type(exc).__name__)


# --- the registry -------------------------------------------------------------
_registry_lock = threading.Lock()
_modules: dict[str, LoadedModule] = {}
# Modules initialised by an ancestor before fork(): their state was copied into this
# process, so C_Initialize may answer ALREADY_INITIALIZED; finalising is then safe.
_inherited: dict[str, LoadedModule] = {}
_epoch = 0


def current_epoch() -> int:
    """Bumped in a forked child: backends opened before the fork must not be used."""
    return _epoch


def _after_fork_in_child() -> None:
    global _registry_lock, _epoch
    _epoch += 1
    _inherited.update(_modules)
    _modules.clear()
    # Another thread may have held it at fork time; in the child it would never be freed.
    _registry_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def load_module(path: str, *, softhsm_token_dir: Path | None) -> LoadedModule:
    """Load and initialise (once per process) the PKCS#11 module at `path`."""
    with _registry_lock:
        conf = str(softhsm.prepare_token_dir(softhsm_token_dir)) if softhsm_token_dir else None
        existing = _modules.get(path)
        if existing is not None:
            if conf is not None and existing.softhsm_conf != conf:
                raise HsmConfigError(
                    f"this process already serves SoftHSM2 tokens from {existing.softhsm_conf}"
                    f"; SoftHSM2 reads SOFTHSM2_CONF once per process, so {conf} "
                    "needs a process of its own"
                )
            return existing
        if conf is not None:
            os.environ[softhsm.ENV_VAR] = conf
        module = _initialise(path, softhsm_conf=os.environ.get(softhsm.ENV_VAR))
        _modules[path] = module
        return module


def _initialise(path: str, *, softhsm_conf: str | None) -> LoadedModule:
    try:
        raw = cryptoki.RawModule(path)
    except OSError as exc:
        raise HsmUnavailable(
            f"PKCS#11 module not loadable at {path} ({exc.strerror or exc}): {_MODULE_ENV_HINT}"
        ) from None
    except cryptoki.CryptokiError as exc:
        raise HsmUnavailable(
            f"{path} is not a usable PKCS#11 module ({exc}): {_MODULE_ENV_HINT}"
        ) from None

    thread_safe = True
    rv = raw.initialize_with_os_locking()
    if rv == cryptoki.CKR_CANT_LOCK:
        log.warning("PKCS#11 module %s cannot lock for threads; serialising every call", path)
        thread_safe = False
        rv = raw.initialize_single_threaded()
    if rv == cryptoki.CKR_CRYPTOKI_ALREADY_INITIALIZED and path in _inherited:
        raw.finalize()
        rv = raw.initialize_with_os_locking()
    if rv == cryptoki.CKR_CRYPTOKI_ALREADY_INITIALIZED:
        raise HsmUnavailable(
            f"PKCS#11 module {path} was already initialised in this process by another "
            "component, possibly without thread locking; only the hsm package may load it"
        )
    if rv != cryptoki.CKR_OK:
        raise HsmUnavailable(
            f"PKCS#11 module {path} failed to initialise ({cryptoki.rv_name(rv)})"
        )
    try:
        lib = _PreinitialisedLib(path)
    except p11.PKCS11Error as exc:
        raw.finalize()
        raise HsmUnavailable(
            f"python-pkcs11 could not use module {path} ({type(exc).__name__})"
        ) from None
    log.info(
        "loaded PKCS#11 module %s (%s %s, thread-safe=%s)",
        path, lib.manufacturer_id, lib.library_description, thread_safe,
    )
    return LoadedModule(
        path=path, raw=raw, lib=lib, thread_safe=thread_safe,
        softhsm_conf=softhsm_conf, epoch=_epoch,
    )
