"""Which partitions this planner should claim or release: a pure function of one snapshot.

Every planner computes the same targets from the same membership view: an even share
`P // n`, with the `P % n` remainder going to the first planners in node-id order. A planner below
its target claims free partitions; one above it releases the surplus. Which ones is chosen by
rendezvous hashing (highest `stable_u64(node, partition)` first), so a membership change moves
only the partitions it has to and a restarted planner tends to get its old ones back.

`settling`: eligible planners inside their rebalance hold-down (seen joining less than
`rebalance_holddown` ago). They claim free partitions at once, but nobody releases a partition to make
room for them until the hold-down is over: a restarted planner's start-up burst (imports, loading its
first partitions) is the worst moment to hand it more, and a planner that flaps would otherwise move
partitions on every return. Every partition stays owned meanwhile. A planner that is itself inside the
hold-down of its own session passes an empty `settling` set (planner/ownership.py): after a cold start,
the first planner up holds everything, and handing it on at once spreads the backlog fastest.

`eligible`: planners that may own partitions now (live, of the region policy's primary region, not
drained, clock in bounds; planner/region_guard.py and clock_guard.py). A planner
that is not eligible has a target of zero and releases everything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from scheduler.timeplan.hashing import stable_u64


@dataclass(frozen=True)
class OwnershipSnapshot:
    partitions: int
    me: str
    eligible: tuple[str, ...]  # planners that may own partitions now (live, right region, not draining)
    owners: Mapping[int, str]  # partition -> current owner's node id; absent = free
    settling: frozenset[str] = frozenset()  # eligible planners inside their hold-down (see the module doc)


@dataclass(frozen=True)
class RebalanceDecision:
    target: int
    claim: tuple[int, ...]
    release: tuple[int, ...]


def score(node_id: str, partition: int) -> int:
    return stable_u64(f"{node_id}\x00{partition}")


def target_share(partitions: int, eligible: tuple[str, ...], node_id: str) -> int:
    nodes = sorted(set(eligible))
    if node_id not in nodes:
        return 0
    base, extra = divmod(partitions, len(nodes))
    return base + (1 if nodes.index(node_id) < extra else 0)


def decide(s: OwnershipSnapshot) -> RebalanceDecision:
    target = target_share(s.partitions, s.eligible, s.me)
    # What we keep is our share among the planners that have settled: a settling one gets no partition
    # of ours yet. Never below `target` (fewer planners, no smaller share), so claims and releases agree.
    keep = target_share(s.partitions, tuple(n for n in s.eligible if n == s.me or n not in s.settling), s.me)
    mine = [p for p, owner in s.owners.items() if owner == s.me]
    if len(mine) > keep:
        mine.sort(key=lambda p: score(s.me, p))
        return RebalanceDecision(target, (), tuple(sorted(mine[: len(mine) - keep])))
    if len(mine) < target:
        free = [p for p in range(s.partitions) if p not in s.owners]
        free.sort(key=lambda p: score(s.me, p), reverse=True)
        return RebalanceDecision(target, tuple(sorted(free[: target - len(mine)])), ())
    return RebalanceDecision(target, (), ())
