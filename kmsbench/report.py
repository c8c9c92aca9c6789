"""From results.json to the report: tables in the seeds' shape (baseline, protected,
change %), PNG charts, Markdown and HTML. Everything here is computed from the raw
repetitions in the results, so a report can be rebuilt from results.json alone."""

from __future__ import annotations

import html
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kmsbench.machine import summary


@dataclass
class Row:
    label: str
    baseline: list[float]
    subject: list[float]
    peer: list[float] | None = None
    headline: str = ""  # the README's name for this row; empty: not a headline figure

    @property
    def change(self) -> float | None:
        if not self.baseline or not self.subject or statistics.median(self.baseline) == 0:
            return None
        return statistics.median(self.subject) / statistics.median(self.baseline) - 1

    @property
    def vs_peer(self) -> float | None:
        if not self.peer or not self.subject or statistics.median(self.peer) == 0:
            return None
        return statistics.median(self.subject) / statistics.median(self.peer)


@dataclass
class Table:
    suite: str
    title: str
    method: str
    unit: str
    baseline: str
    subject: str
    peer: str | None
    rows: list[Row]
    notes: list[str] = field(default_factory=list)
    extra: list[tuple[list[str], list[list[str]]]] = field(default_factory=list)  # (header, rows) as text


def fmt(xs: list[float] | None, digits: int = 0) -> str:
    """median (min-max), or n/a."""
    if not xs:
        return "n/a"
    med = statistics.median(xs)
    if len(xs) == 1:
        return f"{med:,.{digits}f}"
    return f"{med:,.{digits}f} ({min(xs):,.{digits}f}-{max(xs):,.{digits}f})"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def _pairs(runs: list[list[float]], i: int) -> list[float]:
    return [float(r[i]) for r in runs]


# --- one table per suite -----------------------------------------------------------------
def engine_table(s: dict[str, Any]) -> Table:
    raw = s["raw"]
    rows = []
    for chunk, runs in raw["chunks"].items():
        for op in ("encrypt", "decrypt"):
            rows.append(Row(f"{op}, {int(chunk) // 1024} KiB chunks", runs[f"raw_{op}"], runs[f"format_{op}"],
                            runs.get(f"python_{op}"),
                            headline=f"engine: {op}, {int(chunk) // 1024} KiB chunks" if int(chunk) == 65536
                            else ""))
    return Table("engine", "Cipher engine (in memory, one thread)",
                 f"AES-256-GCM over {raw['total_mib']} MiB per measurement, {raw['repeats']} interleaved "
                 f"repetitions; the compiled engine (libsrcf: nonce, associated data, chunk framing, 1 MiB runs) "
                 f"against the bare primitive in the same C process (one EVP AES-256-GCM call per chunk), on the "
                 f"same CPU ({raw['cpu']}); the Python reference beside them (its `cryptography` wheel bundles a "
                 f"newer OpenSSL than Debian's).",
                 "MB/s", "raw EVP AES-GCM", "format v1 (libsrcf)", "Python reference", rows,
                 notes=["Change is the format's cost over the bare cipher call; the seeds' tests 1-2 measured the "
                        "cipher alone."])


def copy_table(s: dict[str, Any]) -> Table:
    rows = []
    for size, by_target in s["raw"].items():
        gb = int(size) / 1024
        label = f"{gb:g} GiB" if gb >= 1 else f"{int(size)} MiB"
        big = int(size) == max(int(x) for x in s["raw"])
        for i, op in enumerate(("write", "read")):
            rows.append(Row(f"{op} {label}", _pairs(by_target["plain"], i), _pairs(by_target["guard point"], i),
                            _pairs(by_target["gocryptfs"], i) if "gocryptfs" in by_target else None,
                            headline=f"copy: {op} {label}" if big else ""))
    runs = len(next(iter(s["raw"].values()))["plain"])
    return Table("copy", "Large file copy (seed test 3)",
                 f"A file written in 1 MiB blocks with fsync, then read back with the page cache dropped, on a "
                 f"plain directory, a guard point and gocryptfs, all on the same disk; {runs} interleaved runs.",
                 "MB/s", "plain directory", "guard point", "gocryptfs" if any(r.peer for r in rows) else None, rows,
                 notes=["The seeds report copy time (+5.8 % ... +8.9 % write, +13 % ... +19 % read); here "
                        "throughput: -x % throughput is +x/(1-x) % time."])


