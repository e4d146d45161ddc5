"""Worker affinity per pool, part of the region policy (`/cluster/region`, field `affinity`; DESIGN.md
"Regions": "workers prefer executions from their own region; a policy says whether they may take others").

Per pool, one of:
- `strict`: only workers of the planning region (the policy's primary) receive the pool's executions;
  work waits rather than cross a region boundary (data residency, a handler that must run near its data);
- `prefer` (the default): other regions' workers only once no local worker of the pool has had credit
  for `prefer_wait` (a local worker that is merely busy for a moment must not push work abroad);
- `any`: any region, local workers still served first.

A default applies to pools not named. An old record without the field decodes to the default
(`prefer`, DEFAULT_PREFER_WAIT_MS). Pure data and codec: the decision with a clock is in
scheduler/dispatch/affinity.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from scheduler.errors import InvalidArgument
from scheduler.region.compat import Extra, Unread, describe, merged, read_enum, restored, unknown

# A couple of seconds: longer than a worker's reconnect after a planner restart or a credit round trip,
# short enough that a region whose workers are gone does not stall a pool for long.
DEFAULT_PREFER_WAIT_MS = 2_000


class Mode(StrEnum):
    STRICT = "strict"
    PREFER = "prefer"
    ANY = "any"


@dataclass(frozen=True)
class Affinity:
    mode: Mode = Mode.PREFER
    prefer_wait_ms: int = DEFAULT_PREFER_WAIT_MS  # only meaningful for `prefer`
    # Keys a newer version wrote (region/compat.py); a change of the pool's affinity replaces the whole
    # entry, so they only survive rewrites of other parts of the record.
    extra: Extra = field(default_factory=dict, hash=False, compare=False)  # an Affinity compares by what it means
    # A mode a newer version wrote (region/compat.py): `mode` holds the fallback, `prefer`, the default,
    # which neither holds work at home for ever nor sends it abroad while local workers have credit.
    unread: Unread = field(default_factory=dict, hash=False, compare=False)

    def text(self) -> str:
        return f"prefer ({self.prefer_wait_ms} ms)" if self.mode is Mode.PREFER else self.mode.value

    def to_json(self) -> dict[str, object]:
        d: dict[str, object] = {"mode": self.mode.value}
        if self.mode is Mode.PREFER:
            d["prefer_wait_ms"] = self.prefer_wait_ms
        return restored(self.unread, merged(self.extra, d))

    @staticmethod
    def from_json(d: Mapping[str, object]) -> Affinity:
        unread: dict[str, tuple[object, object]] = {}
        mode = read_enum(d, "mode", Mode, Mode.PREFER, unread)
        return Affinity(mode, int(str(d.get("prefer_wait_ms", DEFAULT_PREFER_WAIT_MS))), unknown(d, _AFFINITY_KEYS),
                        unread)


_AFFINITY_KEYS = frozenset({"mode", "prefer_wait_ms"})
_POLICY_KEYS = frozenset({"default", "pools"})


@dataclass(frozen=True)
class AffinityPolicy:
    default: Affinity = Affinity()
    pools: tuple[tuple[str, Affinity], ...] = field(default=())  # per-pool overrides, sorted by pool
    extra: Extra = field(default_factory=dict, hash=False)  # keys a newer version wrote (region/compat.py)

    def for_pool(self, pool: str) -> Affinity:
        for name, a in self.pools:
            if name == pool:
                return a
        return self.default

    def with_pool(self, pool: str, a: Affinity | None) -> AffinityPolicy:
        """The policy with `pool`'s override set to `a` (None: removed, the default applies)."""
        rest = [(n, x) for n, x in self.pools if n != pool]
        if a is not None:
            rest.append((pool, a))
        return replace(self, pools=tuple(sorted(rest)))

    def to_json(self) -> dict[str, object]:
        return merged(self.extra, {"default": self.default.to_json(), "pools": {n: a.to_json() for n, a in self.pools}})

    def unread_values(self) -> list[str]:
        """Values a newer version wrote that this one reads as a fallback (region/compat.py)."""
        out = describe(self.default.unread, "affinity.default.")
        for name, a in self.pools:
            out += describe(a.unread, f"affinity.pools[{name}].")
        return out

    @staticmethod
    def from_json(d: Mapping[str, object] | None) -> AffinityPolicy:
        if not d:
            return AffinityPolicy()
        raw_default = d.get("default")
        raw_pools = d.get("pools")
        default = Affinity.from_json(raw_default) if isinstance(raw_default, Mapping) else Affinity()
        pools = raw_pools if isinstance(raw_pools, Mapping) else {}
        return AffinityPolicy(default, tuple(sorted((str(n), Affinity.from_json(a)) for n, a in pools.items())),
                              unknown(d, _POLICY_KEYS))


def check(a: Affinity, field_prefix: str = "") -> Affinity:
    """Raises InvalidArgument naming the field (`mode`, `prefer_wait`)."""
    if not isinstance(a.mode, Mode):
        raise InvalidArgument(f"{field_prefix}mode", f"is {a.mode!r}; one of strict, prefer, any")
    if a.prefer_wait_ms <= 0:
        raise InvalidArgument(f"{field_prefix}prefer_wait", f"must be positive (got {a.prefer_wait_ms} ms)")
    return a


def validate(p: AffinityPolicy) -> AffinityPolicy:
    check(p.default, "affinity.default.")
    for name, a in p.pools:
        if not name:
            raise InvalidArgument("pool", "is required (an empty pool name)")
        check(a, f"affinity.pools[{name}].")
    if len({n for n, _ in p.pools}) != len(p.pools):
        raise InvalidArgument("pool", "names a pool twice")
    return p


def parse_mode(text: str) -> Mode:
    try:
        return Mode(text)
    except ValueError:
        raise InvalidArgument("mode", f"is {text!r}; one of strict, prefer, any") from None
