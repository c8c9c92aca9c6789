"""The agent's guard-point transport settings (issue 26): `fuse_writeback_cache` and
`fuse_io_uring` in agent.toml, how they reach the data plane's command line, and the
host-wide io_uring switch they may turn on."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.config import AgentConfig, ConfigError
from agents.guardpoint.dataplane import DataPlane, enable_fuse_io_uring

BASE = 'server_url = "https://kms.example:8444"\nca_file = "/etc/ca.pem"\nstate_dir = "/var/lib/sr"\n'


def _load(tmp_path: Path, extra: str) -> AgentConfig:
    path = tmp_path / "agent.toml"
    path.write_text(BASE + extra)
    return AgentConfig.load(path)


def test_defaults_are_the_writeback_cache_without_io_uring(tmp_path: Path) -> None:
    config = _load(tmp_path, "")
    assert config.fuse_writeback_cache is True and config.fuse_io_uring is False


def test_both_settings_are_read(tmp_path: Path) -> None:
    config = _load(tmp_path, "fuse_writeback_cache = false\nfuse_io_uring = true\n")
    assert config.fuse_writeback_cache is False and config.fuse_io_uring is True


@pytest.mark.parametrize("line", ['fuse_io_uring = "yes"', "fuse_writeback_cache = 1"])
def test_a_value_that_is_not_a_boolean_is_refused_by_name(tmp_path: Path, line: str) -> None:
    name = line.split()[0]
    with pytest.raises(ConfigError, match=f"'{name}' must be true or false"):
        _load(tmp_path, line + "\n")


def test_the_settings_reach_the_daemons_command_line() -> None:
    plane = DataPlane("/b", "/m", writeback_cache=False, io_uring=True)
    cmd = plane._cmd
    assert cmd[cmd.index("--writeback-cache") + 1] == "off" and "--io-uring" in cmd
    plane = DataPlane("/b", "/m")
    cmd = plane._cmd
    assert cmd[cmd.index("--writeback-cache") + 1] == "on" and "--io-uring" not in cmd


def test_io_uring_is_turned_on_never_off(tmp_path: Path) -> None:
    param = tmp_path / "enable_uring"
    param.write_text("N\n")
    assert enable_fuse_io_uring(param) is None
    assert param.read_text() == "Y\n"
    assert enable_fuse_io_uring(param) is None  # already on: nothing written
    assert param.read_text() == "Y\n"


def test_a_kernel_without_fuse_over_io_uring_is_named(tmp_path: Path) -> None:
    why = enable_fuse_io_uring(tmp_path / "absent")
    assert why is not None and "Linux 6.14" in why
