"""The web console end to end: Debian's Chromium (driven by playwright-core, no browser
download) against the real keyserver of the test session (PostgreSQL + SoftHSM2).

Builds nothing: it needs webui/dist (scripts/test runs `npm run build` before pytest;
the `base_url` server mounts the console only if dist existed when it was created)
and webui/node_modules. Set STRONGROOM_UPDATE_SCREENSHOTS=1 to refresh the screenshots
in docs/screenshots/ (otherwise they go to a temporary directory)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest

from keyserver.core.principal import system_context
from keyserver.services import Services
from tests.conftest import REPO

WEBUI = REPO / "webui"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def _require_prerequisites(base_url: str) -> str:
    node = shutil.which("node")
    missing = []
    if not node:
        missing.append("Node.js (apt-get install nodejs npm)")
    if not Path(CHROMIUM).exists():
        missing.append(f"Chromium at {CHROMIUM} (apt-get install chromium)")
    if not (WEBUI / "node_modules" / "playwright-core").is_dir():
        missing.append("webui/node_modules (cd webui && npm ci)")
    if not (WEBUI / "dist" / "index.html").exists():
        missing.append("webui/dist (cd webui && npm run build)")
    assert not missing, "scripts/test prepares these; missing: " + "; ".join(missing)
    page = httpx.get(base_url + "/", timeout=10).text
    assert '<div id="root">' in page, ("the test server does not serve the console: webui/dist did not exist "
                                       "when the session's server started")
    assert node
    return node


@pytest.mark.slow
def test_console_end_to_end(base_url: str, services: Services, tmp_path: Path) -> None:
    node = _require_prerequisites(base_url)
    ctx = system_context("tests")
    admin_user = f"e2e-admin-{uuid.uuid4().hex[:6]}"
    _, otp = services.identity.create_user(ctx, username=admin_user, role="admin")
    auditor_user = f"e2e-auditor-{uuid.uuid4().hex[:6]}"
    auditor_password = f"audit-only-{uuid.uuid4().hex}"
    services.identity.create_user(ctx, username=auditor_user, role="auditor", password=auditor_password)
    assert otp
    shots = REPO / "docs" / "screenshots" if os.environ.get("STRONGROOM_UPDATE_SCREENSHOTS") else tmp_path / "shots"
    env = {
        "PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path),
        "BASE_URL": base_url, "CHROMIUM": CHROMIUM, "SCREENSHOT_DIR": str(shots),
        "ADMIN_USER": admin_user, "ADMIN_OTP": otp,
        "AUDITOR_USER": auditor_user, "AUDITOR_PASSWORD": auditor_password,
    }
    # As in production, the chainer appends audit records in the background.
    services.audit.start(poll_seconds=0.1)
    try:
        proc = subprocess.run([node, "e2e/run.mjs"], cwd=WEBUI, env=env, capture_output=True, text=True,
                              timeout=240)
    finally:
        services.audit.stop()
    out = proc.stdout + proc.stderr
    summary = [line for line in out.splitlines() if line.startswith(("ok ", "not ok ", "# pass", "# fail"))]
    print("\n".join(summary))
    assert proc.returncode == 0, f"browser tests failed (exit {proc.returncode}):\n{out[-12000:]}"
    assert "# fail 0" in out and "# pass 0" not in out, out[-4000:]
    assert sorted(p.name for p in shots.glob("*.png")) == sorted(
        f"{n}.png" for n in ("sign-in", "dashboard", "keys", "key-detail", "audit", "users", "tokens"))
