"""`keyserver kmip-client revoke` takes the client's name or its id, as `list` shows
them, and says precisely when neither matches."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.kmip.test_serve import KEYSERVER


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KEYSERVER, *args], env=env, capture_output=True, text=True, timeout=120)


def test_revoke_by_name_or_id(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STRONGROOM_", "SOFTHSM2_CONF"))}
    env.update(STRONGROOM_DATA_DIR=str(tmp_path / "data"), STRONGROOM_LOG_LEVEL="WARNING", COLUMNS="200")
    assert _run(env, "init").returncode == 0
    for name in ("app1.example.com", "app2.example.com"):
        r = _run(env, "kmip-client", "create", name, "--out", str(tmp_path / name))
        assert r.returncode == 0, r.stderr

    r = _run(env, "kmip-client", "revoke", "app1.example.com")
    assert r.returncode == 0, r.stderr
    assert "revoked KMIP client 'app1.example.com'" in r.stderr
    listed = {line.split()[1]: line for line in _run(env, "kmip-client", "list").stdout.splitlines()}
    assert "revoked" in listed["app1.example.com"] and listed["app2.example.com"].endswith("active")

    client_id = listed["app2.example.com"].split()[0]
    r = _run(env, "kmip-client", "revoke", client_id)
    assert r.returncode == 0 and "'app2.example.com'" in r.stderr, r.stderr

    r = _run(env, "kmip-client", "revoke", "nobody.example.com")
    assert r.returncode == 1
    assert r.stderr.strip() == ("no KMIP client named or with id 'nobody.example.com': `keyserver kmip-client "
                                "list` shows each client's id and name")
    assert "hexadecimal" not in r.stderr
