"""`kms-agent status` against the real agent port, with the guard points' state files as
the daemon leaves them after a re-key (`<id>.rekey.json`) and an unprotect
(`<id>.unprotect.json`) beside their definitions."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest

from agents.cli import Exit
from tests.agents.test_agent_port import enroll_host
from tests.agents.test_cli import kms_agent, write_config


def test_status_after_a_guard_point_rekey(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str], base_url: str, agent_url: str,
                                          admin: httpx.Client) -> None:
    state = enroll_host(tmp_path, base_url, agent_url, admin, name="st").identity.state_dir
    config = write_config(tmp_path / "agent.toml", agent_url, state, tmp_path / "ca.pem")
    folder = state / "guardpoints"
    folder.mkdir(mode=0o700, exist_ok=True)
    gp_id = str(uuid.uuid4())
    mount = tmp_path / "protected"
    (folder / f"{gp_id}.json").write_text(json.dumps({
        "id": gp_id, "path": str(mount), "backing_path": str(tmp_path / "backing"), "key_name": "k",
        "key_id": str(uuid.uuid4()), "revision": 3, "mode": "enforce", "active_version": 1}))
    (folder / f"{gp_id}.status.json").write_text(json.dumps({"revision": 3, "state": "mounted", "detail": ""}))
    (folder / f"{gp_id}.rekey.json").write_text(json.dumps({"done_generation": 1}))
    (folder / f"{gp_id}.unprotect.json").write_text(json.dumps({"done_generation": 0}))

    code, out, err = kms_agent(monkeypatch, capsys, config, "status", "--json")
    assert code == Exit.OK, err
    (point,) = json.loads(out)["guard_points"]
    assert point["path"] == str(mount) and point["revision"] == 3
