#!/usr/bin/env python3
"""Regenerate docs/kmip.md's per-client interop matrix from real runs of
tests/kmip/test_appliances.py (each test records its steps and outcome).

    .venv/bin/python scripts/kmip_matrix.py          # run the tests, rewrite the table
    .venv/bin/python scripts/kmip_matrix.py --check  # run them, exit 1 if the table differs

The tests themselves fail when their committed row differs from what they produce, so
`pytest tests/kmip` keeps the table honest; this script is how it is rewritten.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.kmip.matrix import DOCS, ENV, block, render, replace  # noqa: E402

TEST = "tests/kmip/test_appliances.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="do not write; exit 1 when the table differs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "matrix.json"
        env = {**os.environ, ENV: str(out)}
        listed = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", TEST],
                                cwd=ROOT, env=env, capture_output=True, text=True)
        order = [line.split("::")[1] for line in listed.stdout.splitlines() if "::" in line]
        # the rows are written before each test compares its own: the old table must not stop it
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", TEST], cwd=ROOT, env=env)
        runs = json.loads(out.read_text()) if out.exists() else []
    table = render(runs, order)
    text = DOCS.read_text()
    if block(text) == table:
        print("docs/kmip.md: interop matrix up to date")
        return 0
    if args.check:
        print("docs/kmip.md: interop matrix differs from the tests' runs:\n" + table)
        return 1
    DOCS.write_text(replace(text, table))
    print("docs/kmip.md: interop matrix rewritten")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