def concurrent_table(s: dict[str, Any]) -> Table:
    p, raw = s["params"], s["raw"]
    rows = [Row(f"{op}, {p['threads']} threads", _pairs(raw["plain"], i), _pairs(raw["guard point"], i),
                headline=f"concurrent: {op}, {p['threads']} threads") for i, op in enumerate(("write", "read"))]
    return Table("concurrent", "Concurrent file I/O (seed test 4, scaled)",
                 f"{p['threads']} threads each writing {p['files_per_thread']} x {p['file_mb']} MB files with fsync, "
                 f"then reading them all back cold; aggregate throughput; {len(raw['plain'])} interleaved runs.",
                 "MB/s", "plain directory", "guard point", None, rows,
                 notes=["The seeds: -11 % (SAN), -20 % (DAS), -28 ... -38 % (NAS) throughput with 4 hosts x 10 "
                        "threads."])


def oltp_table(s: dict[str, Any]) -> Table:
    p, raw = s["params"], s["raw"]
    rows = [Row(mix, by["plain"], by["guard point"], headline=f"oltp: pgbench {mix}") for mix, by in raw.items()]
    runs = len(next(iter(raw.values()))["plain"])
    return Table("oltp", "OLTP: pgbench (seed test 6)",
                 f"PostgreSQL with its whole data directory (WAL included) on a guard point vs a plain directory; "
                 f"pgbench scale {p['scale']}, {p['clients']} clients, {p['seconds']} s per run, {runs} interleaved "
                 "runs.", "tps", "plain directory", "guard point", None, rows,
                 notes=["The seeds: -0.78 % ... -1.77 % tpm (TPC-C), -6.8 % / -21.8 % on a SAN variant."])


def keyserver_table(s: dict[str, Any]) -> Table:
    raw = s["raw"]
    ceiling = raw.get("hsm_1_thread", {}).get("unwrap_ceiling")
    ceiling2 = raw.get("hsm_2_threads", {}).get("unwrap_ceiling")
    rows, extra_rows = [], []
    for lr in raw["http"]:
        shape = (f"{lr['clients']} virtual users, {lr['think_ms']} ms think" if lr.get("think_ms")
                 else f"{lr['clients']} client{'s' if lr['clients'] != 1 else ''}")
        rows.append(Row(shape, list(ceiling2 or []), lr["rps"],
                        headline=f"keyserver: data keys/s, {shape}" if lr["clients"] == 200 and not lr.get(
                            "think_ms") else ""))
        extra_rows.append([shape, fmt(lr["rps"]), fmt(lr["p50_ms"], 1), fmt(lr["p99_ms"], 1),
                           f"{sum(lr['errors'])} / {sum(lr['requests'])}"])
    extra = [(["load", "data keys/s", "p50 ms", "p99 ms", "errors / requests"], extra_rows)]
    if ceiling:
        h1, h2 = raw["hsm_1_thread"], raw["hsm_2_threads"]
        extra.append((["HSM operation (in the token)", "1 thread, ops/s", "2 threads, ops/s"], [
            ["RSA-2048 OAEP unwrap (the ceiling)", fmt(h1["unwrap_ceiling"]), fmt(h2["unwrap_ceiling"])],
            ["host re-wrap (unwrap + wrap under the host's key)", fmt(h1["host_rewrap"]), fmt(h2["host_rewrap"])]]))
    return Table("keyserver", "Key server: data keys over REST",
                 f"`POST /api/v1/keys/{{key}}/generate-data-key` driven by wrk on the same machine ({raw['database']}, "
                 f"{raw['workers']} worker(s)), {raw['repeats']} runs of {raw['duration_s']} s per load; the "
                 "baseline is the HSM's own ceiling measured in the same token (RSA-2048 unwraps per second, "
                 "2 threads), so change is how far below the token's ceiling the whole server runs.",
                 "per second", "HSM RSA unwrap ceiling" if ceiling else "HSM ceiling (not measured)", "data keys/s",
                 None, rows, extra=extra,
                 notes=["The seeds do not publish a key-server rate; their 200 virtual users are the load shape."])


