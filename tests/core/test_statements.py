"""Zero-use statements (decision 0024): the signature refuses every changed field, and
`uses_version` knows every action the server writes that uses a key version's material —
checked against the code itself, so a new use cannot be added without deciding here."""

from __future__ import annotations

import ast
import base64
import copy
import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from keyserver.core.audit.statements import (
    RETIRED_ACTION,
    STATEMENT_TYPE,
    UID_FIELDS,
    USE_ACTIONS,
    VERSION_FIELDS,
    UseWatch,
    canonical_statement,
    statement_problem,
    uses_version,
)

ROOT = Path(__file__).resolve().parents[2]
KEY = "6f1c8a52-3d9e-4b7a-9c0d-2e5f7a8b9c01"
UID = "0d4b1f9e-8c7a-4e3b-a2d1-5f6e7d8c9b0a"


def _fingerprint(public: ec.EllipticCurvePublicKey) -> str:
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def _statement(fingerprint: str) -> dict[str, Any]:
    return {"type": STATEMENT_TYPE, "key_id": KEY, "key": "payments", "version": 1,
            "retirement": "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d", "requested_at": "2026-11-26T10:00:00.000000Z",
            "completed_at": "2026-11-26T11:00:00.000000Z",
            "initial": {"data_keys": 120, "guard_point_files": 5400, "volumes": 2, "databases": 1,
                        "xks_stores": 0, "kmip_clients": 1},
            "counts": {"data_keys": 0, "guard_point_files": 0, "volumes": 0, "databases": 0,
                       "xks_stores": 0, "kmip_clients": 0},
            "excluded": [{"kind": "kmip_client", "holder": "backup-appliance", "reason": "decommissioned",
                          "by": "alice"}],
            "hosts": ["host-a", "host-b"], "chain": {"seq": 81234, "hash": "ab" * 32},
            "signing_key": fingerprint}


