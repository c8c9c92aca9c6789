"""One root for the agent's errors (agents/errors.py): every exception class of the agent
is an AgentError carrying its documented exit status, and `kms-agent` turns any of them
into one line and that status — also those no command catches itself."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
from pathlib import Path

import pytest

import agents
from agents import cli
from agents.cli import Fail, main
from agents.cryptfile import FormatError, IntegrityError, KeyUnavailable
from agents.errors import AgentError, Exit
from agents.guardpoint.shield import ShieldError
from agents.keyclient.cache import ServerUnreachable
from agents.keyclient.client import HostRevoked, ServerRefused
from agents.volume.luks import LuksError
from agents.volume.manager import VolumeError


def _agent_exceptions() -> list[type[BaseException]]:
    found = []
    for info in pkgutil.walk_packages(agents.__path__, "agents."):
        module = importlib.import_module(info.name)
        found += [c for _, c in inspect.getmembers(module, inspect.isclass)
                  if issubclass(c, BaseException) and c.__module__ == info.name]
    return found


def test_every_error_of_the_agent_has_the_one_root() -> None:
    classes = _agent_exceptions()
    assert len(classes) >= 15  # the walk found the packages' errors, not nothing
    assert [c.__qualname__ for c in classes if not issubclass(c, AgentError)] == []


@pytest.mark.parametrize(("error", "code", "line"), [
    (VolumeError("no volume 'x'", "usage"), Exit.USAGE, "error: no volume 'x'"),
    (VolumeError("unreachable", "unreachable"), Exit.UNREACHABLE, "error: unreachable"),
    (LuksError("not LUKS"), Exit.FILE, "error: not LUKS"),
    (ServerUnreachable("https://kms: refused"), Exit.UNREACHABLE,
     "error: key server unreachable: https://kms: refused"),
    (ServerRefused(403, "key_forbidden", "not for you"), Exit.KEY, "error: the key server refused: not for you "
                                                                     "(key_forbidden)"),
    (ServerRefused(409, "enrollment_used", "used"), Exit.NOT_ENROLLED, "error: the key server refused: used "
                                                                         "(enrollment_used)"),
    (HostRevoked(403, "host_revoked", "revoked"), Exit.NOT_ENROLLED,
     "error: the key server refuses this host (revoked); re-enroll it with `kms-agent enroll --token TOKEN`"),
    (IntegrityError("/f", "chunk 3"), Exit.INTEGRITY,
     "integrity failure: /f: integrity check failed at chunk 3; the file is unchanged — restore it from a backup "
     "if this persists"),
    (KeyUnavailable("key k version 2: gone"), Exit.KEY, "key unavailable: key k version 2: gone"),
    (FormatError("/f: not an encrypted file"), Exit.FILE, "error: /f: not an encrypted file"),
    (ShieldError("cannot shield /p"), Exit.FAILED, "error: cannot shield /p"),  # no command caught it before
    (Fail(Exit.USAGE, "--size 'x': a size"), Exit.USAGE, "error: --size 'x': a size"),
])
def test_the_cli_says_each_in_one_line_with_its_status(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                       error: AgentError, code: Exit, line: str) -> None:
    def raising() -> None:
        raise error

    monkeypatch.setattr(cli, "_config", raising)  # the first thing `status` does
    monkeypatch.setattr(sys, "argv", ["kms-agent", "status"])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == code and error.exit_code == code
    assert " ".join(capsys.readouterr().err.split()) == line
