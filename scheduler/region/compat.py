"""Forward compatibility of the region policy record (`/cluster/region`): what a planner does with parts of
the record written by a newer version.

Every planner reads the record on each change and some rewrite it by CAS (a failover, failback=auto, the
API's switchover and affinity calls). So a reader must neither refuse a record because of something it
does not know (it would ignore every later policy change: a switchover, a failover) nor drop it when it
writes the record back (the newer planners would lose their data on an older planner's failover).
Hence: keys a decoder does not know are kept, as they were, in an `extra` mapping of the object that held
them, and written back as they were. A field that the writer changes replaces its known keys only.
"""

from __future__ import annotations

from collections.abc import Mapping

Extra = Mapping[str, object]


def unknown(d: Mapping[str, object], known: frozenset[str]) -> dict[str, object]:
    """The keys of `d` this version does not read, with their values untouched."""
    return {k: v for k, v in d.items() if k not in known}


def merged(extra: Extra, known: dict[str, object]) -> dict[str, object]:
    """`known` plus the kept unknown keys; a key this version writes always wins (it is not in `extra`
    unless a newer version reused a name, and then ours is what this writer means)."""
    return {**extra, **known} if extra else known
