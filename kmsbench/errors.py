"""The tool's exit codes (documented in docs/benchmarks.md) and its one error type."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    SUITE_FAILED = 1  # a suite failed while running; the others' results are still written
    USAGE = 2  # bad arguments (argparse's own code too)
    PRIVILEGES = 3  # not root / no /dev/fuse, a required program missing (PostgreSQL, wrk, SoftHSM2)
    SERVICE = 4  # --keyserver down or its token refused, PostgreSQL (for kmip) unreachable
    DISK = 5  # too little free space for the chosen sizes
    PATHS = 6  # --out or --workdir exists and is not empty (and not made by kms-bench)
    INTERRUPTED = 130  # Ctrl-C / SIGTERM: everything created was removed


class BenchError(Exception):
    """A problem found before or during the run, with what to do about it."""

    def __init__(self, code: Exit, problem: str, remedy: str) -> None:
        super().__init__(problem)
        self.code, self.problem, self.remedy = code, problem, remedy

    def __str__(self) -> str:
        return f"{self.problem}\n  → {self.remedy}"
