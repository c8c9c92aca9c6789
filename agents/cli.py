"""`kms-agent`: enroll this host, encrypt and decrypt files and directories, rotate them
to a key's newest version, and run the daemon.

Exit status (also in `kms-agent --help`):
  0 done · 1 unexpected failure · 2 usage · 3 integrity failure (tampered or damaged file)
  4 key unavailable or refused · 5 key server unreachable · 6 host not enrolled or revoked
  7 file error (missing, not readable, not an encrypted file)
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from agents import __version__
from agents.config import AgentConfig
from agents.cryptfile import native, read_header
from agents.cryptfile.transform import TMP_PREFIX, decrypt_file, encrypt_file, is_encrypted, rekey_file, rewrap_file
from agents.daemon import STATUS_FILE, AgentDaemon, clock_skew, os_description
from agents.errors import AgentError, Exit
from agents.guardpoint.manager import GuardPointManager, local_reports
from agents.guardpoint.records import read_json
from agents.keyclient.cache import ServerUnreachable
from agents.keyclient.client import ServerClient, ServerKeyring, ServerRefused
from agents.keyclient.identity import HostIdentity
from agents.keyclient.revocation import RevocationLedger, host_refusal_message, host_revocation
from agents.keyclient.spool import EventSpool
from agents.volume.manager import VolumeManager, parse_tab

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False, rich_markup_mode=None)
# Not a terminal (a service manager's journal, a pipe, a script): one line a message, never
# folded at 80 columns, so a path in an error stays whole for grep and for the reader.
err = Console(stderr=True)
err.soft_wrap = not err.is_terminal
out = Console()
out.soft_wrap = not out.is_terminal
_state: dict[str, Any] = {}


class Fail(AgentError):
    """A refusal of the command line itself, with the exit status it takes."""

    def __init__(self, code: Exit, message: str) -> None:
        super().__init__(message)
        self.code = code

    @property
    def exit_code(self) -> Exit:
        return self.code


@app.callback()
def _main(config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="agent.toml (default: $STRONGROOM_AGENT_CONFIG or /etc/strongroom-agent/agent.toml)")]
        = None) -> None:
    _state["config_path"] = config


def _config() -> AgentConfig:
    return AgentConfig.load(_state.get("config_path"))  # a ConfigError exits 2 (agents/errors.py)


def _identity(config: AgentConfig, *, enrolled: bool = True) -> HostIdentity:
    try:
        identity = HostIdentity.load_or_create(config.state_dir)  # an IdentityError exits 6
    except PermissionError:
        raise Fail(Exit.NOT_ENROLLED, f"cannot read {config.state_dir}: run as root (sudo)") from None
    if enrolled and not identity.enrolled:
        raise Fail(Exit.NOT_ENROLLED, "this host is not enrolled: run `kms-agent enroll --token TOKEN` "
                                      "with a token from the console (Hosts > Enroll a host)")
    return identity


def _client(config: AgentConfig) -> ServerClient:
    return ServerClient.for_host(config.server_url, _identity(config), timeout=config.request_timeout_seconds)


def _spool(config: AgentConfig) -> EventSpool:
    return EventSpool(config.spool_dir)


@contextmanager
def _bytes_progress(total: int, label: str) -> Iterator[tuple[Progress, Any]]:
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=err, transient=False, disable=not err.is_terminal) as p:
        yield p, p.add_task(label, total=total)


def _files(paths: list[Path]) -> list[Path]:
    """Regular files named or under named directories (symlinks and our temporaries skipped)."""
    found: list[Path] = []
    for p in paths:
        if p.is_dir():
            for dirpath, dirnames, names in os.walk(p):
                dirnames.sort()
                found += [Path(dirpath) / n for n in sorted(names)
                          if not n.startswith(TMP_PREFIX) and (Path(dirpath) / n).is_file()
                          and not (Path(dirpath) / n).is_symlink()]
        elif p.is_file():
            found.append(p)
        elif not p.exists():
            raise Fail(Exit.FILE, f"{p}: no such file or directory")
        else:
            raise Fail(Exit.FILE, f"{p}: not a regular file or directory")
    return found


def _record(spool: EventSpool, event: str, path: Path, **fields: Any) -> None:
    spool.append({"event": event, "path": str(path.resolve()), **fields})


def _flush(client: ServerClient, spool: EventSpool) -> None:
    """Ship what this command recorded; if the server is away the daemon ships it later."""
    with suppress(ServerUnreachable, ServerRefused):
        spool.send(client.send_events, rejected=(ServerRefused,))


def _run_files(paths: list[Path], verb: str, work: Callable[[Path, Callable[[int], None]], str | None],
               spool: EventSpool, client: ServerClient) -> None:
    files = _files(paths)
    total = sum(f.stat().st_size for f in files)
    done = skipped = 0
    try:
        with _bytes_progress(total, verb) as (progress, task):
            for f in files:
                progress.update(task, description=f"{verb} {f.name}")
                event = work(f, lambda n: progress.advance(task, n))
                if event is None:
                    skipped += 1
                    progress.advance(task, f.stat().st_size)
                    continue
                done += 1
                _record(spool, event, f)
    finally:
        _flush(client, spool)
    out.print(f"{verb}: {done} file(s) done" + (f", {skipped} already in the wanted state" if skipped else ""))


@app.command()
def enroll(token: Annotated[str | None, typer.Option(envvar="STRONGROOM_ENROLL_TOKEN",
                                                     help="enrollment token (or $STRONGROOM_ENROLL_TOKEN)")] = None,
           hostname: Annotated[str | None, typer.Option(help="name to enroll under (default: FQDN)")] = None) -> None:
    """Make this host's key pair (kept here, 0600) and enroll it with a one-time token."""
    config = _config()
    if not token:
        raise Fail(Exit.USAGE, "an enrollment token is required: --token or $STRONGROOM_ENROLL_TOKEN")
    identity = _identity(config, enrolled=False)
    with ServerClient(config.server_url, config.ca_file, identity, timeout=config.request_timeout_seconds) as c:
        result = c.enroll(token, hostname=hostname, os_name=os_description())
    out.print(f"[green]enrolled[/green] as host {result['host_id']} in group [bold]{result['host_group']}[/bold]; "
              f"certificate and CA in {config.state_dir}")


