"""How the suite runs on several pytest-xdist workers (`scripts/test` uses `-n N --dist loadgroup`).

The machine has two cores and the suite mostly waits (on servers starting, sockets,
fsync, PostgreSQL, Chromium), so several workers share them well. Each worker is a
process of its own with its own session: its own SoftHSM2 token, its own scratch
database or data directory, its own servers, on ports from one shared counter
(kmsbench/ports.py). Two rules keep the tests that share more than that correct:

* **A module with a module- or class-scoped fixture runs on one worker**, in its order:
  its tests share what the fixture set up (a rig, a cluster, a token), and setting it up
  once per worker would cost what the workers save. `arrange` marks them with one
  `xdist_group`; a test may also name a group itself (`@pytest.mark.xdist_group("…")`)
  when it shares something of the machine's with others (a fixed port, say).
* **A load drill runs alone.** A test marked `exclusive` measures the product under a load
  of its own (the failover drills) and means nothing on a starved machine: `scripts/test`
  leaves it out of the parallel phases and runs it last, by itself. `exclusive(stores=[…])`
  does so on those stores only (the console's run on the embedded store, whose one writer
  at a time waits at most 5 s: starved, a page's request is answered 503).
* **The longest work first.** The scheduler hands work out in the collection's order, so
  a ten-minute test collected last would run alone at the end while the other workers
  idle. `arrange` sorts the work units (a group, or a lone test) longest first, by the
  durations of the last recorded run (tests/durations.json, `scripts/test
  --record-durations`); a test not recorded there weighs what `slow` says, else nothing.
  The order within a group is the collection's.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
RECORD_ENV = "STRONGROOM_TEST_RECORD_DURATIONS"
SLOW_GUESS = 60.0  # seconds a `slow` test not yet recorded is taken to last
RECORD_MIN = 1.0  # shorter tests are not worth a line in durations.json
QUICK_ENV = "STRONGROOM_TEST_QUICK"
EXCLUSIVE_ENV = "STRONGROOM_TEST_EXCLUSIVE"
QUICK_MAX = 3.0  # `scripts/test --quick` runs the tests recorded shorter than this (and not `slow`)


def store() -> str:
    return os.environ.get("STRONGROOM_TEST_STORE", "postgresql")


def _plain(nodeid: str) -> str:
    """The test's id without the `@group` that xdist appends under --dist loadgroup."""
    return nodeid.split("@", 1)[0]


def _recorded() -> dict[str, float]:
    try:
        data = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    section = data.get(store(), {}) if isinstance(data, dict) else {}
    return {str(k): float(v) for k, v in section.items()} if isinstance(section, dict) else {}


def _shares_a_scope(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(d.scope in ("module", "class", "package") for defs in info.name2fixturedefs.values() for d in defs)


def exclusive(config: pytest.Config, items: list[pytest.Item]) -> None:
    """STRONGROOM_TEST_EXCLUSIVE=skip: leave out the tests marked `exclusive` (the parallel
    phases); =only: run just those (scripts/test's last phase, alone on the machine)."""
    want = os.environ.get(EXCLUSIVE_ENV)
    if want not in ("skip", "only"):
        return
    keep, drop = [], []
    for item in items:
        mark = item.get_closest_marker("exclusive")
        alone = mark is not None and store() in mark.kwargs.get("stores", (store(),))
        (keep if alone == (want == "only") else drop).append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep


def quick(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `scripts/test --quick`, only the fast tests: neither marked `slow` nor recorded
    (tests/durations.json) at QUICK_MAX seconds or more. A new test not yet recorded runs."""
    if not os.environ.get(QUICK_ENV):
        return
    recorded = _recorded()
    fast, slow = [], []
    for item in items:
        long = item.get_closest_marker("slow") is not None or recorded.get(item.nodeid, 0.0) >= QUICK_MAX
        (slow if long else fast).append(item)
    config.hook.pytest_deselected(items=slow)
    items[:] = fast


def arrange(items: list[pytest.Item]) -> None:
    """Group and order `items` in place (the same on every worker: it depends on nothing
    but the items and tests/durations.json)."""
    recorded = _recorded()
    unit_of: dict[str, str] = {}
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        if mark is None and _shares_a_scope(item):
            group = item.nodeid.split("::", 1)[0]
            item.add_marker(pytest.mark.xdist_group(group))
            unit_of[item.nodeid] = group
        elif mark is not None:
            unit_of[item.nodeid] = str(mark.kwargs.get("name", mark.args[0] if mark.args else "default"))
        else:
            unit_of[item.nodeid] = item.nodeid
    weight: dict[str, float] = defaultdict(float)
    for item in items:
        guess = SLOW_GUESS if item.get_closest_marker("slow") else 0.0
        weight[unit_of[item.nodeid]] += recorded.get(item.nodeid, guess)
    position = {item.nodeid: i for i, item in enumerate(items)}
    first_of: dict[str, int] = {}
    for item in items:
        first_of.setdefault(unit_of[item.nodeid], position[item.nodeid])
    items.sort(key=lambda it: (-weight[unit_of[it.nodeid]], first_of[unit_of[it.nodeid]], position[it.nodeid]))


class Recorder:
    """Writes each test's time (set-up, call and tear-down) to tests/durations.json, for
    this store, when STRONGROOM_TEST_RECORD_DURATIONS is set; on the controller only (it
    sees every worker's reports)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[_plain(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        try:
            data = json.loads(DURATIONS.read_text())
        except (OSError, ValueError):
            data = {}
        data[store()] = {k: round(v, 1) for k, v in sorted(self.seconds.items()) if v >= RECORD_MIN}
        DURATIONS.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def configure(config: pytest.Config) -> None:
    if os.environ.get(RECORD_ENV) and not hasattr(config, "workerinput"):
        config.pluginmanager.register(Recorder(), "strongroom-durations")


@contextlib.contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """Held by one process of the machine at a time (workers, both stores' runs): for what
    every worker would otherwise do at once to one shared thing (a `make` in the tree)."""
    with open(Path(tempfile.gettempdir()) / f"strongroom-tests-{name}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def make(directory: Path, *args: str, timeout: float | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`make -s -C directory ARGS`, one at a time on the machine: two workers building the
    same objects at once would each see the other's half-written files."""
    with machine_lock("make"):
        return subprocess.run(["make", "-s", "-C", str(directory), *args], capture_output=True, text=True,
                              timeout=timeout, env=env, check=False)
