"""Fixtures for the hsm tests: one SoftHSM2 token directory for the whole pytest process.

SoftHSM2 reads SOFTHSM2_CONF once per process, so every backend in this process,
including the ones the integration tests build, must share the directory chosen here.
`hsm.testing.shared_test_backend` guarantees that whichever conftest asks first.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hsm import testing
from hsm.config import HsmConfig
from hsm.pkcs11 import Pkcs11Backend, open_backend


@pytest.fixture(scope="session")
def hsm_config(tmp_path_factory: pytest.TempPathFactory) -> HsmConfig:
    return testing.shared_test_config(lambda: tmp_path_factory.mktemp("softhsm"))


@pytest.fixture(scope="session")
def hsm_backend(hsm_config: HsmConfig, tmp_path_factory: pytest.TempPathFactory) -> Pkcs11Backend:
    return testing.shared_test_backend(lambda: tmp_path_factory.mktemp("softhsm"))


@pytest.fixture(scope="session")
def hsm_token_base(hsm_config: HsmConfig) -> Path:
    """The directory make_test_config() was given; pass it to subprocesses and new configs."""
    assert hsm_config.softhsm_token_dir is not None
    return hsm_config.softhsm_token_dir.parent


@pytest.fixture
def side_token(hsm_token_base: Path, request: pytest.FixtureRequest) -> Iterator[Pkcs11Backend]:
    """A backend on a token of its own (same directory), for tests that break things."""
    label = f"side-{abs(hash(request.node.nodeid)) % 10**8}"
    backend = open_backend(testing.make_test_config(hsm_token_base, token_label=label))
    yield backend
    backend.close()
