#!/usr/bin/env python3
"""Verify a Strongroom audit export without the server: one file an auditor can read
whole and run with Python 3.11+ and the `cryptography` package, nothing else.

What to fetch (a user with the auditor role; checkpoints BEFORE the export, so that the
export reaches every checkpoint):

    curl -H "Authorization: Bearer $T" "$URL/api/v1/audit/status"  > status.json
    curl -H "Authorization: Bearer $T" "$URL/api/v1/audit/checkpoints?after=0" > checkpoints.json
        (1,000 a page: fetch ?after=<last number> until a page is empty, and concatenate them)
    curl -H "Authorization: Bearer $T" "$URL/api/v1/audit/export?format=jsonl" > audit.jsonl

    python3 verify_audit_offline.py --export audit.jsonl --checkpoints checkpoints.json \
        --public-key status.json       (or a PEM file holding status.json's public_key_pem)

What it checks, and so proves:

1. Every checkpoint is signed (ECDSA P-256, SHA-256) by the key whose PEM you gave —
   compare its fingerprint, printed, with one obtained out of band — numbered 1, 2, 3 …,
   each naming the digest of the one before it, over ever later records.
2. The export's records run from record 1 without a gap, each naming the hash of the one
   before it (`prev_hash`), and the record a checkpoint names carries the hash the
   checkpoint signed: the records up to the last checkpoint are the ones the server
   signed for, none removed, inserted or reordered.
3. Every zero-use statement (`key.version_retired`, decision 0024) is signed by the same
   key over its canonical bytes, and names as its position in the chain a record before
   it whose hash it gives.
4. No record after a statement uses the version it retired (an allowed encrypt, decrypt,
   sign, verify, MAC, export, delivery to an agent, data-key or database read naming the
   version, or a wrap or unwrap under the version's KMIP identifier).

What it cannot prove: a record's hash is an HMAC under a key inside the server's HSM, so
a record's fields cannot be checked against its hash here. An edited record that keeps
its hash passes checks 1 and 2; only `keyserver verify-audit` (which holds the HSM) or a
comparison with a copy kept off the server (`keyserver verify-audit --outside`) sees it.
A statement's own fields are covered by its signature. Records after the last checkpoint
are linked but not yet signed for.

Exit status: 0 and a summary when everything holds; 1 and each problem found; 2 when an
input cannot be read. The canonical forms below are written from the documentation
(docs/audit.md), not imported: tests/test_offline_verify.py checks they agree with the
server's.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

GENESIS = "0" * 64  # the `prev_hash` of record 1, and the `prev` of checkpoint 1
STATEMENT_TYPE = "strongroom.version-retired.v1"
RETIRED_ACTION = "key.version_retired"
# Allowed records of these actions, on object type "key" with the key's id as object id,
# use the version named in these details fields.
VERSION_FIELDS = {
    "key.encrypt": ("version",), "key.decrypt": ("version",), "key.sign": ("version",),
    "key.verify": ("version",), "key.mac": ("version",), "key.mac_verify": ("version",),
    "key.export": ("version",), "key.deliver": ("version",), "database.key_read": ("version",),
    "datakey.generate": ("version",), "datakey.generate_without_plaintext": ("version",),
    "datakey.decrypt": ("version",), "datakey.reencrypt": ("from_version", "to_version"),
}
# Allowed records of these actions use the version whose KMIP identifier this field holds.
UID_FIELDS = {"key.export": "wrapped_under", "key.create": "unwrapped_by"}
RECORD_FIELDS = ("seq", "time", "actor", "actor_type", "action", "object_type", "object_id", "outcome",
                 "source_ip", "request_id", "details", "prev_hash", "hash")
SHOWN = 100  # problems printed one by one; the rest are counted


class Unreadable(Exception):
    """An input that is not what the server writes: exit 2."""


# --- canonical forms ---------------------------------------------------------------------

def utc_time(value: str) -> str:
    """A time as the server signs it: UTC, microseconds, a Z."""
    t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if t.tzinfo is None:
        raise ValueError(f"the time {value!r} has no time zone")
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def canonical_checkpoint(c: dict[str, Any]) -> bytes:
    """The bytes a checkpoint's signature covers: its six fields as JSON with sorted keys,
    no spaces, non-ASCII escaped."""
    doc = {"checkpoint": c["checkpoint"], "seq": c["seq"], "hash": c["hash"], "time": utc_time(c["time"]),
           "prev": c["prev"], "key": c["key"]}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def checkpoint_digest(c: dict[str, Any]) -> str:
    """What the next checkpoint names as `prev`."""
    return hashlib.sha256(canonical_checkpoint(c)).hexdigest()


def canonical_statement(statement: dict[str, Any]) -> bytes:
    """The bytes a statement's signature covers: JSON with sorted keys, no spaces, UTF-8."""
    return json.dumps(statement, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def verifies(public: ec.EllipticCurvePublicKey, signature_b64: Any, body: bytes) -> bool:
    try:
        public.verify(base64.b64decode(str(signature_b64), validate=True), body, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        return False
    return True


# --- inputs ------------------------------------------------------------------------------

def load_public_key(path: Path) -> tuple[ec.EllipticCurvePublicKey, str]:
    """The audit key from a PEM file or from /audit/status's JSON, and its fingerprint (the
    SHA-256 of its SubjectPublicKeyInfo, as checkpoints and statements name it)."""
    text = read_text(path)
    if text.lstrip().startswith("{"):
        try:
            text = str(json.loads(text)["public_key_pem"])
        except (ValueError, KeyError, TypeError) as exc:
            raise Unreadable(f"{path}: JSON without a public_key_pem ({exc})") from None
    try:
        public = serialization.load_pem_public_key(text.encode())
    except ValueError as exc:
        raise Unreadable(f"{path}: not a PEM public key ({exc})") from None
    if not isinstance(public, ec.EllipticCurvePublicKey) or public.curve.name != "secp256r1":
        raise Unreadable(f"{path}: not an EC P-256 public key")
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return public, hashlib.sha256(der).hexdigest()


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise Unreadable(f"cannot read {path}: {exc}") from None


def load_checkpoints(path: Path) -> list[dict[str, Any]]:
    """Checkpoints from /audit/checkpoints pages (JSON arrays, one or several concatenated)
    or JSON lines (a file sink's copy, whose record lines are skipped)."""
    text, decoder, at, found = read_text(path), json.JSONDecoder(), 0, []
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            break
        try:
            doc, at = decoder.raw_decode(text, at)
        except ValueError as exc:
            raise Unreadable(f"{path}: not JSON at character {at} ({exc})") from None
        for item in doc if isinstance(doc, list) else [doc]:
            if isinstance(item, dict) and item.get("type", "checkpoint") == "checkpoint":
                found.append(item)
    return found


def export_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """The export's lines as (line number, object), streamed."""
    try:
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    doc = json.loads(line)
                except ValueError as exc:
                    raise Unreadable(f"{path} line {number}: not JSON ({exc})") from None
                if not isinstance(doc, dict):
                    raise Unreadable(f"{path} line {number}: not a JSON object")
                yield number, doc
    except (OSError, UnicodeDecodeError) as exc:
        raise Unreadable(f"cannot read {path}: {exc}") from None


# --- the checks ----------------------------------------------------------------------------

@dataclass
class Statement:
    seq: int
    key_id: str | None
    version: int | None
    name: str
    uid: str | None  # the version's KMIP identifier, from the statement or learned from records


@dataclass
class Report:
    problems: list[tuple[int, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def problem(self, seq: int, what: str) -> None:
        self.problems.append((seq, what))


def check_checkpoints(checkpoints: list[dict[str, Any]], public: ec.EllipticCurvePublicKey, fingerprint: str,
                      report: Report) -> dict[int, dict[str, Any]]:
    """Signatures, numbering and links; returns the valid ones by the record they name."""
    by_number: dict[int, dict[str, Any]] = {}
    for c in checkpoints:
        n = c.get("checkpoint")
        if not isinstance(n, int) or isinstance(n, bool):
            report.problem(0, f"a checkpoint without a number: {json.dumps(c)[:80]}")
            continue
        if n in by_number and by_number[n] != c:
            report.problem(int(c.get("seq") or 0), f"checkpoint {n} appears twice, differently")
        by_number.setdefault(n, c)
    at_seq: dict[int, dict[str, Any]] = {}
    prev_digest, prev_seq = GENESIS, 0
    for expected, n in enumerate(sorted(by_number), start=1):
        c = by_number[n]
        try:
            seq = int(c["seq"])
            body = canonical_checkpoint(c)
        except (KeyError, TypeError, ValueError) as exc:
            report.problem(0, f"checkpoint {n} is malformed ({exc})")
            return at_seq
        if c["key"] != fingerprint:
            report.problem(seq, f"checkpoint {n} is signed by another key ({str(c['key'])[:16]}…)")
        elif not verifies(public, c.get("signature"), body):
            report.problem(seq, f"checkpoint {n}'s signature does not verify")
        elif n != expected:
            report.problem(seq, f"checkpoint {expected} is missing (next present: {n})")
        elif c["prev"] != prev_digest:
            report.problem(seq, f"checkpoint {n} does not link to checkpoint {n - 1}")
        elif seq <= prev_seq:
            report.problem(seq, f"checkpoint {n} goes backwards (record {seq} after {prev_seq})")
        else:
            at_seq[seq] = c
        prev_digest, prev_seq = checkpoint_digest(c), max(prev_seq, seq)
    return at_seq


def statement_refs(path: Path) -> dict[int, str | None]:
    """The records the statements name as their chain position: a first pass, so the
    second need not keep every record's hash."""
    wanted: dict[int, str | None] = {}
    for _, doc in export_lines(path):
        if doc.get("action") == RETIRED_ACTION and isinstance(doc.get("details"), dict):
            st = doc["details"].get("statement")
            chain = st.get("chain") if isinstance(st, dict) else None
            if isinstance(chain, dict) and isinstance(chain.get("seq"), int):
                wanted[chain["seq"]] = None
    return wanted


def statement_problem(details: Any, public: ec.EllipticCurvePublicKey, fingerprint: str) -> str | None:
    if not isinstance(details, dict) or not isinstance(details.get("statement"), dict):
        return "the statement is malformed"
    st = details["statement"]
    if st.get("type") != STATEMENT_TYPE:
        return f"the statement's type is not {STATEMENT_TYPE}"
    if st.get("signing_key") != fingerprint:
        return f"the statement is signed by another key ({str(st.get('signing_key'))[:16]}…)"
    if "version" not in st or st["version"] != details.get("version"):
        return "the statement names another version than its record"
    if not verifies(public, details.get("signature"), canonical_statement(st)):
        return "the statement's signature does not verify"
    return None


def names_version(details: dict[str, Any], fields: tuple[str, ...], version: int) -> bool:
    return any(isinstance(details.get(f), int) and not isinstance(details.get(f), bool)
               and details.get(f) == version for f in fields)


def check_export(path: Path, at_seq: dict[int, dict[str, Any]], public: ec.EllipticCurvePublicKey,
                 fingerprint: str, report: Report) -> tuple[int, list[Statement]]:
    """Links, checkpoints' records, statements and later uses; returns the last record's
    sequence number and the statements."""
    wanted = statement_refs(path)
    expected, prev_hash, last = 1, GENESIS, 0
    statements: list[Statement] = []
    by_key: dict[str, list[Statement]] = {}
    uids: dict[tuple[str, int], str] = {}  # (key id, version) -> KMIP identifier, as records show it
    uid_uses: list[tuple[int, str, str]] = []
    for line, doc in export_lines(path):
        if doc.get("type") == "error":
            report.problem(last + 1, f"the export is incomplete: {doc.get('message', 'the server stopped it')}")
            continue
        if any(f not in doc for f in RECORD_FIELDS) or not isinstance(doc["seq"], int):
            report.problem(last + 1, f"line {line} is not an audit record")
            continue
        seq, action = doc["seq"], doc["action"]
        details: dict[str, Any] = doc["details"] if isinstance(doc["details"], dict) else {}
        if seq != expected:
            report.problem(expected, f"record {expected} is missing (the export goes from record {last} to {seq})"
                           if seq > expected else f"record {seq} is out of order (after record {last})")
        elif doc["prev_hash"] != prev_hash:
            report.problem(seq, f"record {seq} does not link to record {seq - 1}: a record before it was "
                                "removed, replaced or inserted")
        cp = at_seq.get(seq)
        if cp is not None and cp["hash"] != doc["hash"]:
            report.problem(seq, f"record {seq} is not the one checkpoint {cp['checkpoint']} signed")
        if seq in wanted:
            wanted[seq] = doc["hash"]
        expected, prev_hash, last = max(expected, seq + 1), doc["hash"], max(last, seq)
        if doc["object_type"] == "key" and isinstance(details.get("kmip_uid"), str) \
                and isinstance(details.get("version"), int):
            uids.setdefault((str(doc["object_id"]), details["version"]), details["kmip_uid"])
        if doc["outcome"] != "allowed":
            continue
        if action == RETIRED_ACTION:
            problem = statement_problem(doc["details"], public, fingerprint)
            st: dict[str, Any] = details["statement"] if isinstance(details.get("statement"), dict) else {}
            chain: dict[str, Any] = st["chain"] if isinstance(st.get("chain"), dict) else {}
            if problem is None:
                ref = chain.get("seq")
                # Record 0: the chain was empty; the server names it with an empty hash.
                found = chain.get("hash") if ref == 0 and chain.get("hash") in ("", GENESIS) else \
                    wanted.get(ref) if isinstance(ref, int) else None
                if not isinstance(ref, int) or not 0 <= ref < seq or found != chain.get("hash"):
                    problem = (f"the statement's chain position (record {ref}) is not a record before it with "
                               "that hash: it was moved or the chain rewritten")
            if problem is not None:
                report.problem(seq, f"zero-use statement in record {seq}: {problem}")
            key_id, version = st.get("key_id"), st.get("version")
            ok = isinstance(key_id, str) and isinstance(version, int) and not isinstance(version, bool)
            s = Statement(seq, key_id if ok else None, version if ok else None, str(st.get("key", key_id)),
                          st.get("kmip_uid") if isinstance(st.get("kmip_uid"), str) else None)
            statements.append(s)
            if s.key_id is not None:
                by_key.setdefault(s.key_id, []).append(s)
            continue
        if not statements:
            continue
        fields = VERSION_FIELDS.get(action)
        if fields and doc["object_type"] == "key":
            for s in by_key.get(str(doc["object_id"]), ()):
                if s.version is not None and names_version(details, fields, s.version):
                    report.problem(seq, used(seq, action, s))
        uid_field = UID_FIELDS.get(action)
        if uid_field is not None and isinstance(details.get(uid_field), str):
            uid_uses.append((seq, action, details[uid_field]))
    for s in statements:
        if s.uid is None and s.key_id is not None and s.version is not None:
            s.uid = uids.get((s.key_id, s.version))
    for seq, action, uid in uid_uses:
        for s in statements:
            if s.seq < seq and s.uid == uid:
                report.problem(seq, used(seq, action, s))
    return last, statements


def used(seq: int, action: str, s: Statement) -> str:
    return f"record {seq} ({action}) uses version {s.version} of key '{s.name}' after its zero-use statement " \
           f"(record {s.seq})"


def verify(export: Path, checkpoints_path: Path, public_key: Path) -> tuple[Report, str]:
    """Every check; the report and the summary printed when it holds no problem."""
    public, fingerprint = load_public_key(public_key)
    report = Report()
    checkpoints = load_checkpoints(checkpoints_path)
    at_seq = check_checkpoints(checkpoints, public, fingerprint, report)
    last, statements = check_export(export, at_seq, public, fingerprint, report)
    if last == 0:
        report.problem(1, "the export holds no record")
    for seq, c in sorted(at_seq.items()):
        if seq > last:
            report.problem(seq, f"checkpoint {c['checkpoint']} names record {seq}, past the export's last record "
                                f"{last}: the export is cut off, or older than the checkpoints (fetch them first)")
    signed = max((s for s in at_seq if s <= last), default=0)
    lines = [f"audit key {fingerprint}",
             f"{last} records linked from record 1; {len(at_seq)} checkpoints signed and linked, the last for "
             f"record {signed}"]
    if signed < last:
        lines.append(f"records {signed + 1}-{last} follow the last checkpoint: linked, not yet signed for")
    for s in statements:
        lines.append(f"zero-use statement in record {s.seq}: key '{s.name}' ({s.key_id}) version {s.version} — "
                     "signed, no later use")
    lines.append("not checked here: each record's HMAC (its key is in the server's HSM)")
    return report, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--export", type=Path, required=True, help="GET /api/v1/audit/export?format=jsonl")
    parser.add_argument("--checkpoints", type=Path, required=True,
                        help="GET /api/v1/audit/checkpoints, every page (or a file sink's copy)")
    parser.add_argument("--public-key", type=Path, required=True,
                        help="the audit public key: a PEM file, or GET /api/v1/audit/status's JSON")
    args = parser.parse_args(argv)
    try:
        report, summary = verify(args.export, args.checkpoints, args.public_key)
    except Unreadable as exc:
        print(f"cannot verify: {exc}", file=sys.stderr)
        return 2
    if report.problems:
        problems = sorted(set(report.problems))
        for _, what in problems[:SHOWN]:
            print(f"PROBLEM: {what}")
        if len(problems) > SHOWN:
            print(f"… and {len(problems) - SHOWN} more problems")
        print(f"{len(problems)} problem(s): the export does not verify")
        return 1
    print(summary)
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
