"""The compiled format engine (agents/dataplane), the guard points' data plane
(agents/dataplane/fuse) and the volumes' (agents/dataplane/volume) are built before the
agent tests run, so
they use it as a host would (`scripts/test` builds it too; make makes this a no-op
then). Without a C toolchain the engine stays unbuilt: the agent falls back to the
Python reference and the tests that need the engine skip, saying why."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests import parallel

DATAPLANE = Path(__file__).resolve().parents[2] / "agents" / "dataplane"


def _build() -> str | None:
    """None when libsrcf is built and current, else why not."""
    missing = [tool for tool in ("make", "cc") if shutil.which(tool) is None]
    if missing or not Path("/usr/include/openssl/evp.h").exists():
        return f"no C toolchain to build agents/dataplane (missing: {', '.join(missing) or 'libssl-dev'})"
    r = parallel.make(DATAPLANE, "lib")
    if r.returncode != 0:
        pytest.fail(f"make -C agents/dataplane lib failed:\n{r.stdout}{r.stderr}", pytrace=False)
    if Path("/usr/include/liburing.h").exists():  # the guard points' data plane
        r = parallel.make(DATAPLANE / "fuse", "all")
        if r.returncode != 0:
            pytest.fail(f"make -C agents/dataplane/fuse failed:\n{r.stdout}{r.stderr}", pytrace=False)
    if Path("/usr/include/libcryptsetup.h").exists():  # the volumes' userspace data plane
        r = parallel.make(DATAPLANE / "volume", "all")
        if r.returncode != 0:
            pytest.fail(f"make -C agents/dataplane/volume failed:\n{r.stdout}{r.stderr}", pytrace=False)
    return None


@pytest.fixture(scope="session", autouse=True)
def native_built() -> str | None:
    return _build()


@pytest.fixture(scope="session")
def native_engine(native_built: str | None) -> None:
    """Tests of the compiled engine itself: skipped (with the reason) without a toolchain."""
    if native_built is not None:
        pytest.skip(native_built)