@app.command()
def status(as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False) -> None:
    """This host's enrollment, the key server's view of it, and the keys it may use."""
    config = _config()
    identity = _identity(config)
    refused = host_revocation(config.state_dir)
    if refused is not None:  # what the server said is remembered: no need to reach it to say so
        raise Fail(Exit.NOT_ENROLLED, refused)
    spool = _spool(config)
    with _client(config) as c:
        beat = c.heartbeat(os_name=os_description())
        keys = c.list_keys()
    skew = clock_skew(beat["server_time"])
    report = {"server_url": config.server_url, "host_id": beat["host_id"], "hostname": beat["hostname"],
              "host_group": beat["host_group"], "state": beat["state"], "clock_skew_seconds": round(skew, 1),
              "pending_events": spool.pending(), "state_dir": str(identity.state_dir), "keys": keys,
              "guard_points": local_reports(config.state_dir), "daemon": _daemon_state(config),
              "agent_version": __version__, "format_engine": native.describe()}
    if as_json:
        out.print_json(json.dumps(report))
        return
    out.print(f"host [bold]{beat['hostname']}[/bold] ({beat['host_id']}), group {beat['host_group']}: "
              f"[green]{beat['state']}[/green] at {config.server_url}")
    out.print(f"clock skew {skew:+.1f} s · {report['pending_events']} event(s) waiting to be shipped")
    out.print(f"format engine: {report['format_engine']}")
    out.print(_daemon_line(report["daemon"]))
    table = Table("key", "id", "active version")
    for k in keys:
        table.add_row(k["name"], k["key_id"], str(k["active_version"] or "none"))
    out.print(table)
    points = Table("guard point", "key", "state", "policy revision", "detail")
    for g in report["guard_points"]:
        points.add_row(g["path"], g["key"], g["state"], str(g["revision"] or "-"), g["detail"])
    out.print(points if report["guard_points"] else "no guard points on this host")


