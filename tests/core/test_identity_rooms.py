"""keyserver/core/identity's rooms stay small and import one way, as its module map says:
`__init__ → external → sessions → totp → users → passwords, records`; `tokens → records`;
`throttle` imports nothing of ours; no room reaches back to the facade."""

from __future__ import annotations

from tests.test_architecture import ROOT, _imports, _modules

PACKAGE = "keyserver.core.identity"
# Each room and the rooms it may import.
ALLOWED = {
    "records": set(),
    "passwords": set(),
    "throttle": set(),
    "users": {"records", "passwords"},
    "totp": {"records", "users"},
    "sessions": {"records", "passwords", "throttle", "totp"},
    "external": {"records", "passwords", "sessions", "users"},
    "tokens": {"records"},
}


def test_each_room_imports_only_the_rooms_below_it() -> None:
    modules = _modules()
    # Unfiltered: the architecture test's graph drops a module's edge to its own package.
    rooms = {name.removeprefix(PACKAGE + "."): _imports(name, path, set(modules))
             for name, path in modules.items() if name.startswith(PACKAGE + ".")}
    assert set(rooms) == set(ALLOWED), "a new room: add it to ALLOWED and to the package's module map"
    for room, deps in rooms.items():
        inside = {d.removeprefix(PACKAGE + ".") for d in deps if d.startswith(PACKAGE + ".")}
        assert inside <= ALLOWED[room], f"{room} imports {sorted(inside - ALLOWED[room])}"
        assert PACKAGE not in deps, f"{room} imports the facade"


def test_the_rooms_stay_small() -> None:
    for path in sorted((ROOT / "keyserver" / "core" / "identity").glob("*.py")):
        assert len(path.read_text().splitlines()) < 400, f"{path.name}: carve it"
