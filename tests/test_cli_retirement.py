"""`keyserver version-inventory` and `keyserver retire-version` (decision 0024), the real
command beside a running server on its own store: the inventory as a table, precise
refusals with exit 1, and a retirement that completes once the last data key moved."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from keyserver.cli_retirement import render_inventory
from tests.conftest import own_store
from tests.serve import KEYSERVER, Server, eventually
from tests.test_backup_restore import sign_in

pytestmark = [pytest.mark.store, pytest.mark.slow]


def test_the_cli_shows_a_versions_use_and_retires_it(tmp_path: Path) -> None:
    with own_store() as url, Server(tmp_path / "data", **({"STRONGROOM_DATABASE_URL": url} if url else {})) as server:
        def keyserver(*args: str) -> tuple[int, str]:
            r = subprocess.run([KEYSERVER, *args], env=server.env, capture_output=True, text=True, timeout=300,
                               check=False)
            return r.returncode, " ".join((r.stdout + r.stderr).split())

        api = sign_in(server)
        assert api.post("/api/v1/keys", json={"name": "ledger"}).status_code == 201
        blob = api.post("/api/v1/keys/ledger/generate-data-key", json={}).json()["ciphertext_blob"]
        assert api.post("/api/v1/keys/ledger/rotate", json={}).status_code == 200

        code, out = keyserver("version-inventory", "ledger", "1")
        assert code == 0, out
        assert "key ledger version 1 (deactivated)" in out and "data_keys: 1" in out and "in use" in out
        code, out = keyserver("version-inventory", "no-such-key", "1")
        assert code == 1 and "key_not_found" in out, out
        code, out = keyserver("retire-version", "ledger", "2")
        assert code == 1 and "rotate the key first" in out and "version_active" in out, out
        code, out = keyserver("retire-version", "ledger", "1", "--reason", "annual key retirement")
        assert code == 0 and "retiring version 1 of ledger" in out and "in_use" in out, out
        code, out = keyserver("retire-version", "ledger", "1")
        assert code == 1 and "retirement_running" in out, out

        assert api.post("/api/v1/datakeys/reencrypt", json={"ciphertext_blob": blob}).status_code == 200

        def retired() -> bool:
            code, out = keyserver("version-inventory", "ledger", "1")
            return code == 0 and "signed statement at audit record" in out and "not in use" in out

        eventually(retired, "the retirement completes once the data key moved")
        r = api.get("/api/v1/audit/events", params={"action": "key.version_retired"})
        assert r.status_code == 200 and len(r.json()["items"]) == 1, r.text
        assert r.json()["items"][0]["details"]["statement"]["initial"]["data_keys"] == 1


def test_the_inventory_names_guard_points_with_unreadable_files() -> None:
    """Files no version of the key reads block nothing but are said, per guard point."""
    gp = {"kind": "guard_point", "holder": "g@h", "name": "/srv/data on host-a", "host": "host-a", "count": 0,
          "state": "clear", "unreadable": 2, "reported_at": "2026-11-26T19:00:00+00:00"}
    inv = {"key": "ledger", "version": 1, "state": "deactivated", "holders": [gp, {**gp, "holder": "g@i",
           "name": "/srv/data on host-b", "unreadable": 0}], "kinds": {"guard_point_files": 0},
           "unreported_hosts": [], "retirement": None, "in_use": False}
    out = io.StringIO()
    render_inventory(inv, Console(file=out, width=200))
    text = " ".join(out.getvalue().split())
    assert "no version decrypts them" in text and "/srv/data on host-a: 2" in text
    assert "host-b: 0" not in text and "not in use" in text
