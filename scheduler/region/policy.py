"""The region policy (`/cluster/region`, DESIGN.md "Regions"): the record, its JSON codec, its validation
and every decision taken from it, as pure functions of a snapshot (no I/O, no clock reads: `now_ms` and
what was observed are passed in), so that the table tests cover them without a cluster.

Which region plans: `policy.primary`. No record at all means "no policy": every planner is eligible, as
before regions existed, so a single-region cluster needs nothing. The record changes only by a
compare-and-swap on its mod_revision (scheduler/region/store.py): two standbys that both decide to take
over write against the same revision and exactly one wins.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from scheduler.errors import InvalidArgument
from scheduler.region import affinity as ra
from scheduler.region.affinity import AffinityPolicy
from scheduler.region.compat import Extra, Unread, describe, merged, read_enum, restored, unknown

# "A few lease TTLs" of the default lease (5 s): a primary planner that is merely slow to renew, or
# restarting, must not cause a failover.
DEFAULT_FAILOVER_GRACE_MS = 15_000
# How long the old primary must have had live planners, without a gap, before failback=auto moves
# planning back: long enough that a region which flaps (up, down, up) cannot bounce ownership.
DEFAULT_FAILBACK_STABLE_MS = 60_000
HISTORY_MAX = 20  # the record stays small: it is read by every planner on every change


class Failback(StrEnum):
    MANUAL = "manual"  # an operator runs `schedctl region failback`
    AUTO = "auto"  # the old primary takes planning back once it has been healthy for failback_stable_ms


class ChangeKind(StrEnum):
    SWITCHOVER = "switchover"
    FAILOVER = "automatic failover"
    FAILBACK = "failback"
    # Worker affinity changed (from == to == the primary): planning did not move. Not a "move" for
    # failback's purposes (see `last_move`).
    AFFINITY = "affinity"


MOVES = frozenset({ChangeKind.SWITCHOVER, ChangeKind.FAILOVER, ChangeKind.FAILBACK})

# A history entry's kind: a ChangeKind member when this version knows it, else the text a newer version
# wrote (kept, shown, written back; never a move, since only `primary` says where planning is).
Kind = ChangeKind | str


def kind_of(text: str) -> Kind:
    try:
        return ChangeKind(text)
    except ValueError:
        return text


_CHANGE_KEYS = frozenset({"at_ms", "kind", "from", "to", "by", "reason"})
_POLICY_KEYS = frozenset({"primary", "standby", "failover_grace_ms", "failback", "failback_stable_ms", "history",
                          "reason", "updated_ms", "affinity"})


@dataclass(frozen=True)
class Change:
    """One entry of the policy's history."""

    at_ms: int
    kind: Kind
    from_region: str  # "" for the first policy ever written
    to_region: str
    by: str  # node id of the writer (the planner that took over, or the API node that took the call)
    reason: str = ""  # operator's free text
    extra: Extra = field(default_factory=dict, hash=False)  # keys a newer version wrote (region/compat.py)

    def to_json(self) -> dict[str, object]:
        return merged(self.extra, {"at_ms": self.at_ms, "kind": str(self.kind), "from": self.from_region,
                                   "to": self.to_region, "by": self.by, "reason": self.reason})

    @staticmethod
    def from_json(d: Mapping[str, object]) -> Change:
        return Change(int(str(d.get("at_ms", 0))), kind_of(str(d.get("kind", ChangeKind.SWITCHOVER.value))),
                      str(d.get("from", "")), str(d.get("to", "")), str(d.get("by", "")), str(d.get("reason", "")),
                      unknown(d, _CHANGE_KEYS))


@dataclass(frozen=True)
class RegionPolicy:
    primary: str
    standby: tuple[str, ...] = ()  # in failover order
    failover_grace_ms: int = DEFAULT_FAILOVER_GRACE_MS
    failback: Failback = Failback.MANUAL
    failback_stable_ms: int = DEFAULT_FAILBACK_STABLE_MS
    history: tuple[Change, ...] = field(default=())  # oldest first, at most HISTORY_MAX
    affinity: AffinityPolicy = field(default=AffinityPolicy())  # worker affinity per pool (region/affinity.py)
    extra: Extra = field(default_factory=dict, hash=False)  # keys a newer version wrote (region/compat.py)
    # A failback mode a newer version wrote (region/compat.py): read as `manual`, which never moves
    # planning on its own.
    unread: Unread = field(default_factory=dict, hash=False)

    @property
    def last(self) -> Change | None:
        return self.history[-1] if self.history else None

    @property
    def last_move(self) -> Change | None:
        """The last change that moved planning: an affinity change after a failover must neither make
        failback go nowhere nor stop failback=auto."""
        for c in reversed(self.history):
            if c.kind in MOVES:
                return c
        return None

    @property
    def updated_ms(self) -> int:
        return self.last.at_ms if self.last else 0

    @property
    def reason(self) -> str:
        """What GetClusterStatus reports as the policy's reason: the operator's text, else the kind."""
        c = self.last
        return "" if c is None else (c.reason or str(c.kind))

    @property
    def previous_primary(self) -> str:
        """The region that planned before the last move ("" if none): what failback goes back to."""
        c = self.last_move
        return "" if c is None else c.from_region

    def regions(self) -> tuple[str, ...]:
        return (self.primary, *self.standby)

    def unread_values(self) -> list[str]:
        """Values a newer version wrote that this one reads as a fallback (region/compat.py)."""
        return describe(self.unread) + self.affinity.unread_values()


