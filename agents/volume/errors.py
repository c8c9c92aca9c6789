"""The volumes' error: what went wrong and what to do, and the exit status it takes."""

from __future__ import annotations

from agents.errors import AgentError, Exit

_KIND_EXIT = {"usage": Exit.USAGE, "file": Exit.FILE, "key": Exit.KEY, "unreachable": Exit.UNREACHABLE,
              "host": Exit.NOT_ENROLLED, "failed": Exit.FAILED}


class VolumeError(AgentError):
    """What went wrong and what to do; `kind` picks the CLI's exit status."""

    def __init__(self, message: str, kind: str = "failed") -> None:
        super().__init__(message)
        self.kind = kind  # usage | file | key | unreachable | host | failed

    @property
    def exit_code(self) -> Exit:
        return _KIND_EXIT[self.kind]
