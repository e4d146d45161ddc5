"""A tenant's quota record, as stored under `/quotas/<tenant>` (and the cluster default under
`/cluster/quota`): pure encode, decode, validate and resolve.

Every limit is an integer (executions per second a float) where 0 or absent means unlimited: an absent
field is what an older writer leaves, and reading it as "no limit" is the reading that refuses nothing
new. A tenant's own record replaces the default as a whole (so an operator can make one tenant unlimited
under a restrictive default); `SetTenantQuota` changes only the fields it is given, starting from the
tenant's record, or from the default's values when the tenant has none.

Forward compatibility as in scheduler/region/compat.py: keys this version does not know are kept in
`extra` and written back unchanged by a read-modify-write, so a newer version's limits survive an older
API node's `SetTenantQuota`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler.errors import InvalidArgument
from scheduler.model import MAX_LABELS, MAX_PAYLOAD_BYTES
from scheduler.region.compat import merged, unknown

# Bounds of a stored limit (beyond them a value is a typo, not a quota).
MAX_SCHEDULES = 10_000_000
MAX_EXECUTIONS_PER_SECOND = 100_000.0
MAX_BACKFILL = 1_000_000

_KNOWN = frozenset({"schedules", "executions_per_second", "backfill", "labels", "payload_bytes", "updated_ms",
                    "by", "reason"})


@dataclass(frozen=True)
class Quota:
    """Limits of one tenant (0 = unlimited). `extra`: keys a newer version wrote, kept as they were."""

    schedules: int = 0  # schedules the tenant may hold at once
    executions_per_second: float = 0.0  # planned runs whose start the planners let through per second
    backfill: int = 0  # planned times one Backfill request may create
    labels: int = 0  # labels per schedule (the hard limit, model.MAX_LABELS, applies anyway)
    payload_bytes: int = 0  # payload per schedule (the hard limit, model.MAX_PAYLOAD_BYTES, applies anyway)
    updated_ms: int = 0
    by: str = ""
    reason: str = ""
    extra: Mapping[str, object] = field(default_factory=dict, compare=False)

    @property
    def unlimited(self) -> bool:
        return not (self.schedules or self.executions_per_second or self.backfill or self.labels
                    or self.payload_bytes)


UNLIMITED = Quota()


def decode(value: bytes) -> Quota:
    """A stored record. A field of the wrong type reads as unlimited (with the text kept in `extra`, so it
    is written back): refusing the record would stop every create of the tenant over a bad write."""
    d = json.loads(value)
    if not isinstance(d, dict):
        raise ValueError("a quota record is a JSON object")
    extra = unknown(d, _KNOWN)

    def num(k: str, kind: type[int] | type[float]) -> float:
        v = d.get(k, 0)
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0 or not math.isfinite(v):
            if k in d:
                extra[k] = v
            return 0
        return kind(v)

    return Quota(schedules=int(num("schedules", int)), executions_per_second=float(num("executions_per_second", float)),
                 backfill=int(num("backfill", int)), labels=int(num("labels", int)),
                 payload_bytes=int(num("payload_bytes", int)), updated_ms=int(num("updated_ms", int)),
                 by=str(d.get("by", "")), reason=str(d.get("reason", "")), extra=extra)


def encode(q: Quota) -> bytes:
    known: dict[str, object] = {k: v for k, v in (
        ("schedules", q.schedules), ("executions_per_second", q.executions_per_second), ("backfill", q.backfill),
        ("labels", q.labels), ("payload_bytes", q.payload_bytes)) if v}
    known.update(updated_ms=q.updated_ms, by=q.by, reason=q.reason)
    return json.dumps(merged(q.extra, known), separators=(",", ":"), sort_keys=True).encode()


def validate(q: Quota, prefix: str = "quota") -> Quota:
    """Raise InvalidArgument naming the field (`quota.labels`) and the bound it breaks."""
    checks: tuple[tuple[str, float, float], ...] = (
        ("schedules", q.schedules, MAX_SCHEDULES),
        ("executions_per_second", q.executions_per_second, MAX_EXECUTIONS_PER_SECOND),
        ("backfill", q.backfill, MAX_BACKFILL),
        ("labels", q.labels, MAX_LABELS),
        ("payload_bytes", q.payload_bytes, MAX_PAYLOAD_BYTES),
    )
    for name, v, hi in checks:
        if not math.isfinite(v) or v < 0:
            raise InvalidArgument(f"{prefix}.{name}", f"is {v}; a limit is 0 (unlimited) or positive")
        if v > hi:
            shown = (f"{v:g}", f"{hi:g}") if isinstance(v, float) else (str(v), str(int(hi)))
            raise InvalidArgument(f"{prefix}.{name}", f"is {shown[0]}; at most {shown[1]} (0 means unlimited)")
    if 0 < q.executions_per_second < 0.001:
        raise InvalidArgument(f"{prefix}.executions_per_second",
                              f"is {q.executions_per_second}; at least 0.001 (one run in 1000 s), or 0 for unlimited")
    return q


def resolve(own: Quota | None, default: Quota | None) -> Quota:
    """The limits that apply to a tenant: its own record when it has one, else the default, else none."""
    return own if own is not None else default if default is not None else UNLIMITED
