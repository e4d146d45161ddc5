"""Forward compatibility of the region policy record (`/cluster/region`): what a planner does with parts of
the record written by a newer version.

Every planner reads the record on each change and some rewrite it by CAS (a failover, failback=auto, the
API's switchover and affinity calls). So a reader must neither refuse a record because of something it
does not know (it would ignore every later policy change: a switchover, a failover) nor drop it when it
writes the record back (the newer planners would lose their data on an older planner's failover).
Hence: keys a decoder does not know are kept, as they were, in an `extra` mapping of the object that held
them, and written back as they were. A field that the writer changes replaces its known keys only.

The same goes for a value this version does not know of a field it knows (a new failback mode, a new
affinity mode): the field is read as a stated fallback, the one that moves nothing on its own (failback
`manual`, affinity `prefer`, the default), and the text as written is kept in an `unread` mapping
(key -> (value as written, the fallback's JSON value)). It is written back as it was unless this writer
set the field to something else. Refusing the record instead would make the planner ignore every later
failover and switchover.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import TypeVar

Extra = Mapping[str, object]
# key -> (the value a newer version wrote, the JSON value of what this version read it as)
Unread = Mapping[str, tuple[object, object]]

E = TypeVar("E", bound=StrEnum)


def unknown(d: Mapping[str, object], known: frozenset[str]) -> dict[str, object]:
    """The keys of `d` this version does not read, with their values untouched."""
    return {k: v for k, v in d.items() if k not in known}


def merged(extra: Extra, known: dict[str, object]) -> dict[str, object]:
    """`known` plus the kept unknown keys; a key this version writes always wins (it is not in `extra`
    unless a newer version reused a name, and then ours is what this writer means)."""
    return {**extra, **known} if extra else known


def read_enum(d: Mapping[str, object], key: str, enum: type[E], fallback: E,
              unread: dict[str, tuple[object, object]]) -> E:
    """`d[key]` as a member of `enum` (absent: `fallback`); a value this version does not know is read as
    `fallback` and noted in `unread`, so that it is reported and written back (see the module's doc)."""
    raw = d.get(key, fallback.value)
    try:
        return enum(str(raw))
    except ValueError:
        unread[key] = (raw, fallback.value)
        return fallback


def restored(unread: Unread, known: dict[str, object]) -> dict[str, object]:
    """`known` with each unread value put back where the field still holds what it was read as."""
    if not unread:
        return known
    out = dict(known)
    for k, (raw, read_as) in unread.items():
        if out.get(k) == read_as:
            out[k] = raw
    return out


def describe(unread: Unread, prefix: str = "") -> list[str]:
    """`field='value' (read as 'fallback')`, one per unread value: for the log line that says so."""
    return [f"{prefix}{k}={raw!r} (read as {read_as!r})" for k, (raw, read_as) in sorted(unread.items())]
