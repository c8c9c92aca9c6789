"""The offline verifier (tools/verify_audit_offline.py) run as an auditor runs it: on an
export, the checkpoints and the public key fetched from a real server over REST, with a
real zero-use statement made by retiring a version; then on copies of those files
tampered with, each refused with the problem named. And `verify-audit` (the server's own
verifier) on the same statements, in a store of its own where a version is used after
its statement."""

from __future__ import annotations

import ast
import base64
import copy
import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from sqlalchemy import select

from hsm import HsmBackend
from keyserver.core.audit import canonical_checkpoint, checkpoint_digest, key_fingerprint
from keyserver.core.audit.record import parse_iso
from keyserver.core.audit.statements import RETIRED_ACTION, STATEMENT_TYPE, canonical_statement
from keyserver.core.keys import KeySpec
from keyserver.core.principal import system_context
from keyserver.services import Services
from keyserver.store.models import AuditEvent, KeyVersion
from tests.api.sessions import session
from tests.api.test_health_and_faults import serve
from tests.conftest import own_services, own_store, unique

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "verify_audit_offline.py"
PASSWORD = "a long enough passphrase 1"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("verify_audit_offline", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_script_stands_alone() -> None:
    """An auditor reads one file: it imports the standard library and cryptography only."""
    tree = ast.parse(SCRIPT.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported - set(sys.stdlib_module_names) == {"cryptography"}


def test_its_canonical_forms_are_the_servers(services: Services) -> None:
    offline = _script()
    statement = {"type": STATEMENT_TYPE, "key_id": "k", "key": "paiements-é", "version": 3, "counts": {"b": 0, "a": 0},
                 "excluded": [{"kind": "kmip_client", "holder": "x", "reason": "décommissionné", "by": "ø"}],
                 "chain": {"seq": 7, "hash": "ab" * 32}, "signing_key": "cd" * 32}
    assert offline.canonical_statement(statement) == canonical_statement(statement)
    services.audit.record_now(system_context("tests"), action="test.offline_canonical", outcome="allowed")
    services.audit.flush()
    checkpoints = services.audit.checkpoints()
    assert checkpoints, "the session's chain has a checkpoint (the first record makes one)"
    for c in checkpoints[:3]:
        ours = canonical_checkpoint(number=c["checkpoint"], seq=c["seq"], hash=c["hash"], time=parse_iso(c["time"]),
                                    prev=c["prev"], key=c["key"])
        assert offline.canonical_checkpoint(c) == ours
        # As the REST API gives it (pydantic may drop zero microseconds): the same bytes.
        assert offline.canonical_checkpoint({**c, "time": c["time"].replace(".000000Z", "Z")}) == ours
        assert offline.checkpoint_digest(c) == checkpoint_digest(c)


# --- against the session's server ------------------------------------------------------

@pytest.fixture(scope="module")
def exported(actors: dict[str, Any], services: Services, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A version retired through REST (its data key re-encrypted, the statement written),
    a use of the newer version after it, then the three files an auditor fetches. Once
    for the module: each test reads them or tampers with copies."""
    admin: httpx.Client = actors["admin"].client
    tmp_path = tmp_path_factory.mktemp("offline")
    name = unique("offline")
    r = admin.post("/api/v1/keys", json={"name": name})
    assert r.status_code == 201, r.text
    key_id = r.json()["id"]
    r = admin.post(f"/api/v1/keys/{name}/generate-data-key", json={})
    assert r.status_code == 200 and r.json()["key_version"] == 1, r.text
    blob = r.json()["ciphertext_blob"]
    assert admin.post(f"/api/v1/keys/{name}/rotate", json={}).status_code == 200
    r = admin.post(f"/api/v1/keys/{name}/versions/1/retire", json={"reason": "offline verification test"})
    assert r.status_code == 201, r.text
    assert admin.post("/api/v1/datakeys/reencrypt", json={"ciphertext_blob": blob}).status_code == 200
    r = admin.get(f"/api/v1/keys/{name}/versions/1/inventory")  # completes the retirement: zero in use
    assert r.status_code == 200 and r.json()["retirement"]["state"] == "complete", r.text
    r = admin.post(f"/api/v1/keys/{name}/encrypt", json={"plaintext": base64.b64encode(b"after").decode()})
    assert r.status_code == 200 and r.json()["version"] == 2, r.text
    services.audit.flush()
    # Checkpoints first: the export then reaches every one of them.
    pages, after = [], 0
    while True:
        r = admin.get("/api/v1/audit/checkpoints", params={"after": after})
        assert r.status_code == 200, r.text
        if not r.json():
            break
        pages.append(r.text)
        after = r.json()[-1]["checkpoint"]
    (tmp_path / "checkpoints.json").write_text("".join(pages))  # the pages concatenated, as documented
    r = admin.get("/api/v1/audit/status")
    assert r.status_code == 200
    (tmp_path / "status.json").write_text(r.text)
    r = admin.get("/api/v1/audit/export", params={"format": "jsonl"})
    assert r.status_code == 200
    (tmp_path / "audit.jsonl").write_text(r.text)
    records = [json.loads(line) for line in r.text.splitlines()]
    statement = next(x for x in records if x["action"] == RETIRED_ACTION and x["object_id"] == key_id)
    use = next(x for x in records if x["action"] == "key.encrypt" and x["object_id"] == key_id)
    assert use["seq"] > statement["seq"]
    return {"dir": tmp_path, "name": name, "key_id": key_id, "records": records, "statement": statement, "use": use,
            "checkpoints": json.loads("[" + ",".join(p.strip()[1:-1] for p in pages) + "]")}


def _run(d: Path, export: str = "audit.jsonl", checkpoints: str = "checkpoints.json",
         public_key: str = "status.json") -> subprocess.CompletedProcess[str]:
    # -I: isolated, and run from the files' directory, as an auditor would.
    return subprocess.run([sys.executable, "-I", str(SCRIPT), "--export", export, "--checkpoints", checkpoints,
                           "--public-key", public_key], cwd=d, capture_output=True, text=True, timeout=300)


def _write(d: Path, name: str, records: list[dict[str, Any]]) -> str:
    (d / name).write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))
    return name


def test_an_export_verifies_offline(exported: dict[str, Any], admin: httpx.Client, services: Services) -> None:
    d, st = exported["dir"], exported["statement"]
    # The server's own verifier, through the service and REST, agrees.
    assert services.audit.verify(full=True).statements >= 1
    r = admin.post("/api/v1/audit/verify", json={"full": True})
    assert r.status_code == 200 and r.json()["ok"] is True, r.text
    assert r.json()["statements"] >= 1 and r.json()["problems"] == [], r.text
    done = _run(d)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (f"zero-use statement in record {st['seq']}: key '{exported['name']}' ({exported['key_id']}) "
            "version 1 — signed, no later use") in done.stdout
    assert f"{exported['records'][-1]['seq']} records linked from record 1" in done.stdout
    # The PEM alone does as well as the status document.
    (d / "audit.pem").write_text(json.loads((d / "status.json").read_text())["public_key_pem"])
    assert _run(d, public_key="audit.pem").returncode == 0


def _problems(done: subprocess.CompletedProcess[str]) -> list[str]:
    assert done.returncode == 1, done.stdout + done.stderr
    return [line.removeprefix("PROBLEM: ") for line in done.stdout.splitlines() if line.startswith("PROBLEM: ")]


def test_a_changed_statement_is_refused(exported: dict[str, Any]) -> None:
    d, records, st = exported["dir"], copy.deepcopy(exported["records"]), exported["statement"]
    changed = next(r for r in records if r["seq"] == st["seq"])
    changed["details"]["statement"]["counts"]["data_keys"] += 1  # "one blob was left": still signed?
    assert _problems(_run(d, export=_write(d, "changed.jsonl", records))) == [
        f"zero-use statement in record {st['seq']}: the statement's signature does not verify"]


def test_a_later_use_of_the_retired_version_is_refused(exported: dict[str, Any]) -> None:
    d, records, use = exported["dir"], copy.deepcopy(exported["records"]), exported["use"]
    next(r for r in records if r["seq"] == use["seq"])["details"]["version"] = 1
    assert _problems(_run(d, export=_write(d, "used.jsonl", records))) == [
        f"record {use['seq']} (key.encrypt) uses version 1 of key '{exported['name']}' after its zero-use "
        f"statement (record {exported['statement']['seq']})"]


def test_a_dropped_record_is_refused(exported: dict[str, Any]) -> None:
    d, records, st = exported["dir"], exported["records"], exported["statement"]
    gone = st["seq"] - 2  # the re-encryption that emptied the version, say
    kept = [r for r in records if r["seq"] != gone]
    assert _problems(_run(d, export=_write(d, "dropped.jsonl", kept))) == [
        f"record {gone} is missing (the export goes from record {gone - 1} to {gone + 1})"]
    # Dropped and the rest renumbered to hide the gap: the links no longer hold.
    renumbered = [{**r, "seq": r["seq"] - 1} if r["seq"] > gone else r for r in kept]
    problems = _problems(_run(d, export=_write(d, "renumbered.jsonl", renumbered)))
    assert f"record {gone} does not link to record {gone - 1}: a record before it was removed, " \
           "replaced or inserted" in problems


def test_a_rewritten_or_cut_chain_is_refused(exported: dict[str, Any]) -> None:
    d, records, cps = exported["dir"], copy.deepcopy(exported["records"]), exported["checkpoints"]
    last = cps[-1]
    signed = next(r for r in records if r["seq"] == last["seq"])
    signed["hash"] = "f" * 64  # a record "re-hashed" after it was signed for
    problems = _problems(_run(d, export=_write(d, "rehashed.jsonl", records)))
    assert f"record {last['seq']} is not the one checkpoint {last['checkpoint']} signed" in problems
    # The tail cut off before the last checkpoint.
    cut = [r for r in exported["records"] if r["seq"] < last["seq"]]
    assert f"checkpoint {last['checkpoint']} names record {last['seq']}, past the export's last record " \
           f"{last['seq'] - 1}: the export is cut off, or older than the checkpoints (fetch them first)" in \
           _problems(_run(d, export=_write(d, "cut.jsonl", cut)))


def test_a_changed_checkpoint_or_another_key_is_refused(exported: dict[str, Any]) -> None:
    d, cps = exported["dir"], copy.deepcopy(exported["checkpoints"])
    cps[0]["time"] = "2020-01-01T00:00:00.000000Z"
    (d / "changed-cps.json").write_text(json.dumps(cps))
    assert "checkpoint 1's signature does not verify" in _problems(_run(d, checkpoints="changed-cps.json"))
    (d / "gap-cps.json").write_text(json.dumps(exported["checkpoints"][1:]))
    if len(exported["checkpoints"]) > 1:
        assert any(p.startswith("checkpoint 1 is missing") for p in _problems(_run(d, checkpoints="gap-cps.json")))
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    (d / "other.pem").write_bytes(other.public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    problems = _problems(_run(d, public_key="other.pem"))
    assert any("is signed by another key" in p for p in problems)
    assert f"zero-use statement in record {exported['statement']['seq']}: the statement is signed by another key " \
           f"({exported['statement']['details']['statement']['signing_key'][:16]}…)" in problems


def test_unreadable_inputs_exit_2(exported: dict[str, Any]) -> None:
    d = exported["dir"]
    (d / "garbage.jsonl").write_text("{not json\n")
    done = _run(d, export="garbage.jsonl")
    assert done.returncode == 2 and "not JSON" in done.stderr
    done = _run(d, public_key="checkpoints.json")
    assert done.returncode == 2 and "not a PEM public key" in done.stderr


# --- the server's own verifier, on a store of its own ------------------------------------

@pytest.fixture
def store(services: Services, hsm_backend: HsmBackend, tmp_path: Path) -> Iterator[Services]:
    """A use after a statement breaks verify-audit for good: not on the session's chain."""
    with own_services(tmp_path / "data", hsm_backend, audit_checkpoint_records=5,
                      audit_checkpoint_seconds=3600) as svc:
        yield svc


def _state(svc: Services, key_id: str, version: int, *, sign: bool = True,
           chain: dict[str, Any] | None = None) -> dict[str, Any]:
    """A statement for the version signed in the HSM with the checkpoint key, as the
    retirement flow writes it (RetirementService._try_complete)."""
    svc.audit.flush()
    with svc.db() as s:
        head, head_hash = s.execute(select(AuditEvent.seq, AuditEvent.hash).order_by(AuditEvent.seq.desc())
                                    .limit(1)).one()
    statement = {"type": STATEMENT_TYPE, "key_id": key_id, "key": "own", "version": version, "retirement": "r",
                 "counts": {"data_keys": 0}, "chain": chain or {"seq": head, "hash": head_hash},
                 "signing_key": key_fingerprint(svc.audit.public_key_der())}
    signature, fingerprint = svc.audit.sign_statement(canonical_statement(statement))
    assert fingerprint == statement["signing_key"]
    if not sign:
        signature = base64.b64encode(b"\x30\x06\x02\x01\x01\x02\x01\x01").decode()
    return {"version": version, "statement": statement, "signature": signature}


def _seqs(svc: Services, action: str, object_id: str) -> list[int]:
    svc.audit.flush()
    with svc.db() as s:
        return list(s.execute(select(AuditEvent.seq).where(AuditEvent.action == action,
                                                            AuditEvent.object_id == object_id)
                              .order_by(AuditEvent.seq)).scalars())


def test_verify_audit_checks_statements_and_later_uses(store: Services) -> None:
    ctx = system_context("tests")
    key = store.keys.create(ctx, KeySpec(name=unique("own")))
    old = store.datakeys.generate(ctx, str(key.id))
    store.keys.rotate(ctx, str(key.id))
    store.audit.record_now(ctx, action=RETIRED_ACTION, outcome="allowed", object_type="key", object_id=str(key.id),
                           details=_state(store, str(key.id), 1))
    result = store.audit.verify()
    assert result.ok and result.statements == 1, result
    # A use of the newer version and a refused use of the retired one do not break it.
    store.datakeys.generate(ctx, str(key.id))
    assert store.audit.verify().ok
    # Reading a data key sealed under the retired version does.
    store.datakeys.decrypt(ctx, old.blob)
    stated, used = _seqs(store, RETIRED_ACTION, str(key.id))[0], _seqs(store, "datakey.decrypt", str(key.id))[0]
    result = store.audit.verify()
    assert not result.ok and result.statements == 1
    assert result.problems == ((used, f"record {used} (datakey.decrypt) uses version 1 of key 'own' after its "
                                      f"zero-use statement (record {stated})"),)
    assert (result.first_broken_seq, result.reason) == result.problems[0]
    # Not recorded as verified: the next incremental run and a full one say it again.
    assert store.audit.verify().reason == result.reason
    assert store.audit.verify(full=True).reason == result.reason


def test_the_rest_verify_names_the_statements_and_each_problem(store: Services) -> None:
    """What `verify-audit` prints, over REST: the statements counted, each problem by record."""
    ctx = system_context("tests")
    store.identity.create_user(ctx, username="auditor", role="auditor", password=PASSWORD)
    key = store.keys.create(ctx, KeySpec(name=unique("own")))
    old = store.datakeys.generate(ctx, str(key.id))
    store.keys.rotate(ctx, str(key.id))
    store.audit.record_now(ctx, action=RETIRED_ACTION, outcome="allowed", object_type="key", object_id=str(key.id),
                           details=_state(store, str(key.id), 1))
    with serve(store) as url, session(url, "auditor", PASSWORD) as auditor:
        r = auditor.post("/api/v1/audit/verify", json={"full": True})
        assert r.status_code == 200, r.text
        assert {k: r.json()[k] for k in ("ok", "statements", "problems")} == {
            "ok": True, "statements": 1, "problems": []}
        store.datakeys.decrypt(ctx, old.blob)
        store.datakeys.decrypt(ctx, old.blob)
        stated = _seqs(store, RETIRED_ACTION, str(key.id))[0]
        used = _seqs(store, "datakey.decrypt", str(key.id))
        r = auditor.post("/api/v1/audit/verify", json={})
        assert r.status_code == 200, r.text
        said = r.json()
        assert not said["ok"] and said["statements"] == 1
        assert said["problems"] == [
            {"seq": seq, "reason": f"record {seq} (datakey.decrypt) uses version 1 of key 'own' after its zero-use "
                                   f"statement (record {stated})"} for seq in used]
        assert (said["first_broken_seq"], said["reason"]) == (used[0], said["problems"][0]["reason"])


def test_verify_audit_refuses_a_forged_or_moved_statement_and_an_unwrap(store: Services) -> None:
    ctx = system_context("tests")
    key = store.keys.create(ctx, KeySpec(name=unique("own")))
    store.keys.rotate(ctx, str(key.id))
    store.audit.record_now(ctx, action=RETIRED_ACTION, outcome="allowed", object_type="key", object_id=str(key.id),
                           details=_state(store, str(key.id), 1, sign=False))
    store.audit.record_now(ctx, action=RETIRED_ACTION, outcome="allowed", object_type="key", object_id=str(key.id),
                           details=_state(store, str(key.id), 1, chain={"seq": 1, "hash": "ab" * 32}))
    # A key registered wrapped under the retired version (KMIP Register names it by its id).
    with store.db() as s:
        uid = str(s.execute(select(KeyVersion.id).where(KeyVersion.key_id == key.id, KeyVersion.version == 1))
                  .scalar_one())
    store.audit.record_now(ctx, action="key.create", outcome="allowed", object_type="key", object_id="a-new-key",
                           details={"version": 1, "unwrapped_by": uid})
    result = store.audit.verify()
    assert not result.ok and result.statements == 2
    first, second = (seq for seq, _ in result.problems[:2])
    assert [what for _, what in result.problems] == [
        f"zero-use statement in record {first}: the statement's signature does not verify",
        f"zero-use statement in record {second}: the statement's chain position (record 1) is not a record "
        "before it with that hash: it was moved or the chain rewritten",
        f"record {second + 1} (key.create) uses version 1 of key 'own' after its zero-use statement "
        f"(record {first})",
        f"record {second + 1} (key.create) uses version 1 of key 'own' after its zero-use statement "
        f"(record {second})",
    ]


# --- the command, as an operator runs it -------------------------------------------------

# Run in a process of its own on the command's data directory (SoftHSM2 reads its
# configuration once per process: this one's is the session's token).
_RETIRE_THEN_USE = """
import sys
from keyserver.core.audit import key_fingerprint
from keyserver.core.audit.statements import RETIRED_ACTION, STATEMENT_TYPE, canonical_statement
from keyserver.core.keys import KeySpec
from keyserver.core.principal import system_context
from keyserver.services import build_services
from keyserver.settings import Settings

svc = build_services(Settings())
try:
    ctx = system_context("tests")
    key = svc.keys.create(ctx, KeySpec(name="cli-retired"))
    old = svc.datakeys.generate(ctx, str(key.id))
    svc.keys.rotate(ctx, str(key.id))
    svc.audit.flush()
    head = svc.audit.chain_state()["head_seq"]
    from keyserver.store.models import AuditEvent
    with svc.db() as s:
        head_hash = s.get(AuditEvent, head).hash
    statement = {"type": STATEMENT_TYPE, "key_id": str(key.id), "key": key.name, "version": 1, "retirement": "r",
                 "counts": {"data_keys": 0}, "chain": {"seq": head, "hash": head_hash},
                 "signing_key": key_fingerprint(svc.audit.public_key_der())}
    signature, _ = svc.audit.sign_statement(canonical_statement(statement))
    svc.audit.record_now(ctx, action=RETIRED_ACTION, outcome="allowed", object_type="key", object_id=str(key.id),
                         details={"version": 1, "statement": statement, "signature": signature})
    svc.audit.flush()
    if sys.argv[1] == "use":
        svc.datakeys.decrypt(ctx, old.blob)
    svc.audit.flush()
finally:
    svc.close()
"""


@pytest.mark.store
@pytest.mark.slow
@pytest.mark.parametrize("use", [False, True])
def test_the_command_says_what_it_checked_and_what_broke(tmp_path: Path, use: bool) -> None:
    from tests.serve import KEYSERVER, free_port, server_env

    with own_store() as url:
        env = server_env(tmp_path / "data", free_port(), **({"STRONGROOM_DATABASE_URL": url} if url else {}))

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=300, check=False)

        assert run(KEYSERVER, "init").returncode == 0
        made = run(sys.executable, "-c", _RETIRE_THEN_USE, "use" if use else "none")
        assert made.returncode == 0, made.stderr
        done = run(KEYSERVER, "verify-audit")
        said = " ".join((done.stdout + done.stderr).split())
        if not use:
            assert done.returncode == 0, said
            assert "zero-use statements: 1 signed by the checkpoint key, no later use of their versions" in said
        else:
            assert done.returncode == 3, said
            assert "zero-use statement BROKEN: record" in said and "(datakey.decrypt) uses version 1 of key " \
                   "'cli-retired' after its zero-use statement (record" in said
