"""`keyserver retire-version` and `keyserver version-inventory` (decision 0024): retiring
a key version from the server's own command line, and where a version is still used.

Registered on the `keyserver` command by keyserver/cli.py (`register`, last). The CLI
is a system actor: whoever runs it holds the HSM's PINs and the database, so nothing it
asks is held for approval (core/approvals.py); everything is audited as `cli`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from keyserver.core.errors import CoreError, ServiceUnavailable
from keyserver.core.principal import system_context
from keyserver.services import Services

EXIT_FAILED, EXIT_UNAVAILABLE = 1, 4  # as keyserver/cli.py's
console = Console(stderr=True)
STATE_STYLE = {"in_use": "red", "unreported": "yellow", "clear": "green", "excluded": "cyan"}


def _fail(exc: CoreError) -> typer.Exit:
    console.print(Text(f"{exc.message} ({exc.code})", style="red"), soft_wrap=True)
    return typer.Exit(EXIT_UNAVAILABLE if isinstance(exc, ServiceUnavailable) else EXIT_FAILED)


def render_inventory(inv: dict[str, Any], out: Console) -> None:
    """The inventory as an operator reads it: one row per holder, the totals, and what
    still stands between the version and its retirement."""
    table = Table(title=f"key {inv['key']} version {inv['version']} ({inv['state']})", title_justify="left")
    for column in ("kind", "holder", "host", "count", "state", "reported"):
        table.add_column(column, justify="right" if column == "count" else "left")
    for h in inv["holders"]:
        table.add_row(h["kind"], h["name"], h["host"] or "", "?" if h["count"] is None else str(h["count"]),
                      Text(h["state"], style=STATE_STYLE.get(h["state"], "")), h["reported_at"] or "")
    out.print(table)
    out.print(", ".join(f"{kind}: {n}" for kind, n in inv["kinds"].items()), soft_wrap=True)
    unreadable = [h for h in inv["holders"] if h.get("unreadable")]
    if unreadable:
        out.print(Text("files whose header names no version of the key (no version decrypts them, so they hold "
                       "none; a statement names them): " + ", ".join(f"{h['name']}: {h['unreadable']}"
                                                                      for h in unreadable), style="yellow"),
                  soft_wrap=True)
    if inv["unreported_hosts"]:
        out.print(Text("not reported since the retirement began: " + ", ".join(inv["unreported_hosts"]),
                       style="yellow"), soft_wrap=True)
    r = inv.get("retirement")
    if r is not None:
        line = f"retirement {r['id']}: {r['state']}, requested by {r['requested_by']} at {r['requested_at']}"
        if r["state"] == "complete":
            line += f"; signed statement at audit record {r['statement_seq']}"
        out.print(line, soft_wrap=True)
    out.print(Text("in use" if inv["in_use"] else "not in use", style="red" if inv["in_use"] else "green"))


def register(app: typer.Typer, existing_services: Callable[[], Services],
             initialize: Callable[[Services], object]) -> None:
    """Add the commands to `app`, with cli.py's way to open the server that exists here."""

    @app.command("version-inventory")
    def version_inventory(
        key: Annotated[str, typer.Argument(help="the key's name or id")],
        version: Annotated[int, typer.Argument(min=1, help="the version number")],
    ) -> None:
        """Where a key version is still used: data keys, guard points per host, volumes,
        databases, AWS key stores and KMIP clients (exit 1 when the key or version does not exist)."""
        services = existing_services()
        try:
            initialize(services)
            inv = services.retirement.inventory(system_context("cli"), key, version)
        except CoreError as exc:
            raise _fail(exc) from None
        finally:
            services.close()
        render_inventory(inv, Console())


    @app.command("retire-version")
    def retire_version(
        key: Annotated[str, typer.Argument(help="the key's name or id")],
        version: Annotated[int, typer.Argument(min=1, help="the version to retire (not the Active one: rotate first)")],
        reason: Annotated[str, typer.Option(help="why, for the audit trail and the statement")] = "",
        contents: Annotated[bool, typer.Option(help="also re-key every guard point on the key (new file keys, "
                                                    "contents re-encrypted), not only re-wrap headers")] = False,
    ) -> None:
        """Start retiring a key version: holders move to the newest version, and once none
        uses it the server writes a signed zero-use statement to the audit trail; then the
        version may be destroyed."""
        services = existing_services()
        try:
            initialize(services)
            ctx = system_context("cli")
            retirement = services.retirement.retire(ctx, key, version, reason=reason, contents=contents)
            inv = services.retirement.inventory(ctx, key, version)
        except CoreError as exc:
            raise _fail(exc) from None
        finally:
            services.close()
        if retirement["state"] == "complete" or (inv["retirement"] or {}).get("state") == "complete":
            console.print(f"[green]version {version} of {inv['key']} retired[/green]: nothing uses it; the signed "
                              "statement is in the audit trail", soft_wrap=True)
        else:
            console.print(f"retiring version {version} of {inv['key']} (retirement {retirement['id']}); it "
                              "completes when nothing below is in use or unreported", soft_wrap=True)
        render_inventory(inv, Console())
