"""`keyserver` command: init, serve, create-admin, rotate-kek, retire-kek, verify-audit, retire-version, …

Exit codes: 0 success, 1 the operation failed (message says why), 2 usage error (a bad STRONGROOM_* setting
too: one line per setting), 3 the audit chain is broken, 4 a dependency (HSM, database) is unavailable.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from keyserver.core.errors import CoreError, InvalidInput, NotFound, ServiceUnavailable
from keyserver.core.permissions import Role
from keyserver.core.principal import system_context
from keyserver.kmip.listener import KmipListener
from keyserver.services import Services, build_services
from keyserver.settings import SOFTHSM_MODULE, Settings, SettingsInvalid

app = typer.Typer(help="Strongroom key server", no_args_is_help=True, add_completion=False)
console = Console(stderr=True)
EXIT_FAILED, EXIT_USAGE, EXIT_BROKEN_CHAIN, EXIT_UNAVAILABLE = 1, 2, 3, 4


@app.callback()
def _owner_only() -> None:
    """Everything the key server writes — the SQLite database and its -wal/-shm, the
    HSM token, PIN files, backups — is for its own user only, whatever umask it was
    started with (a service manager's, a shell's 022)."""
    os.umask(0o077)


def _settings() -> Settings:
    """The settings, or one line per bad STRONGROOM_* value and exit 2."""
    try:
        return Settings()
    except SettingsInvalid as exc:
        for line in exc.problems:
            console.print(Text(line, style="red"), soft_wrap=True)
        raise typer.Exit(EXIT_USAGE) from None


def _services() -> Services:
    settings = _settings()
    try:
        return build_services(settings)
    except Exception as exc:
        console.print(f"[red]cannot start:[/red] {exc}")
        raise typer.Exit(EXIT_UNAVAILABLE) from None


def _missing_server(settings: Settings) -> str | None:
    """Why `settings` point at no existing key server (None when they do). Opening the
    services creates what is missing — a database, PINs, a token — so a command run in
    the wrong directory would verify, list or change a brand-new empty server and say
    all is well."""
    data = settings.data_dir.resolve()
    local_pins = settings.environment == "local" and (settings.hsm_user_pin is None or settings.hsm_so_pin is None)
    local_token = (settings.environment == "local" and settings.hsm_softhsm_token_dir is None
                   and settings.hsm_module == SOFTHSM_MODULE and "SOFTHSM2_CONF" not in os.environ)
    if (settings.database_url is None or local_pins or local_token) and not data.is_dir():
        return f"the data directory {data} does not exist"
    if settings.database_url is None and not (data / "strongroom.db").is_file():
        return f"the data directory {data} holds no key server database (strongroom.db)"
    if local_pins and not (data / "hsm-pins.json").is_file():
        return (f"the data directory {data} holds no HSM PINs (hsm-pins.json), and none are given "
                "(STRONGROOM_HSM_USER_PIN/_SO_PIN or a systemd credential)")
    if local_token and not (data / "tokens").is_dir():
        return f"the data directory {data} holds no HSM token (tokens/)"
    if settings.database_url is not None:
        from sqlalchemy import inspect

        from keyserver.store import db

        engine = db.make_engine(settings.database_url, pool_size=1)
        try:
            if not inspect(engine).has_table("audit_head"):
                return f"the database {engine.url.render_as_string()} holds no key server"
        except Exception as exc:
            return f"the database {engine.url.render_as_string()} cannot be read ({type(exc).__name__})"
        finally:
            engine.dispose()
    return None


def _existing_services() -> Services:
    """The services of the key server that already exists here — never a new one."""
    settings = _settings()
    problem = _missing_server(settings)
    if problem is not None:
        console.print(Text(f"no key server here: {problem}. Run the command where the server's data directory "
                           "is, or point STRONGROOM_DATA_DIR (and STRONGROOM_DATABASE_URL) at it; nothing was "
                           "created.", style="red"), soft_wrap=True)
        raise typer.Exit(EXIT_FAILED)
    try:
        return build_services(settings)
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
    # Text, not markup: a secret is printed exactly as it is.
    console.print(Panel.fit(
        Text.assemble("user:     ", (username, "bold"), "\npassword: ", (password, "bold"),
                      "\n\nShown once. You will be asked to choose a new password at first sign-in."),
        title="first-run administrator", border_style="yellow"))


FIRST_PASSWORD_FILE = "first-run-admin-password"  # noqa: S105 - a file name


def _hand_over_password(settings: Settings, username: str, password: str) -> None:
    """The one-time password goes to the terminal, never into the log stream: when
    stderr is not a terminal (a service manager, a container, a pipe) it is written to
    a file in the data directory that only the server's user can read."""
    if console.is_terminal:
        _print_password(username, password)
        return
    path = settings.data_dir / FIRST_PASSWORD_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{username}\n{password}\n")
    console.print(Text(f"first-run administrator '{username}': the one-time password is in {path.resolve()} "
                       "(mode 0600); delete the file once you have signed in and chosen your own"),
                  soft_wrap=True)


