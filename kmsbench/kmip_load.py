"""`kms-bench kmip`: KMIP operations per second, Strongroom vs PyKMIP's bundled server,
same machine, same run, same client: Get, Create, a client's key lifecycle (Create →
Activate → Get → Revoke → Destroy, each waiting for the previous answer), Encrypt
(AES-CBC with PKCS#5 padding, 4 KiB: a mode both servers serve) and Sign (RSA-2048 PSS
with SHA-256 over 1 KiB).

* Strongroom: `keyserver serve` (one process) on a scratch PostgreSQL database with its
  own SoftHSM2 token; the client identity is issued by its CA.
* PyKMIP 0.11 `KmipServer` (SQLite, plaintext key storage, one global lock) with a server
  certificate from the same CA, so both accept the same client certificate.
* The load comes from a separate process: N threads, one TLS connection each, sending
  pre-encoded request messages back to back for a fixed time.

`kms-bench --suites kmip` runs it (in a child process) inside a whole report.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import psycopg
import typer
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from rich.console import Console
from sqlalchemy.engine import make_url

from kmsbench.errors import Exit
from kmsbench.keyserver_load import machine
from kmsbench.ports import free_port
from kmsbench.scratch import create_database, drop_database
from kmsbench.sections import write_section

console = Console(stderr=True)
SECTION = "kmip-bench"  # its marked section of docs/benchmarks.md
PYKMIP_SERVER = """
import sys
from kmip.services.server import KmipServer
d = sys.argv[1]
s = KmipServer(hostname="127.0.0.1", port=int(sys.argv[2]), certificate_path=d + "/server.pem",
               key_path=d + "/server.key", ca_path=d + "/ca.pem", auth_suite="TLS1.2", config_path=None,
               log_path=d + "/pykmip.log", enable_tls_client_auth=True, logging_level="WARNING",
               database_path=d + "/pykmip.db")
with s:
    s.serve()
