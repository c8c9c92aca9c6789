"""`keyserver` command: init, serve, create-admin, rotate-kek, verify-audit.

Exit codes: 0 success, 1 the operation failed (message says why), 2 usage error,
3 the audit chain is broken, 4 a dependency (HSM, database) is unavailable.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from keyserver.core.errors import CoreError, ServiceUnavailable
from keyserver.core.policy import Role
from keyserver.core.principal import system_context
from keyserver.services import Services, build_services
from keyserver.settings import Settings

app = typer.Typer(help="Strongroom key server", no_args_is_help=True, add_completion=False)
console = Console(stderr=True)
EXIT_FAILED, EXIT_BROKEN_CHAIN, EXIT_UNAVAILABLE = 1, 3, 4


def _services() -> Services:
    try:
        return build_services(Settings())
    except Exception as exc:
        console.print(f"[red]cannot start:[/red] {exc}")
        raise typer.Exit(EXIT_UNAVAILABLE) from None


def _initialize(services: Services) -> str | None:
    try:
        return services.initialize()
    except ServiceUnavailable as exc:
        console.print(f"[red]{exc.message}[/red]")
        raise typer.Exit(EXIT_UNAVAILABLE) from None
    except Exception as exc:
        from hsm import HsmError

        if isinstance(exc, HsmError):
            console.print(f"[red]HSM:[/red] {exc}")
            raise typer.Exit(EXIT_UNAVAILABLE) from None
        raise


def _print_password(username: str, password: str) -> None:
    console.print(Panel.fit(
        f"user:     [bold]{username}[/bold]\npassword: [bold]{password}[/bold]\n\n"
        "Shown once. You will be asked to choose a new password at first sign-in.",
        title="first-run administrator", border_style="yellow"))


@app.command()
def init() -> None:
    """Create the database schema, the HSM token and keys, and the first administrator."""
    services = _services()
    try:
        password = _initialize(services)
        console.print(f"[green]initialized[/green]: database {services.engine.url.render_as_string()}, "
                      f"KEK {services.keks.current()}")
        if password:
            _print_password("admin", password)
    finally:
        services.close()


@app.command()
def serve() -> None:
    """Run the key server (initialises on first run and prints the admin password)."""
    import uvicorn

    from keyserver.api.app import create_app
    from keyserver.logs import configure

    settings = Settings()
    configure(settings.log_level)
    services = _services()
    password = _initialize(services)
    scheme = "https" if settings.tls_cert_file else "http"
    url = settings.public_url or f"{scheme}://{settings.host}:{settings.port}"
    console.print(Panel.fit(f"Strongroom key server at [bold]{url}[/bold]\nAPI reference: {url}/api/docs",
                            border_style="green"))
    if password:
        _print_password("admin", password)
    ssl = {"ssl_certfile": str(settings.tls_cert_file), "ssl_keyfile": str(settings.tls_key_file)} \
        if settings.tls_cert_file else {}
    common = {"log_config": None, "access_log": False, "proxy_headers": False, "server_header": False,
              "timeout_keep_alive": 30, **ssl}
    if settings.workers > 1:
        if settings.effective_database_url.startswith("sqlite"):
            console.print("[red]several workers need PostgreSQL[/red]: set STRONGROOM_DATABASE_URL, "
                          "or STRONGROOM_WORKERS=1 for the embedded SQLite database")
            raise typer.Exit(EXIT_FAILED)
        services.close()
        os.environ.setdefault("STRONGROOM_DATA_DIR", str(settings.data_dir))
        from keyserver.server import serve_workers

        serve_workers(host=settings.host, port=settings.port, workers=settings.workers, uvicorn_kwargs=common)
    else:
        uvicorn.run(create_app(services), host=settings.host, port=settings.port, **common)  # type: ignore[arg-type]


@app.command("create-admin")
def create_admin(
    username: Annotated[str, typer.Argument(help="user name of the new administrator")],
    role: Annotated[str, typer.Option(help="admin, key-officer, operator or auditor")] = Role.ADMIN.value,
) -> None:
    """Create a user (an administrator by default) with a one-time password."""
    services = _services()
    try:
        _initialize(services)
        user, password = services.identity.create_user(system_context("cli"), username=username, role=role)
        services.audit.flush()
        assert password is not None
        _print_password(user.username, password)
    except CoreError as exc:
        console.print(f"[red]{exc.message}[/red]")
        raise typer.Exit(EXIT_FAILED) from None
    finally:
        services.close()


@app.command("rotate-kek")
def rotate_kek() -> None:
    """Create a new key-encryption key and re-wrap every stored key version under it."""
    services = _services()
    try:
        _initialize(services)
        ctx = system_context("cli")
        try:
            rot = services.keks.start_rotation(ctx)
        except CoreError as exc:
            if exc.code != "rotation_running":
                raise
            console.print("[yellow]resuming the rotation that is already running[/yellow]")
            rot = None
        with Progress(TextColumn("re-wrapping key versions"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console) as progress:
            task = progress.add_task("rewrap", total=rot.total if rot else None)
            services.keks.resume_rotations()
            status = services.keks.status(ctx)
            last = status["last_rotation"]
            progress.update(task, total=last.total, completed=last.done)  # type: ignore[attr-defined]
        services.audit.flush()
        console.print(f"[green]KEK rotated[/green]: now {services.keks.current()}")
    except CoreError as exc:
        console.print(f"[red]{exc.message}[/red]")
        raise typer.Exit(EXIT_FAILED) from None
    finally:
        services.close()


@app.command("verify-audit")
def verify_audit() -> None:
    """Walk the audit chain and name the first broken record, if any."""
    services = _services()
    try:
        started = time.perf_counter()
        result = services.audit.verify()
        took = time.perf_counter() - started
        if result.ok:
            console.print(f"[green]audit chain intact[/green]: {result.checked} records verified in {took:.1f}s")
            return
        console.print(f"[red]audit chain BROKEN[/red] at record {result.first_broken_seq}: {result.reason} "
                      f"({result.checked} records verified before it)")
        raise typer.Exit(EXIT_BROKEN_CHAIN)
    except ServiceUnavailable as exc:
        console.print(f"[red]{exc.message}[/red]")
        raise typer.Exit(EXIT_UNAVAILABLE) from None
    finally:
        services.close()


@app.command()
def bench(
    postgres: Annotated[str, typer.Option(help="PostgreSQL server URL (a scratch database is created)")] =
        "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    clients: Annotated[str, typer.Option(help="comma-separated concurrent client counts")] = "1,50,200",
    virtual_users: Annotated[int, typer.Option(help="virtual users with think time (0 to skip)")] = 200,
    duration: Annotated[int, typer.Option(min=1, help="seconds per measurement")] = 10,
    repeats: Annotated[int, typer.Option(min=1, help="runs per figure (median and spread are reported)")] = 3,
    workers: Annotated[int, typer.Option(min=1, help="server worker processes")] = 2,
    output: Annotated[Path | None, typer.Option(help="Markdown file whose key-server section is rewritten")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="raw results as JSON")] = None,
) -> None:
    """Measure data keys/s and latency over HTTP, and the HSM's own ceiling, in one run."""
    from keyserver.bench import run

    run(postgres=postgres, clients=[int(c) for c in clients.split(",")], virtual_users=virtual_users,
        duration=duration, repeats=repeats,
        workers=workers, output=output, json_out=json_out)
