"""Kubernetes label selectors over Schedule.labels (ListSchedulesRequest.label_selector).

Grammar (comma-separated requirements, all must hold), as in Kubernetes' equality- and set-based
selectors: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` (has the key), `!k` (lacks
it). `k!=v` and `notin` also match schedules without the key, as in Kubernetes. Errors name
`label_selector` and the offending term.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from scheduler.errors import InvalidArgument
from scheduler.model import LABEL_KEY_RE, MAX_LABEL_KEY_LEN, MAX_LABEL_VALUE_LEN

MAX_SELECTOR_LEN = 4096
_VALUE_RE = re.compile(r"^[A-Za-z0-9._/:-]*$")
_SET_RE = re.compile(r"^(?P<key>\S+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")
_EQ_RE = re.compile(r"^(?P<key>[^=!\s]+)\s*(?P<op>==|=|!=)\s*(?P<value>\S*)$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op == "in":
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values  # notin


@dataclass(frozen=True)
class Selector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)


def _bad(term: str, why: str) -> InvalidArgument:
    return InvalidArgument("label_selector", f"{term!r}: {why}")


def _key(k: str, term: str) -> str:
    if not k or len(k) > MAX_LABEL_KEY_LEN or not LABEL_KEY_RE.match(k):
        raise _bad(term, f"label key {k!r} must be 1-{MAX_LABEL_KEY_LEN} chars of A-Z a-z 0-9 . _ / -")
    return k


def _value(v: str, term: str) -> str:
    if len(v) > MAX_LABEL_VALUE_LEN or not _VALUE_RE.match(v):
        raise _bad(term, f"label value {v!r} must be at most {MAX_LABEL_VALUE_LEN} chars of A-Z a-z 0-9 . _ / : -")
    return v


def _split_terms(text: str) -> list[str]:
    """Split at commas outside parentheses."""
    terms: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise _bad(text, "unbalanced ')'")
        if ch == "," and depth == 0:
            terms.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise _bad(text, "unbalanced '('")
    terms.append("".join(cur))
    return [t.strip() for t in terms]


def parse_selector(text: str) -> Selector:
    if len(text) > MAX_SELECTOR_LEN:
        raise InvalidArgument("label_selector", f"is {len(text)} characters; the limit is {MAX_SELECTOR_LEN}")
    if not text.strip():
        return Selector()
    reqs = []
    for term in _split_terms(text):
        if not term:
            raise _bad(text, "empty requirement (a stray comma?)")
        if m := _SET_RE.match(term):
            values = [v.strip() for v in m["values"].split(",")]
            if not all(values):
                raise _bad(term, "empty value in the set")
            reqs.append(Requirement(_key(m["key"], term), m["op"], frozenset(_value(v, term) for v in values)))
        elif m := _EQ_RE.match(term):
            op = "notin" if m["op"] == "!=" else "in"
            reqs.append(Requirement(_key(m["key"], term), op, frozenset({_value(m["value"], term)})))
        elif term.startswith("!"):
            reqs.append(Requirement(_key(term[1:].strip(), term), "!exists"))
        elif re.fullmatch(r"\S+", term):
            reqs.append(Requirement(_key(term, term), "exists"))
        else:
            raise _bad(term, "expected k=v, k==v, k!=v, k in (a,b), k notin (a,b), k or !k")
    return Selector(tuple(reqs))
