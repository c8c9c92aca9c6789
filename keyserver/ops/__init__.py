"""Operator commands' logic (backup, restore): the `keyserver` CLI only parses arguments,
shows progress and maps `OpsError` to its exit code."""

from __future__ import annotations

from typing import Protocol

EXIT_FAILED, EXIT_BROKEN_CHAIN, EXIT_UNAVAILABLE = 1, 3, 4


class OpsError(Exception):
    """The command cannot go on; `message` says why and what to do, `exit_code` is the
    CLI's (1 failed, 3 audit chain broken, 4 HSM or database unavailable)."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class Reporter(Protocol):
    """Where a long command shows its progress (the CLI: rich)."""

    def step(self, text: str) -> None:
        """A new step starts; the previous one is done."""

    def note(self, text: str) -> None:
        """Something the operator must read (printed whole, after the progress)."""


class SilentReporter:
    def step(self, text: str) -> None:
        pass

    def note(self, text: str) -> None:
        pass
