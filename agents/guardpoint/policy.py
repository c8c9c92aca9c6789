"""Who may see plaintext in a guard point: an ordered rule list, first match wins.

A rule names who (user names, uids, group names), which program (executable paths) and
what (read, write or all), and permits or denies, optionally with an audit event. Modes:
`enforce` applies the rules (a denial is EACCES and an event); `learn` allows everything
but records what `enforce` would have denied, so a policy can be tuned on a live system.
Rules are checked when a file is opened (and for create and truncate); the handle then
carries the decision, as with any POSIX permission.
"""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

Access = Literal["read", "write"]


class Effect(StrEnum):
    PERMIT = "permit"
    DENY = "deny"


class Mode(StrEnum):
    ENFORCE = "enforce"
    LEARN = "learn"


@dataclass(frozen=True, slots=True)
class Caller:
    uid: int
    gid: int
    pid: int
    user: str
    groups: frozenset[str]
    exe: str | None

    @classmethod
    def from_context(cls, uid: int, gid: int, pid: int) -> Caller:
        """Describe the process behind a FUSE request (from /proc; it may be gone)."""
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = str(uid)
        gids = {gid}
        exe: str | None = None
        try:
            for line in open(f"/proc/{pid}/status").read().splitlines():  # noqa: SIM115 - tiny file
                if line.startswith("Groups:"):
                    gids |= {int(g) for g in line.split()[1:]}
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            pass  # the process exited (or is not ours to inspect): match on ids only
        names = set()
        for g in gids:
            try:
                names.add(grp.getgrgid(g).gr_name)
            except KeyError:
                names.add(str(g))
        return cls(uid, gid, pid, user, frozenset(names), exe)


@dataclass(frozen=True, slots=True)
class Rule:
    effect: Effect
    users: frozenset[str] = field(default_factory=frozenset)
    uids: frozenset[int] = field(default_factory=frozenset)
    groups: frozenset[str] = field(default_factory=frozenset)
    executables: frozenset[str] = field(default_factory=frozenset)
    access: Literal["read", "write", "all"] = "all"
    audit: bool = False

    def matches(self, caller: Caller, want: Access) -> bool:
        if self.access != "all" and self.access != want:
            return False
        if self.users and caller.user not in self.users:
            return False
        if self.uids and caller.uid not in self.uids:
            return False
        if self.groups and not (self.groups & caller.groups):
            return False
        return not (self.executables and caller.exe not in self.executables)


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    would_allow: bool  # the rules' verdict (differs from `allowed` in learn mode)
    rule: int | None  # index of the matching rule; None = the default
    audit: bool


@dataclass(frozen=True, slots=True)
class AccessPolicy:
    mode: Mode = Mode.ENFORCE
    rules: tuple[Rule, ...] = ()
    default: Effect = Effect.DENY

    def decide(self, caller: Caller, want: Access) -> Decision:
        for i, rule in enumerate(self.rules):
            if rule.matches(caller, want):
                ok = rule.effect is Effect.PERMIT
                return Decision(ok or self.mode is Mode.LEARN, ok, i, rule.audit or not ok)
        ok = self.default is Effect.PERMIT
        return Decision(ok or self.mode is Mode.LEARN, ok, None, not ok)


PERMIT_ALL = AccessPolicy(default=Effect.PERMIT)