def _write_ca(settings: Settings, services: Services) -> Path:
    """The internal CA's certificate beside the data, for `curl --cacert` and browsers."""
    path = settings.data_dir / "ca.pem"
    pem = services.ca.certificate_pem()
    if not path.exists() or path.read_bytes() != pem:
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(pem)
        tmp.chmod(0o644)
        tmp.replace(path)
    return path


def _print_banner(settings: Settings, services: Services) -> None:
    from cryptography import x509

    from keyserver.core.ca import display_fingerprint

    url = settings.url
    console.print(Panel.fit(Text.assemble("Strongroom key server at ", (url, "bold"),
                                          f"\nAPI reference: {url}/api/docs"),
                            border_style="red" if settings.insecure_http else "green"))
    # Outside the panel and soft-wrapped: a path or fingerprint is never broken across
    # lines, so it can be copied and compared whole.
    if settings.insecure_http:
        console.print(Text("PLAIN HTTP (--insecure-http): passwords, session cookies and data keys travel in "
                           "clear; for local use only", style="bold red"), soft_wrap=True)
    elif settings.tls_cert_file is None:
        ca_path = _write_ca(settings, services).resolve()
        fp = display_fingerprint(x509.load_pem_x509_certificate(services.ca.certificate_pem()))
        console.print(Text(f"HTTPS with a certificate from Strongroom's own CA, {ca_path}\n"
                           f"  CA SHA-256 fingerprint {fp}\n"
                           f"  check it: openssl x509 -noout -fingerprint -sha256 -in {ca_path}\n"
                           f"  trust it: curl --cacert {ca_path} {url}/readyz; in a browser, import it as an "
                           "authority (or compare the fingerprint when the browser asks)"), soft_wrap=True)
    else:
        console.print(Text(f"HTTPS with {settings.tls_cert_file}"), soft_wrap=True)
    pins = settings.data_dir / "hsm-pins.json"
    if settings.environment == "local" and pins.exists():
        console.print(Text(f"HSM token {settings.data_dir.resolve() / 'tokens'}, its PINs in {pins.resolve()} (mode "
                           "0600): back them up together and protect the PIN file like the token itself"),
                      soft_wrap=True)


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
def serve(
    insecure_http: Annotated[bool, typer.Option(
        "--insecure-http", help="serve the REST API and console over plain HTTP (local only; never in "
                                "production): passwords, cookies and data keys then travel in clear")] = False,
) -> None:
    """Run the key server (initialises on first run and hands over the admin password)."""
    import uvicorn

    from keyserver.api.app import create_app
    from keyserver.logs import configure
    from keyserver.runtime.tls import rest_tls_context, uvicorn_tls

    if insecure_http:
        os.environ["STRONGROOM_INSECURE_HTTP"] = "true"  # the workers read their settings too
    settings = _settings()
    configure(settings.log_level)
    services = _services()
    password = _initialize(services)
    _print_banner(settings, services)
    if password:
        _hand_over_password(settings, "admin", password)
    common = {"log_config": None, "access_log": False, "proxy_headers": False, "server_header": False,
              "timeout_keep_alive": 30}
    if settings.workers > 1:
        if settings.effective_database_url.startswith("sqlite"):
            console.print("[red]several workers need PostgreSQL[/red]: set STRONGROOM_DATABASE_URL, "
                          "or STRONGROOM_WORKERS=1 for the embedded SQLite database")
            raise typer.Exit(EXIT_FAILED)
        # Every worker serves the agent and KMIP ports too (SO_REUSEPORT): check here
        # that they can be bound, and say so once.
        from keyserver.runtime.sockets import bind_socket

        if settings.agent_enabled:
            try:
                bind_socket(settings.agent_host, settings.agent_port).close()
                _print_agent_port(services, settings.agent_public_url
                                  or f"https://{settings.agent_host}:{settings.agent_port}")
            except OSError as exc:
                _agent_port_failed(settings, exc)
                os.environ["STRONGROOM_AGENT_ENABLED"] = "false"
        kmip = _probe_kmip(services)
        os.environ.setdefault("STRONGROOM_DATA_DIR", str(settings.data_dir))
        from keyserver.runtime.workers import serve_workers

        serve_workers(host=settings.host, port=settings.port, workers=settings.workers, uvicorn_kwargs=common,
                      kmip=kmip, housekeeping=services)
    else:
        from keyserver.runtime.agentport import agent_sidecar, run_servers
        from keyserver.runtime.xksport import start_xks_sidecar

        app = create_app(services)
        common.update(uvicorn_tls(rest_tls_context(settings, services.ca)))
        try:
            sidecar = agent_sidecar(services, app, common)
            if sidecar is not None and services.agent_url:
                _print_agent_port(services, services.agent_url)
        except OSError as exc:
            _agent_port_failed(settings, exc)
            sidecar = None
        _start_kmip(services)  # stopped by services.close() in the app's shutdown
        main = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.port, **common))  # type: ignore[arg-type]
        run_servers(main, ([sidecar] if sidecar else []) + start_xks_sidecar(services, app, common))


