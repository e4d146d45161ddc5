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
hold-down of its own session leaves out of `settling` the peers that already have a worker stream
(planner/ownership.py): after a cold start, the first planner up holds everything, and handing it on at once
spreads the backlog fastest; to a peer with no worker yet, what it would be handed would only wait.

`long_free`: partitions this planner has seen free for longer than `orphan_grace`. Normally a free
partition is claimed within a round by the planner whose share it is; one left free that long has a
claimer that is not claiming (a flapping member whose session keeps re-joining behind a flaky link, a
planner too busy to get a txn through). Any eligible planner then claims it beyond its share (a
*rescue*; etcd's create-if-absent picks one winner), and nobody releases a partition to a peer while
partitions stay free, since that peer is evidently not taking what is already there. A rescued partition
does not count against the rescuer's share for `rescue_hold` (`rescued`): without that, the very next
round would release it again (claim/release ping-pong). When the hold is over it is surplus like any
other and goes back to its planner, who by then either claims it or leaves it free for the next rescue.
A game day saw the flapping member's share stay free 4.5 s (its runs started 8-22 s late) before this.

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
    long_free: frozenset[int] = frozenset()  # free for longer than orphan_grace (see the module doc)
    rescued: frozenset[int] = frozenset()  # ours, claimed as rescues within rescue_hold: not surplus yet


@dataclass(frozen=True)
class RebalanceDecision:
    target: int
    claim: tuple[int, ...]
    release: tuple[int, ...]
    rescue: tuple[int, ...] = ()  # the claims that are rescues of long-free partitions (a subset of claim)


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
    held = [p for p in mine if p not in s.rescued]  # recent rescues are not surplus yet
    long_free = [p for p in s.long_free if p not in s.owners]
    # Surplus goes to the peers that are short, unless partitions stay free meanwhile: a short peer that
    # is not claiming what is free would not claim ours either. Leaving (not eligible, draining) always.
    if len(held) > keep and (keep == 0 or not long_free):
        held.sort(key=lambda p: score(s.me, p))
        return RebalanceDecision(target, (), tuple(sorted(held[: len(held) - keep])))
    claim: list[int] = []
    if len(mine) < target:
        free = [p for p in range(s.partitions) if p not in s.owners]
        free.sort(key=lambda p: score(s.me, p), reverse=True)
        claim = free[: target - len(mine)]
    rescue: list[int] = []
    if target > 0:
        taken = set(claim)
        rescue = sorted((p for p in long_free if p not in taken), key=lambda p: score(s.me, p), reverse=True)
    return RebalanceDecision(target, tuple(sorted(claim)) + tuple(rescue), (), tuple(rescue))