def _daemon_state(config: AgentConfig) -> dict[str, Any] | None:
    """What `kms-agent run` last wrote of itself (agents/daemon.py), and whether it still runs."""
    state = read_json(config.state_dir / STATUS_FILE)
    if state is None:
        return None
    alive = False
    if state.get("running") and isinstance(state.get("pid"), int):
        try:
            os.kill(state["pid"], 0)
            alive = True
        except ProcessLookupError:
            pass
        except PermissionError:
            alive = True
    return {**state, "running": alive}


def _daemon_line(state: dict[str, Any] | None) -> str:
    if state is None:
        return "daemon: no record here (`kms-agent run` has not run on this host)"
    error = state.get("error")
    if not state["running"]:
        return f"[yellow]daemon: not running[/yellow] (last record {state.get('updated_at')})" + (
            f"; it was failing since {error['since']}: {escape(error['message'])}" if error else "")
    if error:
        return (f"[red]daemon: heartbeats failing since {error['since']}[/red] ({error['failed_beats']} in a row, "
                f"last ok {state.get('last_ok_at') or 'never'}): {escape(error['message'])}")
    return f"daemon: running, last heartbeat ok at {state.get('last_ok_at') or '-'}"


@app.command()
def encrypt(paths: Annotated[list[Path], typer.Argument(help="files or directories (in place)")],
            key: Annotated[str, typer.Option("--key", "-k", help="managed key name or id")],
            output: Annotated[Path | None, typer.Option("--output", "-o", help="for one file: write here")] = None,
            chunk_size: Annotated[int | None, typer.Option(help="bytes per chunk (default from config)")] = None,
            ) -> None:
    """Encrypt files under the key's Active version (write-new, fsync, rename)."""
    config = _config()
    if output is not None and (len(paths) != 1 or not paths[0].is_file()):
        raise Fail(Exit.USAGE, "--output takes exactly one input file")
    with _client(config) as c:
        version = c.fetch(key).key

        def work(f: Path, advance: Callable[[int], None]) -> str | None:
            if output is None and is_encrypted(f):
                return None
            encrypt_file(f, output or f, version, chunk_size=chunk_size or config.chunk_size, progress=advance)
            return "file.encrypt"

        _run_files(paths, "encrypt", work, _spool(config), c)


@app.command()
def decrypt(paths: Annotated[list[Path], typer.Argument(help="files or directories (in place)")],
            output: Annotated[Path | None, typer.Option("--output", "-o", help="for one file: write here")] = None,
            ) -> None:
    """Decrypt files (every chunk is authenticated before the plaintext replaces anything)."""
    config = _config()
    if output is not None and (len(paths) != 1 or not paths[0].is_file()):
        raise Fail(Exit.USAGE, "--output takes exactly one input file")
    with _client(config) as c:
        keyring = ServerKeyring(c, ttl_seconds=config.key_cache_ttl_seconds, max_entries=config.key_cache_max_entries)

        def work(f: Path, advance: Callable[[int], None]) -> str | None:
            if not is_encrypted(f):
                if output is not None:
                    raise Fail(Exit.FILE, f"{f}: not an encrypted file")
                return None
            decrypt_file(f, output or f, keyring, progress=advance)
            return "file.decrypt"

        _run_files(paths, "decrypt", work, _spool(config), c)


def _rotate(paths: list[Path], verb: str, rekey: bool) -> None:
    config = _config()
    with _client(config) as c:
        keyring = ServerKeyring(c, ttl_seconds=config.key_cache_ttl_seconds, max_entries=config.key_cache_max_entries)
        newest: dict[uuid.UUID, Any] = {}

        def work(f: Path, advance: Callable[[int], None]) -> str | None:
            if not is_encrypted(f):
                return None
            header = read_header(str(f))
            if header.key_id not in newest:
                newest[header.key_id] = c.fetch(header.key_id).key
            target = newest[header.key_id]
            if header.key_version == target.version:
                return None
            if rekey:
                rekey_file(f, keyring, target, progress=advance)
            else:
                rewrap_file(f, keyring, target, progress=advance)
            return f"file.{verb}"

        _run_files(paths, verb, work, _spool(config), c)