"""



# --- the client side (runs in its own process) ---------------------------------------
def _context(files: dict[str, str]) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=files["ca"])
    ctx.check_hostname = True
    ctx.load_cert_chain(files["cert"], files["key"])
    return ctx


def _exchange(conn: ssl.SSLSocket, msg: bytes) -> bytes:
    conn.sendall(msg)
    buf = b""
    while len(buf) < 8:
        chunk = conn.recv(8 - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    need = struct.unpack("!I", buf[4:8])[0] + 8
    while len(buf) < need:
        chunk = conn.recv(need - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


OPS = ("get", "create", "lifecycle", "encrypt", "sign")
# Issue 14's targets: (operation, connections, minimum ratio to PyKMIP's server).
TARGETS = (("lifecycle", 8, 3.0), ("get", 50, 2.0))
ENCRYPT_BYTES, SIGN_BYTES = 4096, 1024


def _request(operation: str, uid: str | None) -> bytes:
    from kmip.core import enums
    from kmip.core.attributes import CryptographicParameters, UniqueIdentifier
    from kmip.core.factories.attributes import AttributeFactory
    from kmip.core.messages import contents, messages, payloads
    from kmip.core.objects import TemplateAttribute
    from kmip.core.utils import BytearrayStream

    f = AttributeFactory()
    if operation == "create":
        op = enums.Operation.CREATE
        payload = payloads.CreateRequestPayload(
            object_type=enums.ObjectType.SYMMETRIC_KEY,
            template_attribute=TemplateAttribute(attributes=[
                f.create_attribute(enums.AttributeType.CRYPTOGRAPHIC_ALGORITHM, enums.CryptographicAlgorithm.AES),
                f.create_attribute(enums.AttributeType.CRYPTOGRAPHIC_LENGTH, 256),
                f.create_attribute(enums.AttributeType.CRYPTOGRAPHIC_USAGE_MASK,
                                   [enums.CryptographicUsageMask.ENCRYPT, enums.CryptographicUsageMask.DECRYPT])]))
    elif operation == "activate":
        op, payload = enums.Operation.ACTIVATE, payloads.ActivateRequestPayload(UniqueIdentifier(uid))
    elif operation == "revoke":
        from kmip.core.objects import RevocationReason

        op, payload = enums.Operation.REVOKE, payloads.RevokeRequestPayload(
            unique_identifier=UniqueIdentifier(uid),
            revocation_reason=RevocationReason(code=enums.RevocationReasonCode.CESSATION_OF_OPERATION))
    elif operation == "destroy":
        op, payload = enums.Operation.DESTROY, payloads.DestroyRequestPayload(unique_identifier=UniqueIdentifier(uid))
    elif operation == "encrypt":
        op, payload = enums.Operation.ENCRYPT, payloads.EncryptRequestPayload(
            unique_identifier=uid, data=bytes(ENCRYPT_BYTES), cryptographic_parameters=CryptographicParameters(
                block_cipher_mode=enums.BlockCipherMode.CBC, padding_method=enums.PaddingMethod.PKCS5,
                cryptographic_algorithm=enums.CryptographicAlgorithm.AES))
    elif operation == "sign":
        op, payload = enums.Operation.SIGN, payloads.SignRequestPayload(
            unique_identifier=uid, data=bytes(SIGN_BYTES), cryptographic_parameters=CryptographicParameters(
                padding_method=enums.PaddingMethod.PSS, hashing_algorithm=enums.HashingAlgorithm.SHA_256,
                cryptographic_algorithm=enums.CryptographicAlgorithm.RSA))
    elif operation == "create_key_pair":
        masks = enums.AttributeType.CRYPTOGRAPHIC_USAGE_MASK
        op, payload = enums.Operation.CREATE_KEY_PAIR, payloads.CreateKeyPairRequestPayload(
            common_template_attribute=TemplateAttribute(attributes=[
                f.create_attribute(enums.AttributeType.CRYPTOGRAPHIC_ALGORITHM, enums.CryptographicAlgorithm.RSA),
                f.create_attribute(enums.AttributeType.CRYPTOGRAPHIC_LENGTH, 2048)],
                tag=enums.Tags.COMMON_TEMPLATE_ATTRIBUTE),
            private_key_template_attribute=TemplateAttribute(attributes=[
                f.create_attribute(masks, [enums.CryptographicUsageMask.SIGN])],
                tag=enums.Tags.PRIVATE_KEY_TEMPLATE_ATTRIBUTE),
            public_key_template_attribute=TemplateAttribute(attributes=[
                f.create_attribute(masks, [enums.CryptographicUsageMask.VERIFY])],
                tag=enums.Tags.PUBLIC_KEY_TEMPLATE_ATTRIBUTE))
    else:
        op, payload = enums.Operation.GET, payloads.GetRequestPayload(unique_identifier=uid)
    header = messages.RequestHeader(protocol_version=contents.ProtocolVersion(1, 2),
                                    batch_count=contents.BatchCount(1))
    stream = BytearrayStream()
    messages.RequestMessage(request_header=header, batch_items=[
        messages.RequestBatchItem(operation=contents.Operation(op), request_payload=payload)]).write(stream)
    return bytes(stream.buffer)


def _ok(response: bytes) -> bool:
    # Result Status Success (0) right after its TTLV header; cheaper than decoding.
    return bytes.fromhex("42007f050000000400000000") in response


def _uid_fast(response: bytes) -> str:
    """The first Unique Identifier (Text String) of a response, without decoding it all."""
    i = response.index(bytes.fromhex("42009407")) + 4
    n = struct.unpack("!I", response[i:i + 4])[0]
    return response[i + 4:i + 4 + n].decode()


def _refusal(response: bytes) -> str:
    """What a failed response says (result reason and message), for the report."""
    from kmip.core.messages import messages
    from kmip.core.utils import BytearrayStream

    try:
        r = messages.ResponseMessage()
        r.read(BytearrayStream(response))
        item = r.batch_items[0]
        reason = item.result_reason.value.name if item.result_reason else "?"
        return f"{reason}: {item.result_message.value if item.result_message else ''}"[:160]
    except Exception:  # the report says it could not tell
        return "an undecodable response"


def _lifecycle(conn: ssl.SSLSocket) -> bytes | None:
    """One key's life as a client drives it; None when done, else the failing response."""
    r = _exchange(conn, _request("create", None))
    if not _ok(r):
        return r
    uid = _uid_fast(r)
    for op in ("activate", "get", "revoke", "destroy"):
        r = _exchange(conn, _request(op, uid))
        if not _ok(r):
            return r
    return None


