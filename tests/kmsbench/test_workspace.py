"""kms-bench removes what it made and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from kmsbench.errors import BenchError, Exit
from kmsbench.workspace import MARKER, Workspace


def test_a_directory_with_foreign_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "data").write_text("x")
    with pytest.raises(BenchError) as caught:
        Workspace.check(tmp_path / "theirs", what="--workdir")
    assert caught.value.code == Exit.PATHS and "never deletes" in caught.value.remedy
    Workspace.check(tmp_path / "absent", what="--workdir")
    (tmp_path / "empty").mkdir()
    Workspace.check(tmp_path / "empty", what="--workdir")


def test_an_adopted_empty_directory_is_emptied_not_removed(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    ws = Workspace(tmp_path / "out", tmp_path / "work", run_id="t")
    ws.create()
    (ws.subdir("copy") / "bench.dat").write_bytes(b"x" * 10)
    ws.remove_all()
    assert not (tmp_path / "out").exists()  # made by the run
    assert (tmp_path / "work").is_dir() and list((tmp_path / "work").iterdir()) == []  # given to it


def test_debris_of_an_interrupted_run_is_cleaned_and_a_finished_report_is_kept(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / MARKER).write_text("created by kms-bench run earlier\n")
    (work / "copy-256").mkdir()
    ws = Workspace(tmp_path / "out", work, run_id="t")
    ws.create()
    assert [p.name for p in work.iterdir()] == [MARKER]
    (tmp_path / "out" / "report.md").write_text("# report")
    ws.finish()
    assert (tmp_path / "out" / "report.md").exists() and not (tmp_path / "out" / MARKER).exists()
    with pytest.raises(BenchError):  # a finished report is not overwritten by the next run
        Workspace.check(tmp_path / "out", what="--out")
