"""The `keyserver backup` and `keyserver restore` commands: arguments, progress, exit
codes. The work is in keyserver.ops.backup and keyserver.ops.restore (the archive both
share: keyserver.ops.archive)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

from keyserver.ops import OpsError

console = Console(stderr=True)


class RichReporter:
    """One line per step with a spinner and its time; notes printed after the progress."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._task: TaskID | None = None
        self.notes: list[str] = []

    def step(self, text: str) -> None:
        self._finish()
        self._task = self._progress.add_task(text, total=1)

    def _finish(self) -> None:
        if self._task is not None:
            self._progress.update(self._task, completed=1)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def __enter__(self) -> RichReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self._finish()


def _progress() -> Progress:
    return Progress(SpinnerColumn(finished_text="[green]✓[/green]"), TextColumn("{task.description}"),
                    TimeElapsedColumn(), console=console)


def _fail(exc: OpsError) -> typer.Exit:
    console.print(Text("failed: ", style="red") + Text(exc.message), soft_wrap=True)
    return typer.Exit(exc.exit_code)


def _print_notes(reporter: RichReporter) -> None:
    for note in reporter.notes:
        console.print(Text(note), soft_wrap=True)


def backup(
    out: Annotated[Path, typer.Option(
        "--out", "-o", help="archive file to write, or a directory for strongroom-backup-<UTC time>.tar")] = Path("."),
    include_pins: Annotated[bool, typer.Option(
        "--include-pins", help="also put the data directory's hsm-pins.json in the archive. Off by default: the "
                               "token and its PINs together are every key; keep the PINs apart")] = False,
) -> None:
    """Write one archive with a consistent copy of the database and the HSM token, while
    the server runs.

    The archive (a tar file, mode 0600) holds a manifest (format, versions, schema
    revision, store, KEKs, the audit head and last signed checkpoint, the SHA-256 of every
    member), the database (SQLite's online backup, or pg_dump of the database in
    STRONGROOM_DATABASE_URL with the pg_dump matching the server's version) and the
    SoftHSM2 token directory. With another PKCS#11 module the token's keys are not in the
    archive: the manifest and the output name the keys to back up with the vendor's tools.
    The HSM PINs are never included unless --include-pins. The backup is recorded in the
    audit chain (system.backup) before the copy is taken. Refused while a KEK rotation
    runs. Exit codes: 0 written, 1 refused or failed, 4 database or HSM unavailable.
    """
    from keyserver.ops import backup as ops
    from keyserver.ops.archive import describe
    from keyserver.settings import Settings

    try:
        with _progress() as progress, RichReporter(progress) as reporter:
            result = ops.backup(Settings(), out, include_pins=include_pins, reporter=reporter)
    except OpsError as exc:
        raise _fail(exc) from None
    _print_notes(reporter)
    m = result.manifest
    size = result.path.stat().st_size
    console.print(Text.assemble(("backup written", "green"), f": {result.path.resolve()} ({size:,} bytes)\n  ",
                                describe(m)), soft_wrap=True)


def restore(
    archive: Annotated[Path, typer.Argument(help="the archive `keyserver backup` wrote")],
    pins: Annotated[Path | None, typer.Option(
        "--pins", help="the HSM PIN file (hsm-pins.json) kept apart from the archive; not needed when the archive "
                       "holds the PINs or STRONGROOM_HSM_USER_PIN/SO_PIN are set")] = None,
    check_only: Annotated[bool, typer.Option(
        "--check", help="only check the archive against its manifest (checksums, format) and describe it; write "
                        "nothing")] = False,
) -> None:
    """Restore a backup into an empty data directory (STRONGROOM_DATA_DIR) and, for
    PostgreSQL, an empty database (STRONGROOM_DATABASE_URL).

    Checks every member's SHA-256 against the manifest before writing anything, refuses a
    non-empty target, restores the database and the token, runs the migrations when the
    backup is from an older release, then checks that the HSM holds the KEKs and verifies
    the whole audit chain (including the manifest's signed checkpoint) and records
    system.restore. Exit codes: 0 restored, 1 refused or failed (damaged archive,
    non-empty target, missing PINs), 3 the restored audit chain does not verify, 4
    database or HSM unavailable.
    """
    from keyserver.ops import restore as ops
    from keyserver.ops.archive import describe
    from keyserver.settings import Settings

    try:
        with _progress() as progress, RichReporter(progress) as reporter:
            if check_only:
                manifest = ops.check(archive, reporter)
            else:
                result = ops.restore(Settings(), archive, pins=pins, reporter=reporter)
    except OpsError as exc:
        raise _fail(exc) from None
    _print_notes(reporter)
    if check_only:
        console.print(Text.assemble(("archive intact", "green"), ": every member matches the manifest; ",
                                    describe(manifest)), soft_wrap=True)
        return
    console.print(Text.assemble(
        ("restored", "green"), f": {result.records_verified} audit records verified (full), head now at record "
        f"{result.head_seq}" + (f"; schema migrated from {result.migrated_from}" if result.migrated_from else "")
        + ". Start the server on it (`keyserver serve`). Audit sinks: the chain continues from the backup's head, "
          "so records the old server shipped after the backup share sequence numbers with new ones (see "
          "docs/operations.md, Backup and restore)."), soft_wrap=True)


def _help(doc: str | None) -> str:
    """A docstring as --help shows it: paragraphs reflowed to the terminal's width (rich
    would keep the source's line breaks)."""
    import inspect

    paragraphs = inspect.cleandoc(doc or "").split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def register(app: typer.Typer) -> None:
    app.command("backup", help=_help(backup.__doc__))(backup)
    app.command("restore", help=_help(restore.__doc__))(restore)