def _print_agent_port(services: Services, url: str) -> None:
    from cryptography import x509

    from keyserver.core.ca import display_fingerprint
    from keyserver.runtime.agentport import install_command, loopback_warning

    fp = display_fingerprint(x509.load_pem_x509_certificate(services.ca.certificate_pem()))
    # soft_wrap: the one-liner must stay copyable whatever the terminal's width; Text, not
    # markup: a fingerprint is printed exactly (":cd:" in it once became an emoji).
    console.print(Text.assemble("Agent port (hosts, mutual TLS) at ", (url, "bold"),
                                f"\n  CA SHA-256 fingerprint {fp}\n"
                                f"  enroll a host: {install_command(url)}\n  (ca.pem from /ca.pem, a token from "
                                "the console: Hosts > Enroll a host)"), soft_wrap=True)
    if (warning := loopback_warning(url)) is not None:
        console.print(Text(f"  note: {warning}", style="yellow"), soft_wrap=True)


def _agent_port_failed(settings: Settings, exc: OSError) -> None:
    # Like KMIP, an extra door: a busy port must not take the console and REST down.
    console.print(f"[red]agent port disabled[/red]: cannot listen on {settings.agent_host}:{settings.agent_port} "
                  f"({exc}); set STRONGROOM_AGENT_PORT, or STRONGROOM_AGENT_ENABLED=false to silence this")
    logging.getLogger("keyserver").error("agent port not started: %s", exc)


def _kmip_disabled(services: Services, exc: OSError) -> None:
    # KMIP is an extra door, on by default: a busy port must not take REST down with it.
    console.print(f"[red]KMIP disabled[/red]: cannot listen on {services.settings.kmip_host}:"
                  f"{services.settings.kmip_port} ({exc}); set STRONGROOM_KMIP_PORT, or "
                  "STRONGROOM_KMIP_ENABLED=false to silence this")
    logging.getLogger("keyserver.kmip").error("KMIP listener not started: %s", exc)


