from __future__ import annotations

import pytest

from keyserver.core.errors import Conflict
from keyserver.core.states import TRANSITIONS, KeyState, check_transition

S = KeyState
LEGAL = {
    (S.PRE_ACTIVE, S.ACTIVE), (S.PRE_ACTIVE, S.DEACTIVATED), (S.PRE_ACTIVE, S.COMPROMISED),
    (S.PRE_ACTIVE, S.DESTROYED), (S.ACTIVE, S.DEACTIVATED), (S.ACTIVE, S.COMPROMISED),
    (S.DEACTIVATED, S.COMPROMISED), (S.DEACTIVATED, S.DESTROYED),
    (S.COMPROMISED, S.DESTROYED_COMPROMISED), (S.DESTROYED, S.DESTROYED_COMPROMISED),
}


@pytest.mark.parametrize("a", list(S))
@pytest.mark.parametrize("b", list(S))
def test_only_kmip_transitions_are_legal(a: KeyState, b: KeyState) -> None:
    if (a, b) in LEGAL:
        check_transition(a, b, what="k")
    else:
        with pytest.raises(Conflict) as exc:
            check_transition(a, b, what="k")
        assert exc.value.code == "illegal_state" and a.value in exc.value.message


def test_table_matches_the_kmip_diagram() -> None:
    assert {(a, b) for a, targets in TRANSITIONS.items() for b in targets} == LEGAL
