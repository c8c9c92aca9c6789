"""Full-text search of the audit log (docs/audit.md "Searching").

The chainer turns each record into words: every run of letters and digits, lower-cased,
in its actor, action, object, outcome, source address, request id and the values of its
details (`host:db-1` → `host db 1`; a key's UUID → its five groups). The words go into
`audit_search` in the transaction that chains the record, and each store indexes them with
its own full-text engine (GIN on PostgreSQL, FTS5 on SQLite). Words are made here, not by
the engines, so a search finds the same records on every store.

A query is words, all of which a record must contain; a word ending in `*` is a prefix
(`pay*` finds `payments`). Words are matched whole, so `db-1` finds records with the words
`db` and `1`, in any order, in any field.

On PostgreSQL the word index must be what finds the records, whatever the plan cache
thinks: a generic plan (psycopg prepares a statement after its fifth run) guesses that
thousands of records match and walks the log newest first, parsing every record's words
(9 s for one request id among a million records, measured). The searching transaction
asks for custom plans, and a rare search takes its matches from the index first
(`materialize`): its cost follows the number of matches, not the size of the log.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import ColumnElement, Select, bindparam, func, literal_column, select, table

from keyserver.core.errors import InvalidInput
from keyserver.store.models import AuditEvent, AuditSearch

WORD = re.compile(r"[^\W_]+")  # letters and digits of any script; "_" separates, as in snake_case
MAX_WORD = 64  # a longer run (a base64 blob) is cut: its start still matches a prefix
MAX_WORDS = 256  # per record: details are bounded, but a record never costs more than this
MAX_QUERY_WORDS = 8
_FIELDS = ("actor", "action", "object_type", "object_id", "outcome", "source_ip", "request_id")


def _values(value: Any, out: list[str], depth: int = 0) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int | float):
        out.append(str(value))
    elif depth < 3 and isinstance(value, dict):
        for v in value.values():
            _values(v, out, depth + 1)
    elif depth < 3 and isinstance(value, list | tuple):
        for v in value[:64]:
            _values(v, out, depth + 1)


def words_of(text_: str) -> list[str]:
    return [w[:MAX_WORD] for w in WORD.findall(text_.lower())]


def record_terms(event: dict[str, Any]) -> str:
    """The words of one record (a dict with the audit_events columns), space-separated,
    each once, in the order first seen."""
    strings = [str(event[f]) for f in _FIELDS if event.get(f)]
    _values(event.get("details"), strings)
    # One pass over all of them (a space never joins two words): the chainer runs this for
    # every record, and a pass per string was a sixth of its time at 1,700 XKS calls/s.
    seen = dict.fromkeys(words_of(" ".join(strings)))
    return " ".join(list(seen)[:MAX_WORDS] if len(seen) > MAX_WORDS else seen)


def parse_query(q: str) -> list[tuple[str, bool]]:
    """The query's words as (word, is_prefix). A query word that holds several words
    (`db-1`, a UUID) asks for each of them; `*` after it makes its last one a prefix."""
    terms: list[tuple[str, bool]] = []
    for token in q.split():
        prefix = token.endswith("*")
        words = words_of(token.rstrip("*"))
        terms.extend((w, prefix and i == len(words) - 1) for i, w in enumerate(words))
    if not terms:
        raise InvalidInput("search for at least one word of letters or digits", code="invalid_search")
    if len(terms) > MAX_QUERY_WORDS:
        raise InvalidInput(f"search for at most {MAX_QUERY_WORDS} words", code="invalid_search")
    return list(dict.fromkeys(terms))


def hits(dialect: str, q: str) -> Select[Any]:
    """The sequence numbers of the records holding every word of `q`, from the word index.
    The words are letters and digits only, so they are safe inside either engine's query
    syntax."""
    terms = parse_query(q)
    if dialect == "postgresql":
        tsquery = " & ".join(f"{w}:*" if prefix else w for w, prefix in terms)
        # The same expression as the GIN index of migration 0019, or the index is not used.
        simple: ColumnElement[Any] = literal_column("'simple'::regconfig")
        vector = func.to_tsvector(simple, AuditSearch.terms)
        return select(AuditSearch.seq).where(vector.op("@@")(func.to_tsquery(simple, bindparam(None, tsquery))))
    match = " ".join(f'"{w}"*' if prefix else f'"{w}"' for w, prefix in terms)
    return select(literal_column("rowid")).select_from(table("audit_search_fts")).where(
        literal_column("audit_search_fts").op("MATCH")(bindparam(None, match)))


def matching(dialect: str, q: str, *, materialize: bool = False) -> ColumnElement[bool]:
    """A condition on AuditEvent: the record holds every word of `q`. `materialize`
    (PostgreSQL): the matches are taken from the index before anything else is planned —
    right when they are few, or when the planner must not walk the log for them."""
    found = hits(dialect, q)
    if materialize and dialect == "postgresql":
        cte = found.cte().prefix_with("MATERIALIZED")
        return AuditEvent.seq.in_(select(cte.c.seq))
    return AuditEvent.seq.in_(found)
