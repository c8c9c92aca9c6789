"""The architecture, checked: no import cycles between the project's modules (lazy
imports inside functions count: they hide a cycle, they do not remove it), `core` knows
no HTTP or KMIP, and `hsm` is the only user of PKCS#11."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = ("keyserver", "hsm", "agents", "kmsbench")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))
            if "node_modules" not in p.parts}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports, resolved to the longest known module name."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph = {name: _imports(name, path, known) for name, path in modules.items()}
    # A package's __init__ importing its own submodules is how packages re-export; it is
    # not a dependency of the submodules on each other.
    for name in graph:
        graph[name] = {t for t in graph[name] if not (name.startswith(t + ".") and t in modules)}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _third_party(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
            if node.module == "keyserver":
                names.update(f"keyserver.{a.name}" for a in node.names)
            elif node.module.startswith("keyserver."):
                names.add(".".join(node.module.split(".")[:2]))
    return names


def test_core_knows_no_http_nor_kmip() -> None:
    # Serving protocols, not speaking to the outside: the webhook audit sink's HTTPS client
    # (httpx) is an outbound integration like syslog, and belongs with the sinks.
    forbidden = {"fastapi", "starlette", "uvicorn", "kmip", "keyserver.api", "keyserver.kmip",
                 "keyserver.runtime"}
    offenders = {str(p.relative_to(ROOT)): sorted(_third_party(p) & forbidden)
                 for p in sorted((ROOT / "keyserver" / "core").rglob("*.py")) if _third_party(p) & forbidden}
    assert offenders == {}


def test_hsm_is_the_only_pkcs11_user() -> None:
    offenders = [str(p.relative_to(ROOT)) for package in PACKAGES if package != "hsm"
                 for p in sorted((ROOT / package).rglob("*.py")) if "pkcs11" in _third_party(p)]
    assert offenders == []