@pytest.fixture(scope="module")
def signer() -> tuple[ec.EllipticCurvePrivateKey, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    return key, _fingerprint(key.public_key())


def _signed(key: ec.EllipticCurvePrivateKey, statement: dict[str, Any]) -> dict[str, Any]:
    signature = key.sign(canonical_statement(statement), ec.ECDSA(hashes.SHA256()))
    return {"version": statement["version"], "statement": statement,
            "signature": base64.b64encode(signature).decode()}


def test_a_signed_statement_verifies(signer: tuple[ec.EllipticCurvePrivateKey, str]) -> None:
    key, fingerprint = signer
    assert statement_problem(_signed(key, _statement(fingerprint)), key.public_key(), fingerprint) is None


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every leaf of a statement, as a path of keys and indexes."""
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in _paths(v, (*prefix, k))]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc) for p in _paths(v, (*prefix, i))]
    return [prefix]


def _changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    return str(value) + "x"


def test_every_field_of_the_statement_is_covered(signer: tuple[ec.EllipticCurvePrivateKey, str]) -> None:
    key, fingerprint = signer
    good = _signed(key, _statement(fingerprint))
    leaves = _paths(good["statement"])
    assert len(leaves) > 20  # the walk reached the nested counts and exclusions
    for path in leaves:
        details = copy.deepcopy(good)
        node = details["statement"]
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = _changed(node[path[-1]])
        if path == ("version",):
            details["version"] = node["version"]  # the record agrees: only the signature can tell
        assert statement_problem(details, key.public_key(), fingerprint) is not None, path


def test_added_and_removed_fields_are_refused(signer: tuple[ec.EllipticCurvePrivateKey, str]) -> None:
    key, fingerprint = signer
    good = _signed(key, _statement(fingerprint))
    added = copy.deepcopy(good)
    added["statement"]["counts"]["data_keys_elsewhere"] = 7
    removed = copy.deepcopy(good)
    del removed["statement"]["excluded"]
    for details in (added, removed):
        assert statement_problem(details, key.public_key(), fingerprint) == \
            "the statement's signature does not verify"


@pytest.mark.parametrize(("change", "problem"), [
    (lambda d: d.update(version=2), "the statement names another version than its record"),
    (lambda d: d.update(signature=base64.b64encode(b"\x30\x06\x02\x01\x01\x02\x01\x01").decode()),
     "the statement's signature does not verify"),
    (lambda d: d.update(signature="not base64!"), "the statement is malformed"),
    (lambda d: d.pop("signature"), "the statement is malformed"),
    (lambda d: d.pop("statement"), "the statement is malformed"),
    (lambda d: d.update(statement="a string"), "the statement is malformed"),
    (lambda d: d["statement"].update(type="strongroom.something-else.v1"),
     f"the statement's type is not {STATEMENT_TYPE}"),
])
def test_a_broken_record_says_why(signer: tuple[ec.EllipticCurvePrivateKey, str], change: Any, problem: str) -> None:
    key, fingerprint = signer
    details = _signed(key, _statement(fingerprint))
    change(details)
    assert statement_problem(details, key.public_key(), fingerprint) == problem


def test_another_key_is_refused(signer: tuple[ec.EllipticCurvePrivateKey, str]) -> None:
    key, fingerprint = signer
    other = ec.generate_private_key(ec.SECP256R1())
    # Signed by another key that names itself: refused by name, before any signature check.
    theirs = _signed(other, _statement(_fingerprint(other.public_key())))
    assert "signed by another key" in str(statement_problem(theirs, key.public_key(), fingerprint))
    # Signed by another key that names ours: the signature does not verify.
    forged = _signed(other, _statement(fingerprint))
    assert statement_problem(forged, key.public_key(), fingerprint) == "the statement's signature does not verify"


# --- what "uses the version" means ---------------------------------------------------

def _record(action: str, details: dict[str, Any], *, outcome: str = "allowed", object_type: str = "key",
            object_id: str = KEY) -> dict[str, Any]:
    return {"seq": 10, "action": action, "outcome": outcome, "object_type": object_type, "object_id": object_id,
            "details": details}


@pytest.mark.parametrize("action", sorted(VERSION_FIELDS))
def test_each_use_action_names_its_version(action: str) -> None:
    for field in VERSION_FIELDS[action]:
        assert uses_version(_record(action, {field: 1}), KEY, 1)
        assert not uses_version(_record(action, {field: 2}), KEY, 1)
        assert not uses_version(_record(action, {field: 1}, outcome="denied"), KEY, 1)
        assert not uses_version(_record(action, {field: 1}, outcome="error"), KEY, 1)
        assert not uses_version(_record(action, {field: 1}, object_id="another-key"), KEY, 1)
        assert not uses_version(_record(action, {field: 1}, object_type="private_key"), KEY, 1)


def test_uses_version_edge_cases() -> None:
    assert uses_version(_record("datakey.reencrypt", {"from_version": 1, "to_version": 2}), KEY, 1)
    assert uses_version(_record("datakey.reencrypt", {"from_version": 1, "to_version": 2}), KEY, 2)
    # datakey.reencrypt's version is in from/to_version: a `version` field there is no claim.
    assert not uses_version(_record("datakey.reencrypt", {"version": 1}), KEY, 1)
    assert not uses_version(_record("key.encrypt", {"version": True}), KEY, 1)  # True is not version 1
    assert not uses_version(_record("key.encrypt", {"version": "1"}), KEY, 1)
    assert not uses_version(_record("key.encrypt", {}), KEY, 1)
    assert not uses_version({**_record("key.encrypt", {}), "details": None}, KEY, 1)
    assert not uses_version(_record("key.rotate", {"version": 1}), KEY, 1)
    assert not uses_version(_record("key.destroy", {"version": 1}), KEY, 1)
    assert not uses_version(_record(RETIRED_ACTION, {"version": 1}), KEY, 1)


def test_wraps_and_unwraps_name_the_version_by_its_kmip_identifier() -> None:
    wrapped = _record("key.export", {"version": 3, "wrapped_under": UID}, object_id="another-key")
    unwrapped = _record("key.create", {"version": 1, "unwrapped_by": UID}, object_id="a-new-key")
    for record in (wrapped, unwrapped):
        assert uses_version(record, KEY, 1, kmip_uid=UID)
        assert not uses_version(record, KEY, 1)  # without the identifier it cannot be told
        assert not uses_version(record, KEY, 1, kmip_uid="another-uid")
        assert not uses_version({**record, "outcome": "denied"}, KEY, 1, kmip_uid=UID)
    assert set(UID_FIELDS) == {"key.export", "key.create"}


def test_the_watch_reports_only_later_uses(signer: tuple[ec.EllipticCurvePrivateKey, str]) -> None:
    key, fingerprint = signer
    statement = _signed(key, _statement(fingerprint))
    watch = UseWatch()
    records = [
        {**_record("key.decrypt", {"version": 1}), "seq": 1},  # before: what the retirement moved
        {**_record(RETIRED_ACTION, statement), "seq": 2},
        {**_record("key.decrypt", {"version": 2}), "seq": 3},  # the newer version: fine
        {**_record("key.decrypt", {"version": 1}, outcome="denied"), "seq": 4},  # refused: fine
        {**_record("datakey.reencrypt", {"from_version": 1, "to_version": 2}), "seq": 5},
        {**_record("key.create", {"version": 1, "unwrapped_by": UID}, object_id="a-new-key"), "seq": 6},
        {**_record("key.export", {"version": 1, "wrapped_under": "another"}, object_id="k2"), "seq": 7},
    ]
    seen = []
    for r in records:
        if watch.wants(r["action"], r["outcome"], r["object_id"]):
            seen.append(r["seq"])
            watch.see(r)
    assert seen == [2, 3, 5, 6, 7]  # before any statement, and refusals, cost a comparison only
    assert [s.seq for s in watch.statements] == [2]
    problems = watch.finish(lambda st: UID)
    assert [seq for seq, _ in problems] == [5, 6]
    assert problems[0][1] == ("record 5 (datakey.reencrypt) uses version 1 of key 'payments' after its "
                              "zero-use statement (record 2)")


# --- every action the server writes, classified ----------------------------------------

# Actions the server writes that use no key version's material, with the reason. A new
# action must be added here or to statements.VERSION_FIELDS / UID_FIELDS.
NOT_USES = {
    # Key lifecycle and metadata: no material is used.
    **dict.fromkeys(("key.create", "key.read", "key.list", "key.update", "key.rotate", "key.activate",
                     "key.deactivate", "key.revoke", "key.destroy", "key.consumers", "key.inventory",
                     "key.retire", "key.retire_exclude", "key.retire_cancel", "key.retire_complete",
                     "key.retirement_list", "key.shred", RETIRED_ACTION),
                    "lifecycle or metadata (key.create: an unwrap under a version is in UID_FIELDS)"),
    "key.unwrap": "written only as a refusal; an allowed unwrap is the new key's key.create (UID_FIELDS)",
    # Volumes are recorded under the volume's id; the passphrase is a data key, whose
    # datakey.generate / datakey.decrypt record the same call writes names key and version.
    **dict.fromkeys(("volume.create", "volume.unseal", "volume.reseal", "volume.open", "volume.close",
                     "volume.rotate", "volume.list", "volume.read", "volume.policy", "volume.recovery",
                     "volume.rekey", "volume.rekey_requested", "volume.revoke"),
                    "volume record; the key use is the data key's own record"),
    # Databases: the KV read is database.key_read (a use); the rest is identity and grants.
    **dict.fromkeys(("database.authenticate", "database.create", "database.grant", "database.list",
                     "database.read", "database.revoke", "database.token", "database.ungrant"),
                    "database identity and grants"),
    # AWS key stores: their encrypt/decrypt are recorded as key.encrypt/key.decrypt with the
    # AWS details; xks.{operation} records are refusals, and the rest is administration.
    **dict.fromkeys(("xks.create", "xks.credential", "xks.credential_retire", "xks.grant", "xks.health",
                     "xks.list", "xks.metadata", "xks.read", "xks.revoke", "xks.ungrant", "xks.update"),
                    "key store administration or status"),
    "xks.shed": "XKS calls refused past the in-flight bound before any key was touched (a count)",
    # KMIP: Get is key.export, the cryptographic operations key.{use}; these are object
    # lifecycle, attributes, searches and the clients' tenancy.
    **dict.fromkeys(("kmip.create_key_pair", "kmip.get_attribute_list", "kmip.get_attributes",
                     "kmip.grant.create", "kmip.grant.delete", "kmip.grant.list", "kmip.group.list", "kmip.locate",
                     "kmip.register", "kmip.reject", "kmip.revoke"), "KMIP lifecycle, attributes and tenancy"),
    "rng.retrieve": "the HSM's random generator, no key",
    "system.backup": "a backup copies wrapped material; it uses none",
    "system.restore": "restoring puts wrapped material back; it uses none",
    "system.health": "status", "system.metrics": "status",
}
# Whole families that cannot use a managed key version's material.
NOT_USE_FAMILIES = {
    "approval.": "held actions; the action done is recorded under its own name",
    "audit.": "the log itself", "auth.": "sign-in", "user.": "accounts", "token.": "API tokens",
    "enrollment_token.": "host enrolment", "enrollment_info.": "host enrolment", "host.": "hosts",
    "kek.": "the KEK re-wraps versions inside the HSM; no version's material is used for data",
    "kmip_client.": "KMIP client identities", "guard_point.": "guard point definitions (hosts fetch keys: key.deliver)",
}
# Names made at run time: the pattern, and why none of what it makes is a use.
DYNAMIC = {
    "key.{}": "CryptoService's uses: every name it makes must be in VERSION_FIELDS (checked below)",
    "kmip.{}": "KMIP refusals (dispatcher) and object lifecycle (activate, revoke, destroy)",
    "xks.{}": "refusals of AWS key store calls; served calls are key.encrypt / key.decrypt",
    "agent.{}": "what a host reports of its own work; its use of a version is the key.deliver that gave it",
    "approval.{}": "held actions",
    "kmip.{}_attribute": "KMIP attribute edits",
}
ACTION = re.compile(r"^[a-z_]+(\.[a-z_]+)+$")


def _strings(node: ast.AST) -> list[str]:
    """The action names an expression can evaluate to: its string constants, and its
    f-strings as patterns with `{}` for each substitution."""
    found: list[str] = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.JoinedStr):
            found.append("".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in sub.values))
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str) and ACTION.match(sub.value):
            found.append(sub.value)
    return found


def _written_actions() -> dict[str, str]:
    """Every audit action name in keyserver/, with where it is first seen: `action=`
    arguments, PendingRecord's second argument, assignments to `action` and what
    functions named *action* return."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "keyserver").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            values: list[ast.AST] = []
            if isinstance(node, ast.Call):
                values += [kw.value for kw in node.keywords if kw.arg == "action"]
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name == "PendingRecord" and len(node.args) >= 2:
                    values.append(node.args[1])
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "action"
                                                      for t in node.targets):
                values.append(node.value)
            elif isinstance(node, ast.FunctionDef) and "action" in node.name:
                values += [n.value for n in ast.walk(node) if isinstance(n, ast.Return) and n.value is not None]
            for v in values:
                for s in _strings(v):
                    found.setdefault(s, f"{path.relative_to(ROOT)}:{getattr(v, 'lineno', '?')}")
    return found


