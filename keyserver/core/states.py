"""KMIP object states and the only transitions between them (KMIP 1.4 §3.22 / 2.0 §4.57)."""

from __future__ import annotations

from enum import StrEnum

from keyserver.core.errors import Conflict


class KeyState(StrEnum):
    PRE_ACTIVE = "pre-active"
    ACTIVE = "active"
    DEACTIVATED = "deactivated"
    COMPROMISED = "compromised"
    DESTROYED = "destroyed"
    DESTROYED_COMPROMISED = "destroyed-compromised"


S = KeyState
TRANSITIONS: dict[KeyState, frozenset[KeyState]] = {
    S.PRE_ACTIVE: frozenset({S.ACTIVE, S.DEACTIVATED, S.COMPROMISED, S.DESTROYED}),
    S.ACTIVE: frozenset({S.DEACTIVATED, S.COMPROMISED}),
    S.DEACTIVATED: frozenset({S.COMPROMISED, S.DESTROYED}),
    S.COMPROMISED: frozenset({S.DESTROYED_COMPROMISED}),
    S.DESTROYED: frozenset({S.DESTROYED_COMPROMISED}),
    S.DESTROYED_COMPROMISED: frozenset(),
}

# States whose material may still decrypt (KMIP: "process" but not "protect").
DECRYPTABLE = frozenset({S.ACTIVE, S.DEACTIVATED})
DESTROYED_STATES = frozenset({S.DESTROYED, S.DESTROYED_COMPROMISED})
# States whose material a client may retrieve (KMIP Get): every state but destroyed. The
# state restricts what the key may be used for, and the client decides (KMIP 1.4 §3.22).
RETRIEVABLE = frozenset({S.PRE_ACTIVE, S.ACTIVE, S.DEACTIVATED, S.COMPROMISED})


def check_transition(current: KeyState, target: KeyState, *, what: str) -> None:
    if target not in TRANSITIONS[current]:
        advice = {
            S.ACTIVE: "revoke or deactivate it first",
            S.COMPROMISED: "it can only be destroyed",
            S.DESTROYED: "destroyed material cannot be used again",
            S.DESTROYED_COMPROMISED: "it is in a final state",
        }.get(current, "see the key lifecycle in docs/api.md")
        raise Conflict(
            f"{what} is {current.value} and cannot become {target.value}: {advice}",
            code="illegal_state",
        )
