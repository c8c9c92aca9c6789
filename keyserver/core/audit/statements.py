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
"""

from __future__ import annotations

import base64
import json
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

STATEMENT_TYPE = "strongroom.version-retired.v1"
RETIRED_ACTION = "key.version_retired"
# Actions whose allowed records use a key version's material. The version is in the
# record's details as `version` (`from_version` for a data key's re-encryption, which
# reads the old version). key.destroy of the version is not a use.
USE_ACTIONS = frozenset({
    "key.encrypt", "key.decrypt", "key.get", "key.deliver", "key.sign", "key.verify", "key.mac",
    "key.mac_verify", "key.wrap", "key.unwrap", "key.export",
    "datakey.generate", "datakey.generate_without_plaintext", "datakey.decrypt", "datakey.reencrypt",
    "xks.encrypt", "xks.decrypt", "kv.read", "volume.reseal", "volume.unlock",
})


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


def uses_version(record: dict[str, Any], key_id: str, version: int) -> bool:
    """Whether an audit record (a dict with the export's fields) used version `version`
    of key `key_id`: an allowed use action on the key naming that version."""
    if record.get("outcome") != "allowed" or record.get("action") not in USE_ACTIONS:
        return False
    if str(record.get("object_id")) != key_id:
        return False
    details = record.get("details") or {}
    named = details.get("from_version") if record["action"] == "datakey.reencrypt" else details.get("version")
    return named == version