def kmip_table(s: dict[str, Any]) -> Table:
    runs = s["raw"]["runs"]
    rows = []
    conns = [str(c) for c in s["params"]["connections"]]
    for op in ("get", "create"):
        for n in conns:
            ours = [float(r["servers"]["strongroom"][op][n]) for r in runs if n in r["servers"]["strongroom"][op]]
            theirs = [float(r["servers"]["pykmip"][op][n]) for r in runs if n in r["servers"]["pykmip"][op]]
            rows.append(Row(f"{op.capitalize()}, {n} connection{'s' if n != '1' else ''}", theirs, ours,
                            headline=f"kmip: {op.capitalize()}, {n} connections vs PyKMIP" if n == conns[-1] else ""))
    return Table("kmip", "KMIP over mutual TLS: Strongroom vs PyKMIP's bundled server",
                 f"Create and Get per second from one client process, one TLS connection per thread, "
                 f"{s['params']['seconds']} s per figure, {len(runs)} run(s) (`kms-bench kmip`). Strongroom "
                 "unwraps every key in the HSM, checks revocation and audits each export; PyKMIP stores keys in "
                 "plaintext under one global lock.", "ops/s", "PyKMIP server", "Strongroom", None, rows)


def rotation_table(s: dict[str, Any]) -> Table:
    p, raw = s["params"], s["raw"]
    runs = raw["runs"]
    idle = [r["idle"]["reader_mb_s"] for r in runs]
    rows = [Row(f"reader during {'re-wrap' if op == 'rewrap' else 're-key'}", idle,
                [r[op]["reader_mb_s"] for r in runs],
                headline=f"rotation: reader during {'re-wrap' if op == 'rewrap' else 're-key'}")
            for op in ("rewrap", "rekey")]
    size_mib = p["files"] * p["file_kib"] / 1024
    times = []
    for op, name in (("rewrap", "rotate (re-wrap headers)"), ("rekey", "re-key (re-encrypt)")):
        secs = [r[op]["seconds"] for r in runs]
        times.append([name, fmt(secs, 2), fmt([p["files"] / x for x in secs]), fmt([size_mib / x for x in secs], 1),
                      str(sum(r[op]["reader_reads"] for r in runs)), str(sum(r[op]["reader_errors"] for r in runs))])
    return Table("rotation", "Key rotation and re-key of a guard point, under a reader",
                 f"A guard point holding {p['files']} files of {p['file_kib']} KiB ({size_mib:g} MiB); the mount's "
                 "own re-wrap and re-key (as the agent runs them) while a reader reads every file in turn through "
                 f"the mount and checks its SHA-256; {len(runs)} run(s). Baseline: the reader with nothing else "
                 "running.", "reader MB/s", "reader, idle", "reader, rotating", None, rows,
                 extra=[(["operation", "seconds", "files/s", "MiB/s", "reads during", "reader errors"], times)],
                 notes=[f"Reader errors over the whole suite: **{raw['reader_errors']}** (must be 0) in "
                        f"{raw['reader_reads']} reads." + (f" First: {'; '.join(raw['reader_error_samples'])}"
                                                           if raw.get("reader_error_samples") else "")])


def volume_table(s: dict[str, Any]) -> Table:
    p, raw = s["params"], s["raw"]
    base, subject, peer = "plain loop", "volume (userspace)", "guard point"
    seq = raw["seq"]
    rows = [Row(f"seq {op}, {p['seq_mib']} MiB", _pairs(seq[base], i), _pairs(seq[subject], i), _pairs(seq[peer], i),
                headline=f"volume: sequential {op}") for i, op in enumerate(("write", "read"))]
    rows += [Row(f"4 KiB {rw} (IOPS)", by[base], by[subject], by[peer], headline=f"volume: 4 KiB {rw}")
             for rw, by in raw["fio"].items()]
    if raw.get("pgbench"):
        rows.append(Row("pgbench TPC-B-like (tps)", raw["pgbench"][base], raw["pgbench"][subject],
                        raw["pgbench"][peer], headline="volume: pgbench TPC-B-like"))
    runs = len(seq[base])
    return Table("volume", "Block volume: LUKS2 in userspace vs a plain loop device",
                 f"ext4 on a loop device over an image file (plain), over a LUKS2 volume (aes-xts-plain64, 4 KiB "
                 f"sectors) served by strongroom-volume (volume), and a guard point, all on the same disk: "
                 f"{p['seq_mib']} MiB written in 1 MiB blocks with fsync then read cold; fio 4 KiB random reads and "
                 f"writes, O_DIRECT, libaio queue depth 16, {p['fio_seconds']} s over {p['fio_mib']} MiB; pgbench "
                 f"scale {p['pg_scale']}, {p['pg_clients']} clients, {p['pg_seconds']} s; {runs} interleaved runs.",
                 "MB/s, IOPS, tps", "plain loop", "volume (userspace)", "guard point", rows,
                 notes=["Targets (issue 18): sequential within 15 %, 4 KiB random within 25 %, pgbench within 10 % of "
                        "plain. The peer column is the guard point on the same workload."])