# ---- codec ------------------------------------------------------------------------------------------


def encode(p: RegionPolicy) -> bytes:
    # `reason` and `updated_ms` repeat the last change for readers of the pre-regions format.
    return json.dumps(restored(p.unread, merged(p.extra, {
        "primary": p.primary, "standby": list(p.standby), "failover_grace_ms": p.failover_grace_ms,
        "failback": p.failback.value, "failback_stable_ms": p.failback_stable_ms,
        "history": [c.to_json() for c in p.history], "reason": p.reason, "updated_ms": p.updated_ms,
        "affinity": p.affinity.to_json()})), separators=(",", ":")).encode()


def decode(value: bytes) -> RegionPolicy:
    """Also reads the record AdminService.Switchover wrote before regions were acted on
    (`{"primary", "reason", "updated_ms"}`): it becomes a policy with defaults and one history entry.
    What a newer version added (a history kind, a key anywhere in the record) is kept for `encode`
    (region/compat.py)."""
    d = json.loads(value)
    if not isinstance(d, dict):
        raise ValueError(f"the region policy is not a JSON object: {type(d).__name__}")
    history = tuple(Change.from_json(c) for c in d.get("history", ()))
    unread: dict[str, tuple[object, object]] = {}
    failback = read_enum(d, "failback", Failback, Failback.MANUAL, unread)
    if not history and d.get("updated_ms"):
        history = (Change(int(d["updated_ms"]), ChangeKind.SWITCHOVER, "", str(d.get("primary", "")), "",
                          str(d.get("reason", ""))),)
    return RegionPolicy(primary=str(d.get("primary", "")), standby=tuple(str(r) for r in d.get("standby", ())),
                        failover_grace_ms=int(d.get("failover_grace_ms", DEFAULT_FAILOVER_GRACE_MS)),
                        failback=failback,
                        failback_stable_ms=int(d.get("failback_stable_ms", DEFAULT_FAILBACK_STABLE_MS)),
                        history=history, affinity=AffinityPolicy.from_json(d.get("affinity")),
                        extra=unknown(d, _POLICY_KEYS), unread=unread)


def validate(p: RegionPolicy) -> RegionPolicy:
    """Raises InvalidArgument naming the field; returns `p` for chaining."""
    if not p.primary:
        raise InvalidArgument("primary", "is required")
    if p.primary in p.standby:
        raise InvalidArgument("standby", f"lists the primary region {p.primary!r}")
    if len(set(p.standby)) != len(p.standby):
        raise InvalidArgument("standby", "lists a region twice")
    if any(not r for r in p.standby):
        raise InvalidArgument("standby", "has an empty region name")
    if p.failover_grace_ms <= 0:
        raise InvalidArgument("failover_grace", f"must be positive (got {p.failover_grace_ms} ms)")
    if p.failback_stable_ms <= 0:
        raise InvalidArgument("failback_stable", f"must be positive (got {p.failback_stable_ms} ms)")
    if len(p.history) > HISTORY_MAX:
        raise InvalidArgument("history", f"holds {len(p.history)} entries; the bound is {HISTORY_MAX}")
    ra.validate(p.affinity)
    return p


# ---- decisions ----------------------------------------------------------------------------------------


def eligible_region(policy: RegionPolicy | None, region: str) -> bool:
    """May a planner of `region` own partitions (the clock guard and drains aside)? No policy: yes."""
    return policy is None or policy.primary == region