@app.command()
def rewrap(paths: Annotated[list[Path], typer.Argument(help="encrypted files or directories")]) -> None:
    """Rotation: re-wrap each file's key under its managed key's Active version (data untouched)."""
    _rotate(paths, "rewrap", rekey=False)


@app.command()
def rekey(paths: Annotated[list[Path], typer.Argument(help="encrypted files or directories")]) -> None:
    """Re-encrypt each file's data under a new file key and the Active version."""
    _rotate(paths, "rekey", rekey=True)


@app.command()
def run() -> None:
    """The daemon, in the foreground: heartbeats, guard points, event shipping, revocation."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    config = _config()
    _identity(config)
    refused = host_revocation(config.state_dir)
    if refused is not None:  # before any guard point starts, whether the server answers or not
        raise Fail(Exit.NOT_ENROLLED, refused)
    with _client(config) as c:
        keyring = ServerKeyring(c, ttl_seconds=config.key_cache_ttl_seconds, max_entries=config.key_cache_max_entries)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        manager = GuardPointManager(config, _state.get("config_path"))
        spool = _spool(config)
        daemon = AgentDaemon(c, keyring, spool, guard_points=manager,
                             revocations=RevocationLedger(config.state_dir),
                             volumes=VolumeManager(c, config, spool=spool),
                             status_file=config.state_dir / STATUS_FILE)
        try:
            code = daemon.run(stop)
        finally:
            # However the daemon ended (a failed beat too), a revocation on record is what
            # each guard point's status says, not what its process last wrote.
            manager.stop_all(host_revocation(config.state_dir))
            daemon.ship_events()
    raise typer.Exit(code)


volume_app = typer.Typer(help="LUKS2 block volumes unlocked through the key server (docs/volumes.md).",
                         no_args_is_help=True, rich_markup_mode=None)
app.add_typer(volume_app, name="volume")


@contextmanager
def _volumes() -> Iterator[VolumeManager]:
    config = _config()
    spool = _spool(config)
    with _client(config) as c:
        try:
            yield VolumeManager(c, config, spool=spool)
        finally:
            _flush(c, spool)


def _size(text: str | None) -> int | None:
    if text is None:
        return None
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except (ValueError, IndexError):
        raise Fail(Exit.USAGE, f"--size {text!r}: a size like 512M, 20G or a number of bytes") from None


@volume_app.command("create")
def volume_create(
        name: Annotated[str, typer.Argument(help="the volume's name on this host (lower-case, digits, . _ -)")],
        path: Annotated[Path, typer.Argument(help="block device, or image file (made with --size)")],
        key: Annotated[str, typer.Option(help="managed key that seals the keyslot (tagged for this host's group)")],
        size: Annotated[str | None, typer.Option(help="size of a new image file: 512M, 20G…")] = None,
        sector_size: Annotated[int, typer.Option(help="encryption sector size: 4096 or 512")] = 4096,
        shared: Annotated[bool, typer.Option(help="every host of this host's group may open it")] = False,
        yes: Annotated[bool, typer.Option("--yes", help="do not ask before formatting")] = False) -> None:
    """Format PATH as a LUKS2 volume (aes-xts-plain64, 512-bit) whose keyslot the server seals."""
    if sector_size not in (512, 4096):
        raise Fail(Exit.USAGE, "--sector-size is 4096 or 512")
    if not yes and path.exists() and not typer.confirm(f"Everything on {path} will be lost. Format it?"):
        raise typer.Abort()
    with _volumes() as m:
        v = m.create(name=name, path=path, key=key, size=_size(size), sector_size=sector_size,
                     scope="group" if shared else "host")
    out.print(f"volume [bold]{v['name']}[/bold] ({v['id']}) made on {v['path']}: LUKS2 {v['luks_uuid']}, "
              f"sealed under {v['key_name']} v{v['key_version']}. Open it with `kms-agent volume open {name}`.")


@volume_app.command("open")
def volume_open(ref: Annotated[str, typer.Argument(help="volume name, id or path")],
                mount: Annotated[Path | None, typer.Option(help="mount its file system here")] = None,
                userspace: Annotated[bool | None, typer.Option(
                    "--userspace/--dm-crypt", help="how to open it (default: dm-crypt where the kernel has it, "
                    "else userspace)", show_default=False)] = None) -> None:
    """Ask the key server to unseal the volume and open it."""
    with _volumes() as m:
        state = m.open(ref, mountpoint=mount, userspace=userspace)
    where = f", mounted on {state.mountpoint}" if state.mountpoint else ""
    out.print(f"volume [bold]{state.name}[/bold] open ({state.opened_by}) as {state.device}{where}")


@volume_app.command("close")
def volume_close(ref: Annotated[str, typer.Argument(help="volume name, id or path")]) -> None:
    """Unmount it (if the agent mounted it), detach and stop serving it."""
    with _volumes() as m:
        state = m.close(ref)
    out.print(f"volume [bold]{ref}[/bold] closed" if state else f"volume {ref} was not open on this host")


@volume_app.command("status")
def volume_status(as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False) -> None:
    """The volumes this host may open, the server's state of each and what is open here."""
    with _volumes() as m:
        rows, unreachable = m.status()
    if unreachable:
        err.print(f"[yellow]key server unreachable[/yellow] ({unreachable}): its state of each volume is as last "
                  "seen here")
    if as_json:
        out.print_json(json.dumps(rows))
        return
    table = Table("volume", "path", "key", "server state", "here", "re-key", "recovery", "offline")
    for v in rows:
        local = v["local"]
        here = "-" if local is None else (f"{local['device']} ({local['opened_by']})" if local["alive"]
                                          else "stale: run `kms-agent volume close`")
        offline = (f"refused: {v['revoked_here']}" if v["revoked_here"] else
                   "grace kept" if v["grace_kept"] else "fail closed")
        key = f"{v['key_name']} v{v['key_version']}" if v.get("key_name") else "?"
        recovery = "?" if v.get("has_recovery") is None else "yes" if v["has_recovery"] else "no"
        table.add_row(v["name"], v["path"], key, v["state"] + (" (last seen)" if unreachable else ""), here,
                      _rekey_cell(v), recovery, offline)
    out.print(table if rows else "no volumes for this host")
    for v in rows:  # what waits for this host, said where it is seen
        if v["rekey_here"] == "interrupted":
            err.print(f"volume {v['name']}: a re-key was interrupted here; `kms-agent volume rekey {v['name']}` "
                      "resumes it (the volume does not open until it is done)")
        elif v["rekey_asked"] is not None and v["rekey_here"] != "running":
            err.print(f"volume {v['name']}: a re-key was asked for on the key server; run `kms-agent volume rekey "
                      f"{v['name']}` (the volume is closed while it runs)")