def _load(files: dict[str, str], port: int, msg: bytes | None, connections: int,
          seconds: float) -> tuple[int, int, str | None]:
    """(successes, failures, the first failure's reason) of `connections` clients sending
    `msg` back to back (None: a key lifecycle each turn) for `seconds`."""
    ctx = _context(files)
    counts = [0] * connections
    errors = [0] * connections
    first_error: list[str] = []
    start = threading.Barrier(connections + 1)
    stop_at = [0.0]

    def once(conn: ssl.SSLSocket) -> bytes | None:
        if msg is None:
            return _lifecycle(conn)
        r = _exchange(conn, msg)
        return None if _ok(r) else r

    _request("create", None)  # import PyKMIP's codec once, before threads race to (a circular import)

    def worker(i: int) -> None:
        try:
            conn = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=30),
                                   server_hostname="localhost")
            once(conn)  # warm the connection before the clock starts
        except BaseException as exc:
            first_error.append(f"set-up failed: {exc}")
            start.abort()  # the others (and the clock) must not wait for this one
            raise
        try:
            start.wait()
        except threading.BrokenBarrierError:
            conn.close()
            return
        while time.monotonic() < stop_at[0]:
            failed = once(conn)
            if failed is None:
                counts[i] += 1
            else:
                errors[i] += 1
                if not first_error:
                    first_error.append(_refusal(failed))
        conn.close()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(connections)]
    for t in threads:
        t.start()
    stop_at[0] = time.monotonic() + 3600
    try:
        start.wait()
    except threading.BrokenBarrierError:
        stop_at[0] = 0.0
        return 0, connections, first_error[0] if first_error else "a client could not start"
    stop_at[0] = time.monotonic() + seconds
    for t in threads:
        t.join(seconds + 60)
    return sum(counts), sum(errors), first_error[0] if first_error else None


def _load_in_process(files: dict[str, str], port: int, msg: bytes | None, connections: int,
                     seconds: float) -> tuple[float, str | None]:
    """(successes per second, the refusal when nothing succeeded). A hung server cannot
    hang the run: the round is given up after its time plus a minute."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        job = pool.apply_async(_load, (files, port, msg, connections, seconds))
        try:
            ok, errors, reason = job.get(timeout=seconds + 120)
        except multiprocessing.TimeoutError:
            console.print("[red]the round did not finish: the server stopped answering[/red]")
            return 0.0, "no answer (the server hung)"
    if errors:
        console.print(f"[yellow]{errors} failed requests ({reason})[/yellow]")
    return ok / seconds, (reason if ok == 0 else None)


def _uid_of(response: bytes) -> str:
    from kmip.core.messages import messages
    from kmip.core.utils import BytearrayStream

    r = messages.ResponseMessage()
    r.read(BytearrayStream(response))
    item = r.batch_items[0]
    if item.result_status.value.value != 0:
        raise SystemExit(f"benchmark set-up failed: {item.result_message.value}")
    return str(item.response_payload.unique_identifier)


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("a benchmark server exited during start-up")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("a benchmark server did not start listening")


def _wait_listeners(port: int, count: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Until `count` sockets listen on `port` (each worker binds its own, SO_REUSEPORT):
    connections made while one worker is still starting would all go to the others."""
    deadline = time.monotonic() + timeout
    needle = f":{port:04X} 00000000:0000 0A"  # local port, no peer, state LISTEN
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("a benchmark server exited during start-up")
        listening = sum(line.count(needle) for f in ("/proc/net/tcp", "/proc/net/tcp6")
                        if Path(f).exists() for line in Path(f).read_text().splitlines())
        if listening >= count:
            return
        time.sleep(0.2)
    raise SystemExit(f"only some of the {count} Strongroom workers started listening")


# --- the run ---------------------------------------------------------------------------
def _private_uid(response: bytes) -> str | None:
    from kmip.core.messages import messages
    from kmip.core.utils import BytearrayStream

    r = messages.ResponseMessage()
    r.read(BytearrayStream(response))
    item = r.batch_items[0]
    if item.result_status.value.value != 0:
        return None  # the Sign round reports the server's refusal
    return str(item.response_payload.private_key_unique_identifier)