def _kmip_listening(services: Services, port: int) -> None:
    console.print(f"KMIP (mutual TLS) on [bold]{services.settings.kmip_host}:{port}[/bold]; "
                  "issue client certificates with `keyserver kmip-client create`")


def _start_kmip(services: Services) -> KmipListener | None:
    if not services.settings.kmip_enabled:
        return None
    from keyserver.kmip.server import build_listener

    listener = build_listener(services)
    try:
        port = listener.start()
    except OSError as exc:
        _kmip_disabled(services, exc)
        return None
    _kmip_listening(services, port)
    # Stopped before the services close (the HTTP lifespan's shutdown closes them).
    services.on_close.append(listener.stop)
    return listener


def _probe_kmip(services: Services) -> bool:
    """Whether the workers should serve KMIP: enabled, and its port can be bound."""
    if not services.settings.kmip_enabled:
        return False
    from keyserver.runtime.sockets import bind_socket

    try:
        bind_socket(services.settings.kmip_host, services.settings.kmip_port).close()
    except OSError as exc:
        _kmip_disabled(services, exc)
        return False
    services.ca.ensure()  # once here, not raced by the workers
    _kmip_listening(services, services.settings.kmip_port)
    return True


kmip_app = typer.Typer(help="KMIP client identities (certificates from the internal CA)", no_args_is_help=True)
app.add_typer(kmip_app, name="kmip-client")


