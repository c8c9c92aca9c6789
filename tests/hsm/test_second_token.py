"""The HSM layer on a second real PKCS#11 implementation (openCryptoki's soft token).

openCryptoki's paths are compiled in and its slot daemon runs as root, so the suite
(`tests/hsm/second_token_suite.py`) runs in a pytest of its own inside
`tests.hsm.opencryptoki_sandbox`: private mount, IPC and PID namespaces, a fresh token with
random PINs, `pkcsslotd` killed with the namespace. Its output is shown on failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hsm import opencryptoki_sandbox

ROOT = Path(__file__).resolve().parents[2]


def _run_in_sandbox(*targets: str, store: str | None = None) -> subprocess.CompletedProcess[str]:
    reason = opencryptoki_sandbox.missing()
    if reason is not None:
        pytest.skip(f"second token unavailable: {reason}")
    env = dict(os.environ)
    if store is not None:
        env["STRONGROOM_TEST_STORE"] = store
    command = [sys.executable, "-m", "tests.hsm.opencryptoki_sandbox", "--",
               sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", *targets]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
                          check=False)


def test_the_hsm_layer_on_opencryptoki() -> None:
    done = _run_in_sandbox("tests/hsm/second_token_suite.py")
    assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-5000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-5000:]