def run(*, postgres: str, connections: list[int], duration: float, output: Path | None,
        json_out: Path | None, repeats: int = 3, ops: tuple[str, ...] = OPS, workers: int = 1) -> dict[str, Any]:
    from keyserver.core.principal import system_context
    from keyserver.services import build_services
    from keyserver.settings import Settings

    database_url = create_database(postgres, "kmipbench")
    data = Path(tempfile.mkdtemp(prefix="strongroom-kmipbench-"))
    kmip_port, pykmip_port = free_port(), free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("STRONGROOM_")},
           "STRONGROOM_DATA_DIR": str(data / "server"),
           "STRONGROOM_DATABASE_URL": database_url,
           "STRONGROOM_PORT": str(free_port()), "STRONGROOM_KMIP_PORT": str(kmip_port),
           "STRONGROOM_KMIP_MAX_CONNECTIONS": "256", "STRONGROOM_LOG_LEVEL": "WARNING",
           "STRONGROOM_DATABASE_POOL_SIZE": str(max(16, 64 // workers)), "STRONGROOM_HSM_POOL_SIZE": "16",
           "STRONGROOM_WORKERS": str(workers)}
    procs: list[subprocess.Popen[bytes]] = []
    results: dict[str, Any] = {"machine": machine(), "when": datetime.now(UTC).isoformat(timespec="seconds"),
                               "duration_s": duration, "repeats": repeats, "servers": {}, "ops": list(ops),
                               "workers": workers,
                               "load_before": os.getloadavg()[0]}
    try:
        os.environ.update({k: v for k, v in env.items() if k.startswith("STRONGROOM_")})
        services = build_services(Settings())
        services.initialize()
        issued = services.kmip_clients.create(system_context("bench"), name="bench-client", role="key-officer")
        # PyKMIP's TLS 1.2 suite offers RSA key exchange only: its server needs an RSA key.
        cert_pem, key = services.ca.issue_server([], common_name="PyKMIP server (benchmark peer)",
                                                 key=rsa.generate_private_key(public_exponent=65537, key_size=2048))
        # The token's own ceiling, same run, same token kind: each plaintext Get is one
        # RSA-2048 unwrap under the KEK, so no Get figure can pass it.
        from kmsbench.hsm_ceiling import measure_unwrap_ceiling

        results["hsm_unwrap"] = {str(t): round(measure_unwrap_ceiling(services.hsm, seconds=3, threads=t), 1)
                                 for t in (1, 2)}
        services.audit.flush()
        services.close()
        files = {"cert": str(data / "client.pem"), "key": str(data / "client.key"), "ca": str(data / "ca.pem")}
        Path(files["cert"]).write_text(issued.certificate_pem)
        Path(files["key"]).write_text(issued.private_key_pem or "")
        Path(files["ca"]).write_text(issued.ca_certificate_pem)
        (data / "server.pem").write_bytes(cert_pem)
        (data / "server.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption()))
        ours = subprocess.Popen([str(Path(sys.executable).with_name("keyserver")), "serve"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(ours)
        theirs = subprocess.Popen([sys.executable, "-c", PYKMIP_SERVER, str(data), str(pykmip_port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(theirs)
        servers = (("strongroom", kmip_port, ours), ("pykmip", pykmip_port, theirs))
        uids: dict[str, dict[str, str]] = {}
        for name, port, proc in servers:
            _wait_port(port, proc)
            if name == "strongroom":
                _wait_listeners(port, workers, proc)
            ctx = _context(files)
            with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=30),
                                 server_hostname="localhost") as tls:
                aes = _uid_of(_exchange(tls, _request("create", None)))
                _exchange(tls, _request("activate", aes))
                private = _private_uid(_exchange(tls, _request("create_key_pair", None)))
                if private is not None:
                    _exchange(tls, _request("activate", private))
                uids[name] = {"get": aes, "encrypt": aes, "sign": private or aes, "create": aes}
        # Interleaved (each figure of both servers, then the next round), so that the
        # machine's other load falls on both alike; medians and ranges are reported.
        runs: dict[str, dict[str, dict[str, list[float]]]] = {}
        refused: dict[str, dict[str, str]] = {}
        for round_no in range(repeats):
            for op in ops:
                for n in connections:
                    for name, port, _ in servers:
                        console.print(f"round {round_no + 1}/{repeats}: {name} {op} on {n} connection(s)…")
                        msg = None if op == "lifecycle" else _request(op, uids[name][op])
                        rate, reason = _load_in_process(files, port, msg, n, duration)
                        runs.setdefault(name, {}).setdefault(op, {}).setdefault(str(n), []).append(round(rate, 1))
                        if reason is not None:
                            refused.setdefault(name, {})[op] = reason
        results["refused"] = refused
        for name, measured in runs.items():
            results["servers"][name] = {op: {n: statistics.median(v) for n, v in per_n.items()}
                                        for op, per_n in measured.items()}
        results["runs"] = runs
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        drop_database(postgres, database_url)
        shutil.rmtree(data, ignore_errors=True)
    results["load_after"] = os.getloadavg()[0]
    report = render(results, connections)
    console.print(report)
    if json_out:
        json_out.write_text(json.dumps(results, indent=2))
    if output:
        write_section(output, report, name=SECTION)
    return results


NOTE = (
    "Per Get, Strongroom checks the client certificate against its identity and revocation (a per-replica "
    "cache invalidated by PostgreSQL NOTIFY), finds the key version (cached the same way), unwraps it under the "
    "KEK inside the HSM (one RSA-2048 OAEP private-key operation) and commits the audit record before "
    "answering (concurrent Gets share one INSERT): one database round trip and one HSM RSA operation, plus the "
    "audit chainer's HMAC (in the HSM) per record in the background. PyKMIP's server reads the plaintext key "
    "from SQLite under one global lock, with no HSM, no revocation check and no audit. Per Create, Strongroom "
    "generates the key in the HSM, wraps it under the KEK and commits key, version and audit record in one "
    "transaction (KeyService.create: five statements, a commit and a reload). The load generator, both "
    "servers and PostgreSQL share the machine's two cores."
)


def render(r: dict[str, Any], connections: list[int]) -> str:
    m = r["machine"]
    lines = [
        "## KMIP: Strongroom vs PyKMIP's bundled server",
        "",
        f"Measured {r['when']} on {m['cpu']} ({m['cores']} cores, {m['memory_gib']} GiB), client and servers "
        f"on the same machine; {r.get('repeats', 1)} interleaved rounds of {r['duration_s']} s per figure, "
        "median (min-max), one TLS connection per client thread. "
        f"Strongroom ran `keyserver serve` with {r.get('workers', 1)} worker process(es) sharing the KMIP port "
        "(STRONGROOM_WORKERS, one per core as deployed on PostgreSQL); PyKMIP's server is one process by design "
        "(one global lock). "
        "Command: `.venv/bin/kms-bench kmip --output docs/benchmarks.md`.",
        "",
        f"Load average (1 min) before/after the run: {r.get('load_before', 0):.1f} / {r.get('load_after', 0):.1f} "
        "(other work on the machine affects both servers alike).",
        "",
        "| operation | connections | Strongroom ops/s | PyKMIP 0.11 server ops/s | Strongroom / PyKMIP |",
        "|---|--:|--:|--:|--:|",
    ]
    s, p = r["servers"].get("strongroom", {}), r["servers"].get("pykmip", {})
    runs = r.get("runs", {})

    refused = r.get("refused", {})

    def cell(name: str, op: str, n: int) -> str:
        median = r["servers"].get(name, {}).get(op, {}).get(str(n))
        if not median and op in refused.get(name, {}):
            return f"refused ({refused[name][op]})"
        if median is None:
            return "-"
        values = runs.get(name, {}).get(op, {}).get(str(n), [])
        return f"{median:.0f} ({min(values):.0f}-{max(values):.0f})" if len(values) > 1 else f"{median:.0f}"

    labels = {"get": "Get", "create": "Create", "lifecycle": "Lifecycle (Create→Activate→Get→Revoke→Destroy)",
              "encrypt": f"Encrypt (AES-CBC-PKCS5, {ENCRYPT_BYTES} B)", "sign": f"Sign (RSA-2048 PSS, {SIGN_BYTES} B)"}
    for op in r.get("ops", ["get", "create"]):
        for n in connections:
            ours, theirs = s.get(op, {}).get(str(n)), p.get(op, {}).get(str(n))
            ratio = f"{ours / theirs:.2f}x" if ours and theirs else "-"
            lines.append(f"| {labels.get(op, op)} | {n} | {cell('strongroom', op, n)} | {cell('pykmip', op, n)} | "
                         f"{ratio} |")
    targets = [(op, n, want) for op, n, want in TARGETS if op in r.get("ops", []) and n in connections]
    if targets:
        lines += ["", "| target | measured | met |", "|---|--:|:-:|"]
        for op, n, want in targets:
            ours, theirs = s.get(op, {}).get(str(n)), p.get(op, {}).get(str(n))
            got = ours / theirs if ours and theirs else None
            lines.append(f"| {labels.get(op, op)} at {n} connections ≥ {want:g}x PyKMIP | "
                         f"{f'{got:.2f}x' if got is not None else '-'} | "
                         f"{'yes' if got is not None and got >= want else 'no'} |")
    ceiling = r.get("hsm_unwrap")
    if ceiling:
        pykmip_get = max((float(v) for v in p.get("get", {}).values()), default=0.0)
        lines += ["", f"HSM ceiling in the same run (SoftHSM2, RSA-2048 OAEP unwrap + destroy, nothing else): "
                  f"{ceiling.get('1', '-')}/s on 1 thread, {ceiling.get('2', '-')}/s on 2 threads. "
                  f"Five times PyKMIP's best Get figure would be {5 * pykmip_get:.0f}/s."]
    lines += ["", NOTE]
    return "\n".join(lines)


def _check_connection_slots(postgres: str, connections: int) -> None:
    """Every KMIP connection is a server thread that may hold a database connection (the
    benchmark's pool: 64 + 32 overflow): refuse before starting rather than take the
    last slots of a PostgreSQL server that others share."""
    url = make_url(postgres)
    try:
        with psycopg.connect(host=url.host, port=url.port or 5432, user=url.username, password=url.password,
                             dbname=url.database or "postgres", connect_timeout=5) as conn:
            row = conn.execute("SELECT current_setting('max_connections')::int - (SELECT count(*) FROM "
                               "pg_stat_activity)").fetchone()
    except psycopg.Error as exc:
        console.print(f"[red]cannot reach PostgreSQL at {url.render_as_string()}[/red]: {exc}")
        raise typer.Exit(Exit.SERVICE) from None
    free, needed = int(row[0]) if row else 0, min(connections, 96) + 10
    if free < needed:
        console.print(f"[red]PostgreSQL at {url.render_as_string()} has {free} free connection slots[/red]; "
                      f"{connections} KMIP connections may take up to {needed}: pass --postgres with a server of "
                      "its own (more max_connections), or fewer --connections")
        raise typer.Exit(Exit.SERVICE)


app = typer.Typer(add_completion=False)


@app.command()
def bench_kmip(
    postgres: Annotated[str, typer.Option(help="PostgreSQL server URL (a scratch database is created)")] =
        "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    connections: Annotated[str, typer.Option(help="comma-separated concurrent connection counts")] = "1,8,50",
    ops: Annotated[str, typer.Option(help=f"comma-separated rounds among {','.join(OPS)}")] = ",".join(OPS),
    duration: Annotated[float, typer.Option(min=1, help="seconds per measurement")] = 5,
    repeats: Annotated[int, typer.Option(min=1, help="interleaved rounds per figure (median and spread)")] = 3,
    output: Annotated[Path | None, typer.Option(help="Markdown file whose KMIP section is rewritten")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="raw results as JSON")] = None,
    workers: Annotated[int, typer.Option(min=1, max=64, help="Strongroom worker processes (STRONGROOM_WORKERS); "
                                         "default: one per core, as deployed")] = os.cpu_count() or 1,
) -> None:
    """KMIP operations per second, Strongroom vs PyKMIP's bundled server, in one run."""
    chosen = tuple(o.strip() for o in ops.split(",") if o.strip())
    unknown = set(chosen) - set(OPS)
    if unknown or not chosen:
        console.print(f"[red]unknown rounds {sorted(unknown)}[/red]: choose among {', '.join(OPS)}")
        raise typer.Exit(Exit.USAGE)
    _check_connection_slots(postgres, max(int(c) for c in connections.split(",")))
    # SIGTERM unwinds like Ctrl-C, so that run() stops both servers and drops its database
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    run(postgres=postgres, connections=[int(c) for c in connections.split(",")], duration=duration,
        output=output, json_out=json_out, repeats=repeats, ops=chosen, workers=workers)


def main(argv: list[str] | None = None) -> None:
    app(args=argv, prog_name="kms-bench kmip")


if __name__ == "__main__":
    main()
