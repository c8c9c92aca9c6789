"""The errors of the file format. A caller mistake (not our file, unsupported version,
missing key) is distinct from an integrity failure, and every integrity failure is one
opaque type that names where, never why: an attacker learns nothing from it."""

from __future__ import annotations

from agents.errors import AgentError, Exit


class CryptfileError(AgentError):
    """Base class of every error raised by agents.cryptfile."""


class FormatError(CryptfileError):
    """The bytes are not a Strongroom encrypted file this version can read."""

    exit_status = Exit.FILE


class KeyUnavailable(CryptfileError):
    """The keyring has no material for the key version the file needs (never delivered,
    revoked, destroyed, or the agent's cache expired)."""

    exit_status = Exit.KEY
    label = "key unavailable"


class IntegrityError(CryptfileError):
    """Authentication failed: the header or a chunk was altered, moved, swapped, dropped
    or truncated, or the key is not the one the file was written with."""

    exit_status = Exit.INTEGRITY
    label = "integrity failure"

    def __init__(self, path: str, where: str) -> None:
        super().__init__(f"{path}: integrity check failed at {where}")
        self.path = path
        self.where = where

    def describe(self) -> str:
        return f"{self}; the file is unchanged — restore it from a backup if this persists"