def moved(policy: RegionPolicy, to: str, kind: ChangeKind, *, by: str, now_ms: int, reason: str = "") -> RegionPolicy:
    """The policy after planning moves to `to`. The old primary takes `to`'s place in the standby order
    (a region that is not listed goes first), so the list stays a permutation of the known regions and
    a later failover can go back to it (after anything listed before it)."""
    old = policy.primary
    standby = list(policy.standby)
    if to in standby:
        standby[standby.index(to)] = old
    else:
        standby.insert(0, old)
    standby = [r for r in dict.fromkeys(standby) if r and r != to]
    change = Change(now_ms, kind, old, to, by, reason)
    return replace(policy, primary=to, standby=tuple(standby), history=appended(policy.history, change))


def appended(history: tuple[Change, ...], change: Change) -> tuple[Change, ...]:
    """`history` plus `change`, bounded to HISTORY_MAX, dropping the oldest entries but never the newest
    move: a run of affinity changes must not erase where failback goes."""
    out = [*history, change]
    while len(out) > HISTORY_MAX:
        moves = [i for i, c in enumerate(out) if c.kind in MOVES]
        keep = moves[-1] if moves else -1
        out.pop(1 if keep == 0 else 0)
    return tuple(out)


def with_affinity(policy: RegionPolicy, pool: str | None, a: ra.Affinity | None, *, by: str, now_ms: int,
                  reason: str = "") -> RegionPolicy:
    """The policy with the default affinity (`pool` None) or one pool's override set (`a` None: the
    override removed), and a history entry saying what changed; planning does not move."""
    if pool is None:
        if a is None:
            raise InvalidArgument("mode", "is required for the default affinity")
        new_aff = replace(policy.affinity, default=a)
        what = f"default affinity: {a.text()} (was {policy.affinity.default.text()})"
    else:
        new_aff = policy.affinity.with_pool(pool, a)
        was = policy.affinity.for_pool(pool).text()
        what = f"pool {pool}: {a.text() if a else 'the default'} (was {was})"
    text = f"{what}; {reason}" if reason else what
    change = Change(now_ms, ChangeKind.AFFINITY, policy.primary, policy.primary, by, text)
    return replace(policy, affinity=new_aff, history=appended(policy.history, change))


def initial(to: str, known: tuple[str, ...], *, by: str, now_ms: int, reason: str = "") -> RegionPolicy:
    """The first policy ever written (a switchover with no record yet): the other known regions stand by
    in name order."""
    return RegionPolicy(primary=to, standby=tuple(sorted(r for r in set(known) if r != to)),
                        history=(Change(now_ms, ChangeKind.SWITCHOVER, "", to, by, reason),))


@dataclass(frozen=True)
class RegionView:
    """What one planner observed of the cluster (members/ and its own memory of it), at `now_ms`."""

    now_ms: int
    live: Mapping[str, int]  # region -> planners holding a live session now (not suspended, not drained)
    # When a planner of the primary region last held a live session (or when this planner began looking).
    primary_last_seen_ms: int
    # Region -> since when it has had live planners without a gap.
    healthy_since_ms: Mapping[str, int] = field(default_factory=dict)


def failover_target(policy: RegionPolicy, view: RegionView) -> str | None:
    """The standby region that should take over now, or None. Only once the primary has had no live
    planner for failover_grace_ms; the first standby in order with live planners."""
    if view.live.get(policy.primary, 0) > 0:
        return None
    if view.now_ms - view.primary_last_seen_ms < policy.failover_grace_ms:
        return None
    for r in policy.standby:
        if view.live.get(r, 0) > 0:
            return r
    return None


def failback_target(policy: RegionPolicy, view: RegionView) -> str | None:
    """With failback=auto: the region an automatic failover moved planning away from, once it has had live
    planners for failback_stable_ms without a gap, counted from no earlier than the failover itself (so a
    region that never went fully down while the failover happened must still prove itself)."""
    c = policy.last_move
    if policy.failback is not Failback.AUTO or c is None or c.kind is not ChangeKind.FAILOVER:
        return None
    home = c.from_region
    if not home or home == policy.primary or view.live.get(home, 0) == 0:
        return None
    since = view.healthy_since_ms.get(home)
    if since is None:
        return None
    if view.now_ms - max(since, c.at_ms) < policy.failback_stable_ms:
        return None
    return home


def decide(policy: RegionPolicy | None, view: RegionView, my_region: str) -> tuple[str, ChangeKind] | None:
    """What a planner of `my_region` should write now, if anything: only the region that would take
    planning over writes (the others would only race it), and only one move at a time."""
    if policy is None:
        return None
    to = failover_target(policy, view)
    if to is not None:
        return (to, ChangeKind.FAILOVER) if to == my_region else None
    back = failback_target(policy, view)
    if back is not None and back == my_region:
        return back, ChangeKind.FAILBACK
    return None
