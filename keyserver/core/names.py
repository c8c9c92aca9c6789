"""One rule for the names of every object (managed keys over REST and KMIP, KMIP public
and private keys, secret data, certificates): docs/kmip.md "Names".

A name is a label a person reads: 1 to 128 printable ASCII characters, spaces
included; not blank, and not shaped like a UUID (identifiers are UUIDs, and a reference
that looks like one is taken as an identifier). ASCII because KMIP carries names in
Text Strings and PyKMIP, the codec of our server and of many clients, writes a Text
String one byte per character: a name outside ASCII could be stored but not returned
over KMIP.

Whether a name may be shared is a question for the caller: KMIP names are labels
(duplicates allowed, as in PyKMIP's own server, whose client names every registered key
"Symmetric Key"); REST keeps one live key per name so that /keys/{name} means one key.
"""

from __future__ import annotations

import re

from keyserver.core.errors import InvalidInput

MAX_NAME = 128
UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")
_PRINTABLE = re.compile(r"^[\x20-\x7e]+$")
RULE = ("a name is 1 to 128 printable ASCII characters (letters, digits, spaces and punctuation), "
        "not blank, and not a UUID")


def check_name(name: object) -> str:
    """`name` if it follows the rule; InvalidInput saying the rule otherwise."""
    if (not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME or not name.strip()
            or not _PRINTABLE.match(name) or UUID_RE.match(name)):
        raise InvalidInput(RULE)
    return name


# A KMIP tenancy group (core/kmip_tenancy.py): DNS-label-like, so it reads well in a grantee "group:<name>".
GROUP_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


def check_group(group: str | None) -> str | None:
    """`group` if it follows the rule (None passes: no group); InvalidInput otherwise."""
    if group is not None and not GROUP_RE.match(group):
        raise InvalidInput("a KMIP group is 1 to 64 characters: lower-case letters, digits, '.', '_' and '-', "
                           "starting with a letter or digit", code="invalid_kmip_group")
    return group