def test_every_action_the_server_writes_is_classified() -> None:
    written = _written_actions()
    assert {"key.{}", "datakey.generate", "key.deliver", "database.key_read"} <= set(written), \
        "the walk no longer finds the actions it is meant to"
    unknown = []
    for action, where in sorted(written.items()):
        if "{}" in action:
            if action not in DYNAMIC:
                unknown.append(f"{action} ({where}): a name made at run time; list it in DYNAMIC with the reason")
            continue
        if action in USE_ACTIONS or action in UID_FIELDS or action in NOT_USES \
                or any(action.startswith(f) for f in NOT_USE_FAMILIES):
            continue
        unknown.append(f"{action} ({where}): if its allowed records use a key version's material, add it to "
                       "statements.VERSION_FIELDS; otherwise to NOT_USES in this test, with the reason")
    assert not unknown, "\n".join(unknown)


def test_no_use_action_is_stale() -> None:
    """Each listed use is an action the server writes: a renamed action would otherwise
    leave its uses unwatched while this list looks complete."""
    written = set(_written_actions()) | {f"key.{u}" for u in _crypto_uses()}
    assert set(VERSION_FIELDS) - written == set()
    assert set(UID_FIELDS) - written == set()


def _crypto_uses() -> list[str]:
    """The `use` values of CryptoService (`Use = Literal[...]` in core/crypto.py)."""
    tree = ast.parse((ROOT / "keyserver/core/crypto.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "Use" for t in node.targets):
            return [c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
    raise AssertionError("core/crypto.py no longer defines Use = Literal[...]")


def test_every_cryptographic_use_is_a_use() -> None:
    from keyserver.kmip.cryptoparams import PERMISSIONS

    uses = _crypto_uses()
    assert "encrypt" in uses and "mac_verify" in uses
    for use in [*uses, *PERMISSIONS]:
        assert f"key.{use}" in VERSION_FIELDS, f"key.{use} is made by CryptoService (KMIP too) and uses a version"