def _rekey_cell(v: dict[str, Any]) -> str:
    if v["rekey_here"] == "running":
        return "running here"
    if v["rekey_here"] == "interrupted":
        return "interrupted: resume it"
    if v["rekey_asked"] is not None:
        return f"asked for (#{v['rekey_asked']})"
    return "-"


@volume_app.command("open-all")
def volume_open_all(wait: Annotated[float, typer.Option(help="seconds to wait for the key server (boot)")] = 0,
                    tab: Annotated[Path | None, typer.Option(help="default: volumes_file of agent.toml")] = None,
                    ) -> None:
    """Open every volume of volumes.tab (the systemd unit strongroom-volumes runs this at boot).
    Fails closed: a volume opens only with the key server's answer, or within the offline
    grace its policy on the server gives it."""
    config = _config()
    with _volumes() as m:
        entries = parse_tab(tab or config.volumes_file)
        if not entries:
            out.print(f"no volumes in {tab or config.volumes_file}")
            return
        refused = m.host_refusal()
        reachable = True
        try:
            if refused is None:  # a revoked host has nothing to wait for
                m.wait_for_server(wait)
        except ServerUnreachable as exc:
            err.print(f"[yellow]key server unreachable[/yellow] ({exc}): only volumes within their offline grace "
                      "open")
            reachable = False
        failed = 0
        for entry, state, error in m.open_all(entries):
            if state is not None:
                out.print(f"{entry.name}: open ({state.opened_by}) as {state.device}"
                          + (f", mounted on {state.mountpoint}" if state.mountpoint else ""))
            else:
                failed += 0 if entry.nofail else 1
                err.print(f"[red]{entry.name}[/red]: {error}" + (" (nofail: going on)" if entry.nofail else ""))
    if refused is not None:
        raise Fail(Exit.NOT_ENROLLED, host_refusal_message(refused))
    if failed:
        raise Fail(Exit.KEY if reachable else Exit.UNREACHABLE,
                   f"{failed} volume(s) of {tab or config.volumes_file} did not open")


