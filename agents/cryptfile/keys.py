"""Key material as the format sees it: a managed key version, delivered to the agent."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from agents.cryptfile.errors import KeyUnavailable


@dataclass(frozen=True, slots=True)
class KeyVersion:
    """A guard-point key: the managed key's id, its version and the AES-256 material."""

    key_id: uuid.UUID
    version: int
    material: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.material) != 32:
            raise ValueError("a guard-point key is 32 bytes (AES-256)")
        if not 0 < self.version < 2**32:
            raise ValueError("key versions are 1 .. 2**32-1")


class Keyring(Protocol):
    def get(self, key_id: uuid.UUID, version: int) -> KeyVersion:
        """The material of that version; raises KeyUnavailable."""


class StaticKeyring:
    """A keyring over key versions already in memory (tests, tools, the agent's cache)."""

    def __init__(self, versions: Mapping[tuple[uuid.UUID, int], KeyVersion] | list[KeyVersion]) -> None:
        items = versions.values() if isinstance(versions, Mapping) else versions
        self._versions = {(v.key_id, v.version): v for v in items}

    def get(self, key_id: uuid.UUID, version: int) -> KeyVersion:
        try:
            return self._versions[(key_id, version)]
        except KeyError:
            raise KeyUnavailable(f"no material for key {key_id} version {version}") from None
