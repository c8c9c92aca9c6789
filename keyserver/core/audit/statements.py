"""Signed statements in the audit chain: a record whose details carry a claim the server
signs in the HSM with the checkpoint key (ECDSA P-256, SHA-256; checkpoints.py), so it
can be checked by anyone holding the audit public key, without the server (decision
0024; tools/verify_audit_offline.py does it from an export).

The first is the zero-use statement of a key version (issue 29): `key.version_retired`,
written when a retirement's inventory reached zero. Its details are

    {"version": N, "statement": {...}, "signature": base64(DER ECDSA over canonical_statement)}

and the statement names the key, the version, the retirement, the counts per kind at the
start and at the end (all zero), the holders an operator excluded and the hosts that
reported, the last record chained before it (`chain`: seq and hash) and the signing key's
fingerprint. What "no later record uses the version" means is `uses_version`: a record
after the statement's own that used version N of the key with outcome allowed breaks the
statement (a refusal does not: it shows the version could not be used).

No database import here: the offline verifier's reader should find the rule in one place.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

STATEMENT_TYPE = "strongroom.version-retired.v1"
RETIRED_ACTION = "key.version_retired"

# The actions whose allowed records use a managed key version's material, recorded with
# object type "key", the key's id as object id, and the version in these details fields.
# tests/core/test_statements.py walks every action the server writes: one that is not
# here must be listed there as no use, with the reason, so none is forgotten silently.
VERSION_FIELDS: dict[str, tuple[str, ...]] = {
    # CryptoService (REST, KMIP, and the XKS proxy, whose calls are recorded as these
    # with the AWS request's details): `key.{use}` with audit_details' `version`.
    "key.encrypt": ("version",), "key.decrypt": ("version",),
    "key.sign": ("version",), "key.verify": ("version",),
    "key.mac": ("version",), "key.mac_verify": ("version",),
    # Material out: KMIP Get (plaintext or wrapped), an agent fetching a version (the
    # host then decrypts guard-point files and volumes with it), a database's KV read.
    "key.export": ("version",), "key.deliver": ("version",), "database.key_read": ("version",),
    # Data keys (volumes' passphrases among them: volume.create/unseal/reseal call these).
    "datakey.generate": ("version",), "datakey.generate_without_plaintext": ("version",),
    "datakey.decrypt": ("version",),
    # Opens the old blob under from_version, seals it under to_version.
    "datakey.reencrypt": ("from_version", "to_version"),
}
USE_ACTIONS = frozenset(VERSION_FIELDS)

# Uses recorded on another object, naming the version by its KMIP unique identifier (the
# version's id): a KMIP Get of a key wrapped under the version, and a KMIP Register of a
# key wrapped under it (unwrapped in the HSM; the record is the new key's key.create).
UID_FIELDS: dict[str, str] = {"key.export": "wrapped_under", "key.create": "unwrapped_by"}


def canonical_statement(statement: dict[str, Any]) -> bytes:
    """The exact bytes the signature covers: sorted keys, no spaces, UTF-8."""
    return json.dumps(statement, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def statement_problem(details: dict[str, Any], public: ec.EllipticCurvePublicKey, fingerprint: str) -> str | None:
    """Why a `key.version_retired` record's details are not a valid statement signed by
    this server's checkpoint key (None when they are)."""
    try:
        statement = details["statement"]
        if statement.get("type") != STATEMENT_TYPE:
            return f"the statement's type is not {STATEMENT_TYPE}"
        if statement["signing_key"] != fingerprint:
            return f"the statement is signed by another key ({str(statement['signing_key'])[:16]}…)"
        if statement["version"] != details["version"]:
            return "the statement names another version than its record"
        public.verify(base64.b64decode(details["signature"], validate=True), canonical_statement(statement),
                      ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return "the statement's signature does not verify"
    except (KeyError, TypeError, ValueError, AttributeError):
        return "the statement is malformed"
    return None


def uses_version(record: dict[str, Any], key_id: str, version: int, *, kmip_uid: str | None = None) -> bool:
    """Whether an audit record (a dict with the export's fields) used version `version`
    of key `key_id`: an allowed use action on the key naming that version, or (with the
    version's `kmip_uid`) an allowed wrap or unwrap under it."""
    if record.get("outcome") != "allowed":
        return False
    action = record.get("action")
    details = record.get("details")
    if not isinstance(details, dict):
        details = {}
    if record.get("object_type") == "key" and str(record.get("object_id")) == key_id \
            and version in versions_named(action, details):
        return True
    uid_field = UID_FIELDS.get(action) if isinstance(action, str) else None
    return kmip_uid is not None and uid_field is not None and details.get(uid_field) == kmip_uid


def versions_named(action: Any, details: dict[str, Any]) -> set[int]:
    """The versions a use action's details name (VERSION_FIELDS): whole numbers only —
    bool is an int in Python, and True must not name version 1. The verifier and the
    chainer's per-version usage both read records by this one rule."""
    fields = VERSION_FIELDS.get(action) if isinstance(action, str) else None
    named = (details.get(f) for f in fields or ())
    return {v for v in named if isinstance(v, int) and not isinstance(v, bool)}


@dataclass(frozen=True, slots=True)
class Retired:
    """A `key.version_retired` record met in a walk of the chain (not yet validated)."""

    seq: int
    key_id: str | None  # None: the statement does not say (it is malformed)
    version: int | None
    name: str
    details: dict[str, Any]


class UseWatch:
    """Fed every record of a walk of the chain, oldest first (`see`): the statements met
    so far, and each later allowed record that uses a stated version (`problems`, as
    (seq, what)). The uses that name a version by its KMIP identifier are matched in
    `finish`, once the caller has found each statement's version identifier."""

    def __init__(self) -> None:
        self.statements: list[Retired] = []
        self.problems: list[tuple[int, str]] = []
        self._by_key: dict[str, list[Retired]] = {}
        self._uid_uses: list[tuple[int, str, str]] = []

    def wants(self, action: str, outcome: str, object_id: str | None) -> bool:
        """Whether `see` needs this record: the caller builds the dict only then, so a walk
        of millions of uses with no statement before them costs a comparison each."""
        if outcome != "allowed":
            return False
        return action == RETIRED_ACTION or (bool(self.statements) and (
            action in UID_FIELDS or (action in VERSION_FIELDS and str(object_id) in self._by_key)))

    def see(self, record: dict[str, Any]) -> None:
        action, seq = record.get("action"), int(record["seq"])
        if record.get("outcome") != "allowed" or not isinstance(action, str):
            return
        raw = record.get("details")
        details: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if action == RETIRED_ACTION:
            self._add(seq, details)
            return
        if not self.statements:
            return
        uid_field = UID_FIELDS.get(action)
        if uid_field is not None and isinstance(details.get(uid_field), str):
            self._uid_uses.append((seq, action, details[uid_field]))
        for st in self._by_key.get(str(record.get("object_id")), ()):
            if st.version is not None and uses_version(record, str(st.key_id), st.version):
                self.problems.append((seq, _used(seq, action, st)))

    def _add(self, seq: int, details: dict[str, Any]) -> None:
        statement = details.get("statement")
        key_id = statement.get("key_id") if isinstance(statement, dict) else None
        version = statement.get("version") if isinstance(statement, dict) else None
        if not isinstance(key_id, str) or not isinstance(version, int) or isinstance(version, bool):
            key_id, version = None, None
        name = statement.get("key") if isinstance(statement, dict) else None
        st = Retired(seq, key_id, version, name if isinstance(name, str) else str(key_id), details)
        self.statements.append(st)
        if key_id is not None:
            self._by_key.setdefault(key_id, []).append(st)

    def finish(self, kmip_uid: Callable[[Retired], str | None]) -> list[tuple[int, str]]:
        """Every problem found, in record order: the uses by version, and the wraps and
        unwraps under a stated version's KMIP identifier (`kmip_uid` of a statement)."""
        uids = {st.seq: kmip_uid(st) for st in self.statements if st.key_id is not None}
        for seq, action, uid in self._uid_uses:
            for st in self.statements:
                if st.seq < seq and uids.get(st.seq) == uid:
                    self.problems.append((seq, _used(seq, action, st)))
        return sorted(set(self.problems))


def _used(seq: int, action: str, st: Retired) -> str:
    return (f"record {seq} ({action}) uses version {st.version} of key '{st.name}' after its zero-use "
            f"statement (record {st.seq})")
