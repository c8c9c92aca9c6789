"""The rotation suite: rotate a guard point's key (header re-wrap) and re-key it
(re-encrypt every file) while a reader keeps reading every file through the mount and
checking its content. The reader's errors must be 0; its throughput while idle, during
the re-wrap and during the re-key is the plain-vs-rotating comparison.

The guard point is the native data plane (`strongroom-fuse`) driven by a control plane in
a process of its own, as the agent runs one per guard point; the rotation runs there as
the agent's does it: the new version handed to the data plane, then each header re-wrapped
in place (`rewrap_in_place`), and a re-key through the data plane's REKEY (each file
written anew and exchanged while readers wait on it).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from agents.cryptfile import KeyVersion, StaticKeyring
from agents.cryptfile.transform import TMP_PREFIX

IDLE_SECONDS = 2.0


def _serve(backing: str, mnt: str, keys: list[KeyVersion], control: Connection) -> None:
    from agents.cryptfile import rewrap_in_place
    from agents.guardpoint.dataplane import DataPlane
    from agents.guardpoint.policy import PERMIT_ALL

    def configure(p: DataPlane) -> None:
        p.set_key(keys[0])
        p.set_active(keys[0])
        p.set_policy(PERMIT_ALL)

    plane = DataPlane(backing, mnt).start(configure=configure)
    ring = StaticKeyring(keys)

    def rotate() -> None:
        # Commands: ("rewrap" | "rekey", version) -> (seconds, files) or ("error", text).
        while True:
            try:
                op, version = control.recv()
            except EOFError:
                return
            key = next(k for k in keys if k.version == version)
            try:
                names = sorted(n for n in os.listdir(backing) if not n.startswith(TMP_PREFIX))
                start = time.perf_counter()
                plane.set_key(key)
                plane.set_active(key)
                for name in names:
                    if op == "rewrap":
                        rewrap_in_place(os.path.join(backing, name), ring, key)
                    elif (rc := plane.rekey(name)) != 0:
                        raise OSError(rc, f"re-key of {name}: {os.strerror(rc)}")
                control.send((time.perf_counter() - start, len(names)))
            except Exception as exc:  # reported to the parent, which fails the suite
                control.send(("error", f"{type(exc).__name__}: {exc}"))

    threading.Thread(target=rotate, daemon=True).start()
    plane.wait()


@dataclass
class _Reader:
    """Reads every file in turn through the mount and checks it against its digest."""

    mnt: Path
    digests: dict[str, bytes]
    stop: threading.Event = field(default_factory=threading.Event)
    reads: int = 0
    bytes_read: int = 0
    errors: list[str] = field(default_factory=list)

    def run(self) -> None:
        while not self.stop.is_set():
            for name, digest in self.digests.items():
                if self.stop.is_set():
                    return
                try:
                    with open(self.mnt / name, "rb", buffering=0) as f:
                        data = f.read()
                    if hashlib.sha256(data).digest() != digest:
                        self.errors.append(f"{name}: content differs")
                    self.reads += 1
                    self.bytes_read += len(data)
                except OSError as exc:
                    self.errors.append(f"{name}: {exc}")

    def snapshot(self) -> tuple[int, int, int]:
        return self.reads, self.bytes_read, len(self.errors)


def measure(*, base: Path, files: int, file_kib: int, runs: int,
            step: Callable[[str], None]) -> dict[str, Any]:
    """Per run: seconds to re-wrap and to re-key all files, and the reader's MB/s idle,
    during the re-wrap and during the re-key, with its read and error counts."""
    backing, mnt = base / "rot-backing", base / "rot"
    backing.mkdir()
    mnt.mkdir()
    key_id = uuid.uuid4()
    keys = [KeyVersion(key_id, v, os.urandom(32)) for v in range(1, runs + 2)]
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(str(backing), str(mnt), keys, child), daemon=True)
    proc.start()
    reader: _Reader | None = None
    thread: threading.Thread | None = None
    result: dict[str, Any] = {"runs": []}
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mnt):
            if not proc.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"could not mount the rotation guard point at {mnt}")
            time.sleep(0.05)
        digests: dict[str, bytes] = {}
        for i in range(files):
            data = os.urandom(file_kib * 1024)
            name = f"f{i:05d}"
            with open(mnt / name, "wb") as f:
                f.write(data)
            digests[name] = hashlib.sha256(data).digest()
        os.sync()
        step("files written")
        reader = _Reader(mnt, digests)
        thread = threading.Thread(target=reader.run, daemon=True)
        thread.start()
        for run in range(runs):
            version = run + 2
            figures: dict[str, Any] = {}
            before, started = reader.snapshot(), time.perf_counter()
            time.sleep(IDLE_SECONDS)
            after = reader.snapshot()
            figures["idle"] = _phase(before, after, time.perf_counter() - started)
            for op in ("rewrap", "rekey"):
                before, started = reader.snapshot(), time.perf_counter()
                parent.send((op, version))
                answer = parent.recv()
                if answer[0] == "error":
                    raise RuntimeError(f"{op} failed in the guard point: {answer[1]}")
                seconds, count = answer
                figures[op] = {"seconds": seconds, "files": count,
                               **_phase(before, reader.snapshot(), time.perf_counter() - started)}
                step(f"{op} run {run + 1}")
            result["runs"].append(figures)
        reader.stop.set()
        thread.join(60)
        result["reader_errors"] = len(reader.errors)
        result["reader_error_samples"] = reader.errors[:5]
        result["reader_reads"] = reader.reads
        return result
    finally:
        if reader is not None:
            reader.stop.set()
        if thread is not None:
            thread.join(60)
        parent.close()
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False, capture_output=True)
        proc.join(10)
        if proc.is_alive():
            subprocess.run(["fusermount3", "-uz", str(mnt)], check=False, capture_output=True)
            proc.terminate()
            proc.join(10)


def _phase(before: tuple[int, int, int], after: tuple[int, int, int], seconds: float) -> dict[str, float]:
    return {"reader_reads": after[0] - before[0], "reader_mb_s": (after[1] - before[1]) / seconds / 1e6,
            "reader_errors": after[2] - before[2], "wall_seconds": seconds}