TABLES = {"engine": engine_table, "copy": copy_table, "concurrent": concurrent_table, "oltp": oltp_table,
          "keyserver": keyserver_table, "kmip": kmip_table, "rotation": rotation_table, "volume": volume_table}


def tables(results: dict[str, Any]) -> list[Table]:
    return [TABLES[name](s) for name, s in results["suites"].items() if name in TABLES and "raw" in s]


def headline(ts: list[Table]) -> list[tuple[Table, Row]]:
    return [(t, r) for t in ts for r in t.rows if r.headline]


# --- charts -----------------------------------------------------------------------------
def charts(results: dict[str, Any], directory: Path) -> dict[str, Path]:
    """One PNG per suite (medians, whiskers from min to max) and one of the headline
    changes; returns {suite or "headline": path}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    made: dict[str, Path] = {}
    ts = tables(results)
    for t in ts:
        series = [(t.baseline, [r.baseline for r in t.rows]), (t.subject, [r.subject for r in t.rows])]
        if t.peer:
            series.append((t.peer, [r.peer or [] for r in t.rows]))
        fig, ax = plt.subplots(figsize=(9, 0.6 + 0.55 * len(t.rows) * len(series)))
        height = 0.8 / len(series)
        for k, (name, data) in enumerate(series):
            ys = [i + k * height for i in range(len(t.rows))]
            meds = [statistics.median(d) if d else 0.0 for d in data]
            lo = [m - min(d) if d else 0.0 for m, d in zip(meds, data, strict=True)]
            hi = [max(d) - m if d else 0.0 for m, d in zip(meds, data, strict=True)]
            ax.barh(ys, meds, height, xerr=[lo, hi], label=name, capsize=3)
        ax.set_yticks([i + height * (len(series) - 1) / 2 for i in range(len(t.rows))],
                      [r.label for r in t.rows])
        ax.invert_yaxis()
        ax.set_xlabel(f"{t.unit} (median; whiskers: min-max)")
        ax.set_title(t.title, fontsize=10)
        ax.legend(fontsize=8, loc="best")
        fig.tight_layout()
        path = directory / f"{t.suite}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made[t.suite] = path
    heads = [(t, r) for t, r in headline(ts) if r.change is not None]
    if heads:
        fig, ax = plt.subplots(figsize=(9, 0.6 + 0.45 * len(heads)))
        values = [100 * (r.change or 0.0) for _, r in heads]
        ax.barh(range(len(heads)), values, color=["#c0392b" if v < 0 else "#27ae60" for v in values])
        ax.set_yticks(range(len(heads)), [r.headline for _, r in heads], fontsize=8)
        ax.invert_yaxis()
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_xlabel("change vs baseline, % (median)")
        ax.set_title("Protected vs baseline, same machine, same run", fontsize=10)
        fig.tight_layout()
        path = directory / "headline.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made["headline"] = path
    return made


# --- text ------------------------------------------------------------------------------
def md_table(header: list[str], rows: list[list[str]], align: list[str] | None = None) -> list[str]:
    align = align or ["---"] + ["---:"] * (len(header) - 1)
    return ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|",
            *("| " + " | ".join(r) + " |" for r in rows)]


def table_rows(t: Table) -> tuple[list[str], list[list[str]]]:
    header = ["test", f"{t.baseline}", f"{t.subject}", "change"]
    if t.peer:
        header += [t.peer, f"{t.subject} / {t.peer}"]
    rows = []
    for r in t.rows:
        row = [r.label, fmt(r.baseline), fmt(r.subject), pct(r.change)]
        if t.peer:
            row += [fmt(r.peer), "n/a" if r.vs_peer is None else f"{r.vs_peer:.2f}x"]
        rows.append(row)
    return header, rows


def headline_rows(ts: list[Table]) -> tuple[list[str], list[list[str]]]:
    rows = [[r.headline, t.unit, t.baseline, fmt(r.baseline), fmt(r.subject), pct(r.change)]
            for t, r in headline(ts)]
    return ["figure", "unit", "baseline", "baseline value", "protected / ours", "change"], rows


def run_line(results: dict[str, Any]) -> str:
    line = (f"kms-bench {results.get('mode', '')} run of {results.get('started', '?')}, "
            f"{results.get('duration_s', 0) / 60:.1f} min; {results.get('runs', '?')} repetition(s) per figure; "
            "values are median (min-max).")
    if results.get("merged_from"):
        again = [f"{name} ({s['run_started']})" for name, s in results["suites"].items()
                 if s.get("run_started") and s["run_started"] != results["merged_from"][0]]
        line += f" Merged from runs started {', '.join(results['merged_from'])}: re-run on its own: {', '.join(again)}."
    return line


def markdown(results: dict[str, Any], chart_paths: dict[str, str], *, heading_level: int = 1,
             detail: set[str] | None = None) -> str:
    """The report; `chart_paths` maps suite -> image path as the document links it.
    `detail`: the suites whose tables are written out (default all); the others get
    their chart only (docs/benchmarks.md, where their modules' sections hold the tables)."""
    h = "#" * heading_level
    ts = tables(results)
    charts_only = [t for t in ts if detail is not None and t.suite not in detail]
    ts_detail = [t for t in ts if detail is None or t.suite in detail]
    out = [f"{h} kms-bench report", "", run_line(results), ""]
    out += [f"{h}# Machine", "", *md_table(["", ""], [[k, v] for k, v in summary(results["machine"])],
                                           ["---", "---"]), ""]
    out += [f"{h}# Headline", "", *md_table(*headline_rows(ts)), ""]
    if "headline" in chart_paths:
        out += [f"![headline changes]({chart_paths['headline']})", ""]
    for t in charts_only:
        if t.suite in chart_paths:
            out += [f"![{t.suite}]({chart_paths[t.suite]})", ""]
    for t in ts_detail:
        out += [f"{h}# {t.title}", "", t.method, "", f"Unit: {t.unit}.", "", *md_table(*table_rows(t)), ""]
        for header, rows in t.extra:
            out += [*md_table(header, rows), ""]
        out += [*(n for note in t.notes for n in (note, "")), ]
        if t.suite in chart_paths:
            out += [f"![{t.suite}]({chart_paths[t.suite]})", ""]
    failed = {k: v for k, v in results["suites"].items() if "error" in v}
    if failed:
        out += [f"{h}# Suites that failed", ""]
        out += [f"* **{k}**: {v['error']}" for k, v in failed.items()] + [""]
    return "\n".join(out)


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _inline(text: str) -> str:
    # The notes use **bold** and `code` only.
    import re

    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


def html_report(results: dict[str, Any], chart_paths: dict[str, str]) -> str:
    ts = tables(results)
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>kms-bench report</title><style>",
             "body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}",
             "table{border-collapse:collapse;margin:1rem 0}td,th{border:1px solid #ccc;padding:.3rem .6rem}",
             "td:not(:first-child){text-align:right;font-variant-numeric:tabular-nums}th{background:#f3f3f3}",
             "img{max-width:100%}</style></head><body>", "<h1>kms-bench report</h1>",
             f"<p>{html.escape(run_line(results))}</p>", "<h2>Machine</h2>",
             _html_table(["", ""], [[k, v] for k, v in summary(results["machine"])]),
             "<h2>Headline</h2>", _html_table(*headline_rows(ts))]
    if "headline" in chart_paths:
        parts.append(f"<img src='{html.escape(chart_paths['headline'])}' alt='headline changes'>")
    for t in ts:
        parts += [f"<h2>{html.escape(t.title)}</h2>", f"<p>{_inline(t.method)}</p>",
                  f"<p>Unit: {html.escape(t.unit)}.</p>", _html_table(*table_rows(t))]
        parts += [_html_table(header, rows) for header, rows in t.extra]
        parts += [f"<p>{_inline(n)}</p>" for n in t.notes]
        if t.suite in chart_paths:
            parts.append(f"<img src='{html.escape(chart_paths[t.suite])}' alt='{t.suite}'>")
    failed = {k: v for k, v in results["suites"].items() if "error" in v}
    if failed:
        parts.append("<h2>Suites that failed</h2><ul>")
        parts += [f"<li><strong>{html.escape(k)}</strong>: {html.escape(v['error'])}</li>" for k, v in failed.items()]
        parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write(results: dict[str, Any], out: Path) -> dict[str, Path]:
    """report.md, report.html and charts/*.png into `out`; returns the files written."""
    made = charts(results, out / "charts")
    rel = {k: f"charts/{p.name}" for k, p in made.items()}
    (out / "report.md").write_text(markdown(results, rel))
    (out / "report.html").write_text(html_report(results, rel))
    return {"report.md": out / "report.md", "report.html": out / "report.html", **made}
