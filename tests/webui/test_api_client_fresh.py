"""The web console's typed API client (webui/src/api/schema.ts) is generated from the
keyserver's OpenAPI document and committed; this fails when the API changed and the
client was not regenerated (`cd webui && npm run gen:api`)."""

from __future__ import annotations

import difflib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from keyserver.api.openapi_dump import openapi_document
from tests.conftest import REPO

WEBUI = REPO / "webui"
COMMITTED = WEBUI / "src" / "api" / "schema.ts"


def test_openapi_dump_needs_no_server() -> None:
    out = subprocess.run([sys.executable, "-m", "keyserver.api.openapi_dump"], cwd=REPO, check=True,
                         capture_output=True, text=True, timeout=120).stdout
    doc = json.loads(out)
    assert doc == json.loads(json.dumps(openapi_document()))
    assert "/api/v1/keys/{key_ref}/rotate" in doc["paths"]
    ops = [op["operationId"] for item in doc["paths"].values() for op in item.values()]
    assert len(ops) == len(set(ops)), "operationIds must be unique"


def test_generated_client_is_fresh(tmp_path: Path) -> None:
    node = shutil.which("node")
    assert node, "Node.js is needed (scripts/test installs it)"
    assert (WEBUI / "node_modules" / "openapi-typescript").is_dir(), \
        "webui dependencies are missing: run `npm ci` in webui (scripts/test does)"
    subprocess.run([node, "scripts/gen-api.mjs", "--out", str(tmp_path)], cwd=WEBUI, check=True,
                   capture_output=True, text=True, timeout=120, env={"PYTHON": sys.executable,
                                                                    "PATH": str(Path(node).parent)})
    fresh = (tmp_path / "schema.ts").read_text()
    committed = COMMITTED.read_text()
    if fresh != committed:
        diff = "".join(list(difflib.unified_diff(committed.splitlines(True), fresh.splitlines(True),
                                                 "committed schema.ts", "from the current API"))[:80])
        raise AssertionError("webui/src/api/schema.ts is stale: run `cd webui && npm run gen:api` "
                             f"and commit the result.\n{diff}")
