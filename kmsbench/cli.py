"""`kms-bench`: run the benchmark suites, plain vs encrypted side by side, and write the
report. See docs/benchmarks.md ("kms-bench") for the suites, sizes and exit codes.

`kms-bench keyserver ...` and `kms-bench kmip ...` run the key server's load benchmark
and the KMIP comparison on their own, with their own options (--help)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from kmsbench import report
from kmsbench.config import SUITES, Config
from kmsbench.errors import BenchError, Exit
from kmsbench.machine import describe
from kmsbench.preflight import check
from kmsbench.suites import SUITE_FUNCTIONS, steps
from kmsbench.workspace import Workspace

console = Console(stderr=True)
# Benchmarks with a command of their own: `kms-bench NAME [options]` hands over to them.
COMMANDS = {"keyserver": "kmsbench.keyserver_load", "kmip": "kmsbench.kmip_load", "audit": "kmsbench.audit_bench",
            "drill": "kmsbench.drill", "adversary": "kmsbench.adversary", "xks": "kmsbench.xks_load",
            "guardpoint-transport": "kmsbench.guardpoint_transport:transport_main"}


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _suites(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [n for n in names if n not in SUITES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown suite(s) {', '.join(unknown) or '(none)'}; "
                                         f"choose from {','.join(SUITES)}")
    return [s for s in SUITES if s in names]  # the documented order, whatever the order given


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kms-bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 done, 1 a suite failed, 2 bad arguments, 3 missing privileges or programs, "
               "4 key server / PostgreSQL unreachable or token refused, 5 not enough disk, 6 --out/--workdir not "
               "empty, 130 interrupted (everything created removed). The key server's load benchmark and the "
               "KMIP comparison also run on their own: kms-bench keyserver --help, kms-bench kmip --help")
    p.add_argument("--suites", type=_suites, default=list(SUITES), help=f"comma-separated, from {','.join(SUITES)}")
    p.add_argument("--quick", action="store_true", help="small sizes and short loads: a few minutes")
    p.add_argument("--runs", type=int, help="repetitions per figure (default 3; 2 with --quick)")
    p.add_argument("--out", type=Path, help="report directory, new or empty (default ./kms-bench-<timestamp>)")
    p.add_argument("--workdir", type=Path, help="where the suites write, new or empty: the disk measured "
                                                "(default <out>/work, removed afterwards)")
    p.add_argument("--keyserver", help="measure this running key server (base URL) instead of a throwaway one")
    p.add_argument("--token", help="API token for --keyserver")
    p.add_argument("--cacert", type=Path, help="--keyserver's CA certificate (the ca.pem its data directory "
                                               "holds, as for curl --cacert; default: the system's trust store)")
    p.add_argument("--key", help="key to generate data keys from on --keyserver (default: a new kms-bench-* key)")
    p.add_argument("--postgres", help="PostgreSQL URL for the kmip suite's scratch database (default: a throwaway "
                                      "cluster in the work directory)")
    p.add_argument("--copy-sizes", type=_ints, metavar="MIB,...", help="copy suite file sizes in MiB "
                                                                       "(default 2048,6144)")
    p.add_argument("--threads", type=int, help="concurrent suite threads (default 10)")
    p.add_argument("--files", type=int, help="concurrent suite 10 MB files per thread (default 4)")
    p.add_argument("--pg-scale", type=int, help="oltp: pgbench scale (default 50, ~750 MB)")
    p.add_argument("--pg-seconds", type=int, help="oltp: seconds per pgbench run (default 30)")
    p.add_argument("--clients", type=_ints, metavar="N,...", help="keyserver: concurrent clients (default 1,50,200)")
    p.add_argument("--seconds", type=int, help="keyserver and kmip: seconds per load figure (default 10)")
    p.add_argument("--rotation-files", type=int, help="rotation: files in the guard point (default 1000)")
    p.add_argument("--docs", type=Path, help="also rewrite this benchmarks document's marked sections "
                                             "(docs/benchmarks.md) and copy the charts beside it")
    p.add_argument("--readme", type=Path, help="also rewrite this README's headline table (its marked section)")
    p.add_argument("--from-results", type=Path, nargs="+", metavar="RESULTS_JSON",
                   help="run nothing: rebuild the report (and --docs) from earlier runs' results.json; with several, "
                        "a suite is taken from the last run that has it (a suite re-run on its own)")
    return p


def config(args: argparse.Namespace) -> Config:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    out = args.out or Path.cwd() / f"kms-bench-{stamp}"
    overrides: dict[str, Any] = {
        "suites": args.suites, "runs": args.runs or (2 if args.quick else 3), "out": out,
        "work": args.workdir or out / "work", "keyserver": args.keyserver, "token": args.token, "key": args.key,
        "cacert": args.cacert}
    for name, attr in (("copy_sizes", "copy_sizes_mib"), ("threads", "threads"), ("files", "files_per_thread"),
                       ("pg_scale", "pg_scale"), ("pg_seconds", "pg_seconds"), ("clients", "clients"),
                       ("seconds", "load_seconds"), ("rotation_files", "rotation_files"), ("postgres", "postgres")):
        if getattr(args, name) is not None:
            overrides[attr] = getattr(args, name)
    for name in ("runs", "threads", "files", "pg_scale", "pg_seconds", "seconds", "rotation_files"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise BenchError(Exit.USAGE, f"--{name.replace('_', '-')} must be at least 1", "pass a positive number")
    if args.quick and args.runs is not None:
        overrides["suite_runs"] = {}  # an explicit --runs applies to every suite
    return Config.quick_sizes(**overrides) if args.quick else Config(**overrides)


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    # SIGTERM (and SIGHUP) take the same clean way out as Ctrl-C.
    raise KeyboardInterrupt(signal.Signals(signum).name)


def run_suites(cfg: Config, ws: Workspace, results: dict[str, Any]) -> None:
    columns = (SpinnerColumn(), TextColumn("[bold]{task.fields[suite]:<10}[/bold] {task.description}"),
               BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        for suite in cfg.suites:
            task = progress.add_task("starting", total=steps(cfg, suite), suite=suite)

            def step(label: str, task: Any = task) -> None:
                progress.update(task, advance=1, description=label)

            started = time.monotonic()
            try:
                entry = SUITE_FUNCTIONS[suite](cfg, ws.work, step)
            except (Exception, SystemExit) as exc:  # one suite failing leaves the others' results
                detail = str(exc) if isinstance(exc, BenchError | SystemExit) else f"{type(exc).__name__}: {exc}"
                if not isinstance(exc, BenchError | SystemExit):
                    console.print(traceback.format_exc(), markup=False, highlight=False)
                entry = {"error": detail.strip()}
                progress.update(task, description=f"[red]failed[/red]: {detail.strip().splitlines()[0][:80]}")
            else:
                progress.update(task, description="[green]done[/green]", completed=steps(cfg, suite) or 1,
                                total=steps(cfg, suite) or 1)
            entry["seconds"] = round(time.monotonic() - started, 1)
            results["suites"][suite] = entry


def write_outputs(results: dict[str, Any], out: Path, docs: Path | None, readme: Path | None) -> dict[str, Path]:
    (out / "results.json").write_text(json.dumps(results, indent=1))
    files = report.write(results, out)
    if docs is not None:
        from kmsbench.docs import update

        update(docs, results, {k: v for k, v in files.items() if v.suffix == ".png"})
    if readme is not None:
        from kmsbench.docs import update_readme

        update_readme(readme, results)
    return files


def merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One results document from several runs on the same machine: each suite from the
    last run where it succeeded; the runs' start times are kept and shown."""
    if len(runs) == 1:
        return runs[0]
    merged = {**runs[0], "suites": {}, "merged_from": [r.get("started") for r in runs],
              "duration_s": sum(float(r.get("duration_s", 0)) for r in runs)}
    for run in runs:
        for name, suite in run["suites"].items():
            if "error" not in suite or name not in merged["suites"]:
                merged["suites"][name] = {**suite, "run_started": run.get("started")}
    return merged


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given and given[0] in COMMANDS:
        module, _, function = COMMANDS[given[0]].partition(":")
        getattr(importlib.import_module(module), function or "main")(given[1:])  # a typer app exits itself
        return Exit.OK
    args = parser().parse_args(argv)
    if args.from_results is not None:
        earlier = merge([json.loads(p.read_text()) for p in args.from_results])
        out = args.out or args.from_results[0].parent
        out.mkdir(parents=True, exist_ok=True)
        files = write_outputs(earlier, out, args.docs, args.readme)
        console.print(f"report written: {files['report.md']}")
        return Exit.OK
    try:
        cfg = config(args)
        problems = check(cfg)
        Workspace.check(cfg.out, what="--out")
        Workspace.check(cfg.work, what="--workdir")
    except BenchError as exc:
        problems = [exc]
    if problems:
        console.print("[red bold]kms-bench cannot start[/red bold] (nothing was created):")
        for problem in problems:
            console.print(f"[red]✗[/red] {problem}", highlight=False, soft_wrap=True)
        return min(p.code for p in problems)
    ws = Workspace(cfg.out, cfg.work, run_id=datetime.now(UTC).isoformat(timespec="seconds"))
    old = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    started = time.monotonic()
    results: dict[str, Any] = {
        "tool": "kms-bench", "version": 1, "argv": sys.argv[1:] if argv is None else argv,
        "mode": "quick" if cfg.quick else "full", "runs": cfg.runs,
        "started": datetime.now(UTC).isoformat(timespec="seconds"), "suites": {}}
    try:
        ws.create()
        results["machine"] = describe(cfg.work)
        console.print(f"kms-bench: suites {', '.join(cfg.suites)}; {cfg.runs} run(s) each; work in {cfg.work}")
        run_suites(cfg, ws, results)
        results["duration_s"] = round(time.monotonic() - started, 1)
        results["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
        ws.finish()
        files = write_outputs(results, cfg.out, args.docs, args.readme)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]: unmounting and removing what this run created…")
        ws.remove_all()
        console.print(f"removed {cfg.work}" + (f" and {cfg.out}" if cfg.out != cfg.work else ""))
        return Exit.INTERRUPTED
    except BenchError as exc:
        console.print(f"[red]✗[/red] {exc}", highlight=False)
        ws.remove_all()
        return exc.code
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    console.print(f"report: {files['report.md']} (and report.html, results.json, charts/)")
    failed = [k for k, v in results["suites"].items() if "error" in v]
    if failed:
        console.print(f"[red]failed suite(s)[/red]: {', '.join(failed)} (see the report)")
        return Exit.SUITE_FAILED
    return Exit.OK


def entry() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