@kmip_app.command("create")
def kmip_client_create(
    name: Annotated[str, typer.Argument(help="client name (a DNS name; also the certificate's SAN)")],
    role: Annotated[str, typer.Option(help="kmip-client (a program's identity: uses and exports keys), "
                                           "admin, key-officer, operator, auditor or storage-admin")
                    ] = Role.KMIP_CLIENT.value,
    csr: Annotated[Path | None, typer.Option(help="PEM CSR; without it a key pair is generated here")] = None,
    out: Annotated[Path, typer.Option(help="directory for cert.pem, key.pem and ca.pem")] = Path("."),
    key_export: Annotated[str, typer.Option(help="key material Get may deliver: plaintext (KMIP's default), "
                                            "wrapped (only under another key) or none")] = "plaintext",
    group: Annotated[str | None, typer.Option(help="KMIP tenancy group: it sees this group's objects "
                                                   "(docs/kmip.md \"Tenancy\"); default: its name")] = None,
) -> None:
    """Issue a KMIP client certificate mapped to a role."""
    services = _existing_services()
    try:
        _initialize(services)
        issued = services.kmip_clients.create(system_context("cli"), name=name, role=role,
                                              csr_pem=csr.read_text() if csr else None, key_export=key_export,
                                              group=group)
        services.audit.flush()
        out.mkdir(parents=True, exist_ok=True)
        (out / "cert.pem").write_text(issued.certificate_pem)
        (out / "ca.pem").write_text(issued.ca_certificate_pem)
        if issued.private_key_pem is not None:
            fd = os.open(out / "key.pem", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(issued.private_key_pem)
        console.print(f"[green]issued[/green] KMIP client '{name}' ({role}, key export: {key_export}, "
                      f"group: {issued.client.group}), "
                      f"serial {issued.client.serial}, files in {out.resolve()}")
    except CoreError as exc:
        console.print(f"[red]{exc.message}[/red]")
        raise typer.Exit(EXIT_FAILED) from None
    finally:
        services.close()


@kmip_app.command("list")
def kmip_client_list() -> None:
    """List KMIP clients."""
    services = _existing_services()
    try:
        for c in services.kmip_clients.list(system_context("cli")):
            state = f"revoked {c.revoked_at:%Y-%m-%d}" if c.revoked_at else "active"
            typer.echo(f"{c.id}  {c.name:<32} {c.role:<12} {c.serial}  {state}")
    finally:
        services.close()


@kmip_app.command("revoke")
def kmip_client_revoke(client: Annotated[str, typer.Argument(help="the client's name or id (see `list`)")]) -> None:
    """Revoke a KMIP client: refused from its next request on."""
    services = _existing_services()
    try:
        client_id = _kmip_client_id(services, client)
        c = services.kmip_clients.revoke(system_context("cli"), client_id)
        services.audit.flush()
        console.print(f"[green]revoked[/green] KMIP client '{c.name}' ({c.id})")
    except CoreError as exc:
        console.print(Text(exc.message, style="red"), soft_wrap=True)
        raise typer.Exit(EXIT_FAILED) from None
    finally:
        services.close()


def _kmip_client_id(services: Services, ref: str) -> uuid.UUID:
    """The client `ref` names: its id, or its name (the active one when an earlier
    client of that name was revoked)."""
    clients = services.kmip_clients.list(system_context("cli"))
    by_id = [c for c in clients if str(c.id) == ref.strip().lower()]
    if by_id:
        return by_id[0].id
    named = [c for c in clients if c.name == ref]
    active = [c for c in named if c.revoked_at is None]
    chosen = active or named
    if len(chosen) == 1:
        return chosen[0].id
    if not chosen:
        raise NotFound(f"no KMIP client named or with id '{ref}': `keyserver kmip-client list` shows each "
                       "client's id and name", code="kmip_client_not_found")
    raise InvalidInput(f"{len(chosen)} KMIP clients are named '{ref}': give the id of the one to revoke "
                       f"({', '.join(str(c.id) for c in chosen)})", code="kmip_client_ambiguous")


@app.command("create-admin")
def create_admin(
    username: Annotated[str, typer.Argument(help="user name of the new administrator")],
    role: Annotated[str, typer.Option(help="admin, key-officer, operator, auditor, storage-admin or "
                                           "kmip-client")] = Role.ADMIN.value,
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
    """Create a new key-encryption key and re-wrap everything stored under the others (key
    versions, KMIP sealed objects, the internal CA's key, TOTP secrets); resumes a
    rotation that is already running."""
    from keyserver.core.kek import KINDS

    services = _existing_services()
    try:
        _initialize(services)
        ctx = system_context("cli")
        try:
            rot = services.keks.start_rotation(ctx)
        except CoreError as exc:
            if exc.code != "rotation_running":
                raise
            console.print("[yellow]resuming the rotation that is already running[/yellow]")
            rot = services.keks.status(ctx)["last_rotation"]  # type: ignore[assignment]
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console) as progress:
            tasks = {kind.name: progress.add_task(f"re-wrapping {kind.title}") for kind in KINDS}
            while True:
                for name, p in rot.progress.items():
                    progress.update(tasks[name], total=p["total"], completed=p["done"])
                if rot.state != "running":
                    break
                # A batch at a time, so the bars move; another replica may be doing the work.
                if not services.keks.resume_rotations(max_batches=1):
                    time.sleep(0.5)
                rot = services.keks.get_rotation(ctx, rot.id)
        services.audit.flush()
        console.print(f"[green]KEK rotated[/green]: now {services.keks.current()}. The previous one stays in the "
                      f"token, unused, until `keyserver retire-kek {rot.from_kek_id}` removes it")
    except CoreError as exc:
        console.print(f"[red]{exc.message}[/red]")
        raise typer.Exit(EXIT_FAILED) from None
    finally:
        services.close()


@app.command("retire-kek")
def retire_kek(
    kek_id: Annotated[str, typer.Argument(help="the KEK to remove (GET /api/v1/system/kek lists them)")],
) -> None:
    """Remove a superseded key-encryption key from the HSM token for good, once nothing
    stored is wrapped under it any more (refused otherwise, with what still is)."""
    services = _existing_services()
    try:
        _initialize(services)
        kek = services.keks.retire(system_context("cli"), kek_id)
        services.audit.flush()
        console.print(f"[green]KEK {kek.kek_id} retired[/green]: removed from the token")
    except CoreError as exc:
        console.print(Text(exc.message, style="red"), soft_wrap=True)
        raise typer.Exit(EXIT_FAILED) from None
    finally:
        services.close()


@app.command("verify-audit")
def verify_audit(
    full: Annotated[bool, typer.Option(help="walk every record, not only those after the last verified "
                                            "checkpoint")] = False,
    checkpoints: Annotated[Path | None, typer.Option(
        "--checkpoints", "--outside",
        help="a copy of the chain kept off the server: a file sink's JSON lines (rotated files concatenated "
             "oldest first) or a syslog receiver's copy; its every record and checkpoint must match, which "
             "detects a cut or rewritten tail, a wipe and a re-MACed chain")] = None,
) -> None:
    """Check the audit chain from its last verified checkpoint and name the first broken
    record, if any."""
    from keyserver.core.audit_sinks import CopyUnreadable, SinkCopy

    if checkpoints is not None and not checkpoints.is_file():
        console.print(f"[red]cannot read the outside copy[/red]: {checkpoints} is not a file")
        raise typer.Exit(EXIT_FAILED)
    services = _existing_services()
    try:
        started = time.perf_counter()
        try:
            result = services.audit.verify(full=full, outside=SinkCopy(checkpoints) if checkpoints else None)
        except CopyUnreadable as exc:
            console.print(Text(f"cannot read the outside copy: {exc}", style="red"), soft_wrap=True)
            raise typer.Exit(EXIT_FAILED) from None
        took = time.perf_counter() - started
        if result.note:
            console.print(Text(result.note, style="yellow"), soft_wrap=True)
        if not result.ok:  # a broken chain, or a chain that holds and zero-use statements that do not
            for label, what in [("zero-use statement BROKEN", f": {what}") for _, what in result.problems] or [(
                    "audit chain BROKEN", f" at record {result.first_broken_seq}: {result.reason} "
                                          f"({result.checked} records verified before it)")]:
                console.print(Text.assemble((label, "bold red"), what), soft_wrap=True)
            raise typer.Exit(EXIT_BROKEN_CHAIN)
        where = f"after record {result.from_seq} (the last verified checkpoint)" if result.from_seq else "all"
        console.print(Text.assemble(("audit chain intact", "green"),
                                    f": {result.checked} records verified ({where}) in {took:.1f}s; head at "
                                    f"record {result.head_seq}"
                                    + (f", last checkpoint {result.checkpoint}" if result.checkpoint else "")
                                    + (f"; zero-use statements: {result.statements} signed by the checkpoint key, "
                                       "no later use of their versions" if result.statements else "")),
                      soft_wrap=True)
        if checkpoints is not None:
            console.print(Text(f"outside copy: {result.outside_records} records (up to record "
                               f"{result.outside_seq}) and {result.outside_checked} checkpoints match the "
                               "database"), soft_wrap=True)
            if result.outside_seq < result.head_seq:
                # The residual window: what never reached this copy is protected by the chain
                # and the checkpoints only (zero with a fail-closed sink and a fresh copy).
                console.print(Text(f"records {result.outside_seq + 1}-{result.head_seq} are not in the copy "
                                   "(not delivered yet, or the copy is older): they are protected only by the "
                                   "chain's MACs and checkpoints", style="yellow"), soft_wrap=True)
    except ServiceUnavailable as exc:
        console.print(f"[red]{exc.message}[/red]")
        raise typer.Exit(EXIT_UNAVAILABLE) from None
    finally:
        services.close()


# The benchmarks live in the kmsbench package (measurement code stays out of the server):
# the old command names only say where they went.
_MOVED = {"bench": "kms-bench keyserver", "bench-kmip": "kms-bench kmip"}


def _moved(name: str) -> None:
    console.print(f"`keyserver {name}` is now `{_MOVED[name]}` (same options; see docs/benchmarks.md)",
                  soft_wrap=True)
    raise typer.Exit(2)


@app.command("bench", hidden=True, context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                                     "help_option_names": []})
def bench() -> None:
    _moved("bench")


@app.command("bench-kmip", hidden=True, context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                                          "help_option_names": []})
def bench_kmip() -> None:
    _moved("bench-kmip")


from keyserver.cli_retirement import register as _register_retirement  # noqa: E402 - retiring key versions
from keyserver.ops.commands import register as _register_ops  # noqa: E402 - backup and restore, after the rest

_register_ops(app)
_register_retirement(app, _existing_services, _initialize)
