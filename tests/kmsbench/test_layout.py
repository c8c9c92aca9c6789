"""Measurement code lives in kmsbench: the production packages never import it, and the
benchmarks that left the key server's command answer from kms-bench."""

from __future__ import annotations

import ast
import io
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_production_packages_do_not_import_kmsbench() -> None:
    offenders = [f"{path.relative_to(ROOT)}: {name}"
                 for package in ("keyserver", "hsm", "agents") for path in sorted((ROOT / package).rglob("*.py"))
                 for name in _imports(path) if name == "kmsbench" or name.startswith("kmsbench.")]
    assert offenders == []


def test_moved_benchmark_modules_are_gone_from_the_production_packages() -> None:
    for old in ("agents/cryptfile/bench.py", "keyserver/bench.py", "keyserver/kmip/bench.py"):
        assert not (ROOT / old).exists(), old


def test_the_agent_wheel_carries_no_moved_benchmark() -> None:
    from keyserver.runtime.agentdist import build_wheel

    names = zipfile.ZipFile(io.BytesIO(build_wheel().data)).namelist()
    assert "agents/cryptfile/file.py" in names
    assert "agents/cryptfile/bench.py" not in names


def test_the_benchmark_commands_run_from_kms_bench() -> None:
    for command, says in (("keyserver", "--virtual-users"), ("kmip", "--connections")):
        done = subprocess.run([sys.executable, "-m", "kmsbench", command, "--help"], capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert f"kms-bench {command}" in done.stdout and says in done.stdout


def test_the_old_keyserver_commands_say_where_they_went() -> None:
    keyserver = str(Path(sys.executable).with_name("keyserver"))
    for old, new in (("bench", "kms-bench keyserver"), ("bench-kmip", "kms-bench kmip")):
        done = subprocess.run([keyserver, old, "--output", "x.md"], capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 2 and new in done.stderr, done.stderr