@volume_app.command("close-all")
def volume_close_all() -> None:
    """Close every volume open on this host (at shutdown)."""
    with _volumes() as m:
        results = m.close_all()
    for name, error in results:
        if error:
            err.print(f"[red]{name}[/red]: {error}")
        else:
            out.print(f"{name}: closed")
    if any(error for _, error in results):
        raise Fail(Exit.FAILED, "some volumes did not close: see above")


@volume_app.command("rotate")
def volume_rotate(ref: Annotated[str, typer.Argument(help="volume name, id or path")]) -> None:
    """Re-seal the keyslot under the key's Active version (new keyslot, old one removed; no data rewritten)."""
    with _volumes() as m:
        v = m.rotate(ref)
    out.print(f"volume [bold]{v['name']}[/bold] re-sealed under {v['key_name']} v{v['key_version']}")


@volume_app.command("rekey")
def volume_rekey(ref: Annotated[str, typer.Argument(help="volume name, id or path")]) -> None:
    """Re-encrypt the data under a new volume key (offline, resumable; the volume must be closed)."""
    with _volumes() as m, _bytes_progress(0, f"re-encrypting {ref}") as (progress, task):
        v = m.rekey(ref, lambda done, total: progress.update(task, completed=done, total=total))
    out.print(f"volume [bold]{v['name']}[/bold] re-encrypted under a new volume key; a recovery passphrase made "
              "before no longer opens it (`kms-agent volume recovery` makes a new one)")


@volume_app.command("recovery")
def volume_recovery(ref: Annotated[str, typer.Argument(help="volume name, id or path")]) -> None:
    """Add a recovery passphrase keyslot, once: it opens the volume with stock cryptsetup,
    without the key server. Shown here once and kept nowhere."""
    with _volumes() as m:
        words = m.recovery(ref)
    out.print("[bold]Recovery passphrase[/bold] (shown once: write it down and keep it offline, e.g. in a safe):")
    out.print(f"\n    {words}\n", highlight=False)
    out.print("It opens the volume without the key server: `cryptsetup open <device> <name>`. Its creation is in "
              "the audit log.")


def main() -> None:
    """Entry point: every failure becomes one line on stderr and its exit status."""
    try:
        code = app(standalone_mode=False)
        sys.exit(code if isinstance(code, int) else Exit.OK)
    except AgentError as exc:  # every error of the agent's own: one line and its exit status
        err.print(f"[red]{exc.label}[/red]: {exc.describe()}")
        sys.exit(exc.exit_code)
    except (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError) as exc:
        err.print(f"[red]error[/red]: {exc.filename}: {exc.strerror}")
        sys.exit(Exit.FILE)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err.print("aborted")
        sys.exit(Exit.FAILED)
    except Exception as exc:  # click's usage errors carry their own exit code
        code = getattr(exc, "exit_code", None)
        if code is not None and hasattr(exc, "show"):
            exc.show()
            sys.exit(code)
        raise
