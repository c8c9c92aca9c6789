"""The directories kms-bench creates, and only those, are what it removes.

A directory it makes gets a marker file naming the run; the work directory must be
absent, empty, or carry that marker (left by an interrupted run of kms-bench). On exit,
normal or not, FUSE mounts under the work directory are unmounted first (a removal
through a live mount would delete through it), then what was created is removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from kmsbench.errors import BenchError, Exit

MARKER = ".kms-bench"


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below `root`, deepest first."""
    try:
        text = Path("/proc/self/mounts").read_text()
    except OSError:
        return []
    base = str(root.resolve())
    found = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            mnt = parts[1].replace("\\040", " ")
            if mnt == base or mnt.startswith(base + "/"):
                found.append(mnt)
    return sorted(found, key=len, reverse=True)


def unmount_all(root: Path) -> list[str]:
    """Unmount every mount under `root` (lazily if busy); returns those still mounted."""
    for mnt in mounts_under(root):
        for args in (["fusermount3", "-u"], ["umount"], ["fusermount3", "-uz"], ["umount", "-l"]):
            if shutil.which(args[0]) is None:
                continue
            subprocess.run([*args, mnt], capture_output=True, check=False, timeout=60)
            if mnt not in mounts_under(root):
                break
    return mounts_under(root)


class Workspace:
    """The output and work directories of one run."""

    def __init__(self, out: Path, work: Path, *, run_id: str) -> None:
        self.out, self.work, self.run_id = out.absolute(), work.absolute(), run_id
        self._made: list[Path] = []  # directories created here, removed whole on cleanup
        self._emptied: list[Path] = []  # existing empty directories adopted: only their contents go

    @staticmethod
    def check(path: Path, *, what: str) -> None:
        """Refuse a path that holds anything kms-bench did not put there."""
        if path.exists() and not path.is_dir():
            raise BenchError(Exit.PATHS, f"{what} {path} is a file", f"choose a new or empty directory for {what}")
        if path.is_dir():
            entries = [p.name for p in path.iterdir()]
            if entries and MARKER not in entries:
                raise BenchError(Exit.PATHS, f"{what} {path} is not empty and was not made by kms-bench",
                                 f"choose a new or empty directory for {what}; kms-bench never deletes files "
                                 "it did not create")

    def _claim(self, path: Path) -> None:
        if path.is_dir():
            if (path / MARKER).exists():
                # Left by an interrupted kms-bench run: ours to clean, start afresh.
                unmount_all(path)
                for child in path.iterdir():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
            self._emptied.append(path)
        else:
            path.mkdir(parents=True)
            self._made.append(path)
        (path / MARKER).write_text(f"created by kms-bench run {self.run_id}\n")

    def create(self) -> None:
        self.check(self.out, what="--out")
        self.check(self.work, what="--workdir")
        self._claim(self.out)
        self._claim(self.work)
        os.chmod(self.work, 0o755)  # noqa: S103 - the oltp suite's postgres user must reach its data directories

    def subdir(self, name: str) -> Path:
        path = self.work / name
        path.mkdir()
        return path

    def remove_work(self) -> None:
        """Unmount, then remove the work directory (the report stays in --out)."""
        self._remove(self.work)

    def finish(self) -> None:
        """A complete run: the work directory goes, the report stays, and --out loses its
        marker so that a later run cannot mistake the report for debris of its own."""
        self.remove_work()
        (self.out / MARKER).unlink(missing_ok=True)

    def remove_all(self) -> None:
        """After an abort: nothing of this run is left, in the work or the output directory."""
        self._remove(self.work)
        self._remove(self.out)

    def _remove(self, path: Path) -> None:
        if not path.exists():
            return
        still = unmount_all(path)
        for _ in range(20):
            if not still:
                break
            time.sleep(0.5)
            still = unmount_all(path)
        if still:
            # Never remove through a live mount: that would delete what is behind it.
            raise BenchError(Exit.SUITE_FAILED, f"could not unmount {', '.join(still)}",
                             f"unmount it by hand (fusermount3 -u PATH), then remove {path}")
        if path in self._made:
            shutil.rmtree(path, ignore_errors=True)
            self._made.remove(path)
        elif path in self._emptied:
            for child in path.iterdir():
                with contextlib.suppress(OSError):
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
