"""The architecture, checked: no import cycles between the project's modules (lazy
imports inside functions count: they hide a cycle, they do not remove it), `core` knows
no HTTP or KMIP, the protocol side (`api`, `kmip`, `runtime`) reaches the store only
through `core`, and `hsm` is the only user of PKCS#11. Every rule is over every module
of every package found on disk, so a new package or module is checked the day it lands."""

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


# The protocol side: it serves HTTP, KMIP and the worker processes, and speaks to the
# database only through core (keyserver/core/views.py, the services). Each exception
# names why it must stay.
PROTOCOL_SIDE = ("keyserver.api", "keyserver.kmip", "keyserver.runtime")
STORE = "keyserver.store"
STORE_ALLOWED = {
    # The problem handler turns "the store was busy" (a lock or pooled connection not free
    # in time, raised from anywhere below) into 503 + Retry-After; it recognises the
    # driver's exception, which only the store knows how to read.
    "keyserver.api.problems": "is_busy: the store's busy error → 503 at the edge",
    # The XKS proxy tries each call on the event loop; the store's pool refuses it a
    # connection there (no_blocking → WouldBlock) before taking one, and the call is
    # redone in a thread. A property of the pool, so only the store can offer it.
    "keyserver.api.routes.xks_proxy": "no_blocking/WouldBlock: no connection on the event loop",
}


def _store_importers(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Protocol-side modules that import the store, with what they import of it."""
    return {name: sorted(t for t in targets if t == STORE or t.startswith(STORE + "."))
            for name, targets in sorted(graph.items())
            if (name in PROTOCOL_SIDE or name.startswith(tuple(p + "." for p in PROTOCOL_SIDE)))
            and any(t == STORE or t.startswith(STORE + ".") for t in targets)}


def test_the_protocol_side_reaches_the_store_only_through_core() -> None:
    offenders = {name: found for name, found in _store_importers(_graph()).items() if name not in STORE_ALLOWED}
    assert offenders == {}, "import what you need from keyserver.core (views.py, kmip_model.py, a service)"


def test_every_store_exception_names_a_module_that_exists() -> None:
    assert set(STORE_ALLOWED) <= set(_modules())


def test_the_store_rule_finds_an_offender() -> None:
    graph = {"keyserver.api.routes.x": {"keyserver.store.models", "keyserver.core.keys"},
             "keyserver.kmip": {"keyserver.store"}, "keyserver.core.keys": {"keyserver.store.models"},
             "keyserver.apiary": {"keyserver.store"}}
    assert _store_importers(graph) == {"keyserver.api.routes.x": ["keyserver.store.models"],
                                       "keyserver.kmip": ["keyserver.store"]}


def test_every_package_is_checked() -> None:
    # A top-level package these rules did not walk would be checked by none of them.
    top_level = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert top_level <= set(PACKAGES)
    # A directory of modules without __init__.py is a namespace package: importable, but
    # easy to miss; every importable directory of project modules is a regular package (a
    # name that is no identifier, like a fuzz corpus with its generator, is not imported).
    for package in PACKAGES:
        for d in sorted((ROOT / package).rglob("*")):
            if d.is_dir() and d.name.isidentifier() and "node_modules" not in d.parts and any(d.glob("*.py")):
                assert (d / "__init__.py").exists(), f"{d.relative_to(ROOT)} has modules but no __init__.py"


# The product's sides meet only over the wire: the agent speaks to the key server through
# its port, never by importing it, and neither imports the other's code; measurement code
# (kmsbench) drives them from outside and is never imported by them.
SIDES = {"agents": {"keyserver", "kmsbench"}, "keyserver": {"agents", "kmsbench"},
         "hsm": {"agents", "keyserver", "kmsbench"}}


CROSSINGS_ALLOWED = {
    # The server distributes the agent (a wheel built from its files, decision 0007); it
    # reads the package's version, nothing of its code.
    ("keyserver.runtime.agentdist", "agents"): "the wheel is named after agents.__version__",
}


def _crossings(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    def crosses(name: str, target: str) -> bool:
        side = name.split(".")[0]
        return side in SIDES and target.split(".")[0] in SIDES[side] and (name, target) not in CROSSINGS_ALLOWED

    return {name: sorted(t for t in targets if crosses(name, t))
            for name, targets in sorted(graph.items()) if any(crosses(name, t) for t in targets)}


def test_agents_key_server_and_hsm_meet_only_over_the_wire() -> None:
    assert _crossings(_graph()) == {}
    assert all(a in _modules() and b in _modules() for a, b in CROSSINGS_ALLOWED)


def test_the_sides_rule_finds_an_offender() -> None:
    graph = {"agents.cli": {"keyserver.core.keys", "agents.config"}, "keyserver.api.app": {"kmsbench.cli"},
             "kmsbench.cli": {"keyserver.services", "agents.cli"}}
    assert _crossings(graph) == {"agents.cli": ["keyserver.core.keys"], "keyserver.api.app": ["kmsbench.cli"]}


# One concern a file: a production file past ~600 lines holds more than one (CONTRIBUTING.md).
# Generated code (the console's typed API client) and tests are not production files.
MAX_LINES = 600
SOURCES = ("*.py", "*.c", "*.h", "*.ts", "*.tsx", "*.sh")
GENERATED = {"webui/src/api/schema.ts"}


def _production_files() -> list[Path]:
    roots = [ROOT / p for p in PACKAGES] + [ROOT / "webui" / "src", ROOT / "scripts", ROOT / "migrations"]
    found = []
    for root in roots:
        for pattern in SOURCES:
            for p in root.rglob(pattern):
                rel = p.relative_to(ROOT)
                if ("node_modules" in rel.parts or "tests" in rel.parts or "test" in rel.parts
                        or ".test." in p.name or str(rel) in GENERATED or not p.is_file()):
                    continue
                found.append(p)
    return sorted(found)


def test_no_production_file_holds_more_than_one_concern() -> None:
    files = _production_files()
    assert len(files) > 200, "the walk found the project's sources"
    lengths = {str(p.relative_to(ROOT)): len(p.read_text(errors="replace").splitlines()) for p in files}
    long = {name: n for name, n in lengths.items() if n > MAX_LINES}
    assert long == {}, f"split these by concern (over {MAX_LINES} lines)"
