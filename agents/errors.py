"""The agent's errors: one root, each carrying its documented exit status.

Every error the agent raises on purpose is an `AgentError`; `kms-agent` (agents/cli.py)
catches the root alone and prints `describe()` on one line with its `exit_code`.
Packages keep their own names (`ServerUnreachable`, `VolumeError`, `IntegrityError`, …):
only their common root is here, so this module imports nothing of the agent's.

Exit status (also in `kms-agent --help`):
  0 done · 1 unexpected failure · 2 usage · 3 integrity failure (tampered or damaged file)
  4 key unavailable or refused · 5 key server unreachable · 6 host not enrolled or revoked
  7 file error (missing, not readable, not an encrypted file)
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar


class Exit(IntEnum):
    OK = 0
    FAILED = 1
    USAGE = 2
    INTEGRITY = 3
    KEY = 4
    UNREACHABLE = 5
    NOT_ENROLLED = 6
    FILE = 7


class AgentError(Exception):
    """What went wrong and what to do, said in one line; the class picks the exit status."""

    exit_status: ClassVar[Exit] = Exit.FAILED  # a class's exit status; `exit_code` may depend on the error
    label: ClassVar[str] = "error"  # how the CLI's line starts

    @property
    def exit_code(self) -> Exit:
        return self.exit_status

    def describe(self) -> str:
        return str(self)
