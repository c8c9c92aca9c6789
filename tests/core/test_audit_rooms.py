"""keyserver/core/audit is rooms of one concern behind a facade: each room stays small,
and no room reaches back through the facade (the rooms import one another, never the
package, so the facade can change without a cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

import keyserver.core.audit as audit

ROOMS = Path(audit.__file__).parent
MAX_LINES = 400


def test_each_room_is_small() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in ROOMS.glob("*.py")}
    assert {"record.py", "writer.py", "group_commit.py", "chain.py", "checkpoints.py", "names.py", "read.py",
            "activity.py", "export.py", "verify.py"} <= set(sizes)
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


def test_no_room_imports_the_facade() -> None:
    offenders = []
    for path in sorted(ROOMS.glob("*.py")):
        if path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module] if isinstance(node, ast.ImportFrom) else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if "keyserver.core.audit" in names:
                offenders.append(path.name)
    assert offenders == []


def test_the_facade_keeps_the_public_names() -> None:
    for name in audit.__all__:
        assert getattr(audit, name) is not None, name
    methods = ("add", "add_many", "commit", "commit_async", "record_now", "transaction", "record_after", "start",
               "stop", "flush", "public_key_der", "public_key_pem", "checkpoints", "chain_state", "status",
               "pending", "query", "get", "activity", "usage", "export", "verify")
    init = ast.parse((ROOMS / "__init__.py").read_text())
    assigned = {t.attr for node in ast.walk(init) if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Attribute)}
    assert set(methods) <= assigned
