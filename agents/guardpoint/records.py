"""The guard points' records in `state_dir/guardpoints/` (written atomically, read
leniently: a torn or missing file reads as None) and the server's definition as a policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agents.cryptfile.transform import atomic_replace
from agents.guardpoint.policy import AccessPolicy, Effect, Mode, Rule

WATCH_SECONDS = 1.0  # how often a guard point's process looks at its definition file


def policy_from(definition: dict[str, Any]) -> AccessPolicy:
    """The server's definition as the mount's policy object."""
    rules = tuple(Rule(effect=Effect(r["effect"]), users=frozenset(r.get("users", ())),
                       uids=frozenset(r.get("uids", ())), groups=frozenset(r.get("groups", ())),
                       executables=frozenset(r.get("executables", ())), access=r.get("access", "all"),
                       audit=bool(r.get("audit", False)))
                  for r in definition.get("rules", ()))
    return AccessPolicy(mode=Mode(definition["mode"]), rules=rules, default=Effect(definition["default_effect"]))


def write_json(path: Path, data: dict[str, Any]) -> None:
    with atomic_replace(path, mode=0o600) as f:
        f.write(json.dumps(data).encode())


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return None
