"""The rebalance decision is pure: named snapshots in, claims and releases out."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.planner.rebalance import OwnershipSnapshot, decide, target_share


def snap(me: str, eligible: tuple[str, ...], owners: dict[int, str], p: int = 8) -> OwnershipSnapshot:
    return OwnershipSnapshot(p, me, eligible, owners)


def test_alone_claims_everything() -> None:
    d = decide(snap("a", ("a",), {}))
    assert d.target == 8
    assert d.claim == tuple(range(8))
    assert d.release == ()


def test_newcomer_waits_for_free_partitions() -> None:
    d = decide(snap("b", ("a", "b"), dict.fromkeys(range(8), "a")))
    assert d.target == 4
    assert d.claim == ()


def test_owner_releases_surplus_when_a_planner_joins() -> None:
    d = decide(snap("a", ("a", "b"), dict.fromkeys(range(8), "a")))
    assert len(d.release) == 4
    assert d.claim == ()


def test_claims_only_its_deficit() -> None:
    owners = {0: "a", 1: "a", 2: "a", 3: "a"}
    d = decide(snap("b", ("a", "b"), owners))
    assert len(d.claim) == 4
    assert set(d.claim) == {4, 5, 6, 7}


def test_remainder_goes_to_the_first_nodes_in_id_order() -> None:
    assert [target_share(10, ("a", "b", "c"), n) for n in "abc"] == [4, 3, 3]


def test_not_eligible_releases_everything() -> None:
    """A draining planner, or one outside the primary region, keeps nothing."""
    d = decide(snap("c", ("a", "b"), {0: "c", 1: "c"}))
    assert d.target == 0
    assert d.release == (0, 1)


def test_dead_owner_keys_vanish_with_the_lease_so_their_partitions_are_free() -> None:
    d = decide(snap("a", ("a",), {0: "a"}))
    assert d.claim == tuple(range(1, 8))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
def test_targets_sum_to_p(n: int) -> None:
    nodes = tuple(f"n{i}" for i in range(n))
    assert sum(target_share(256, nodes, x) for x in nodes) == 256


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(1, 6), st.integers(1, 64), st.randoms(use_true_random=False))
def test_converges_to_an_even_split(n: int, p: int, rnd: object) -> None:
    """Everyone applying its own decision round after round ends at an even, complete split."""
    import random

    assert isinstance(rnd, random.Random)
    nodes = [f"node-{i}" for i in range(n)]
    owners: dict[int, str] = {q: rnd.choice(nodes) for q in range(p) if rnd.random() < 0.5}
    for _ in range(4 * n + 4):
        for me in rnd.sample(nodes, len(nodes)):
            d = decide(OwnershipSnapshot(p, me, tuple(nodes), dict(owners)))
            for q in d.release:
                assert owners[q] == me
                del owners[q]
            for q in d.claim:
                assert q not in owners
                owners[q] = me
    counts = [sum(1 for o in owners.values() if o == x) for x in nodes]
    assert len(owners) == p
    assert max(counts) - min(counts) <= 1


# ---- the rebalance hold-down --------------------------------------------------------------------------


def test_nobody_makes_room_for_a_settling_planner() -> None:
    """A restarted planner (b) gets no partition of a's until its hold-down is over, and then gets its share."""
    owners = dict.fromkeys(range(8), "a")
    held = decide(OwnershipSnapshot(8, "a", ("a", "b"), owners, frozenset({"b"})))
    assert held.release == () and held.target == 4
    assert decide(OwnershipSnapshot(8, "b", ("a", "b"), owners, frozenset({"b"}))).claim == ()
    assert len(decide(OwnershipSnapshot(8, "a", ("a", "b"), owners)).release) == 4


def test_a_settling_planner_still_claims_free_partitions_at_once() -> None:
    """The hold-down never leaves a partition unowned: a dead owner's partitions are free, and the
    newcomer claims its share of them straight away."""
    owners = {p: "a" for p in range(4)}
    d = decide(OwnershipSnapshot(8, "b", ("a", "b"), owners, frozenset({"b"})))
    assert d.claim == (4, 5, 6, 7)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(1, 6), st.integers(1, 64), st.randoms(use_true_random=False))
def test_with_settling_planners_every_free_partition_is_still_claimed(n: int, p: int, rnd: object) -> None:
    """Whoever is settling, rounds of decisions end with every partition owned, none released to make room
    for a settling planner, and nobody above its share among the settled."""
    import random

    assert isinstance(rnd, random.Random)
    nodes = [f"node-{i}" for i in range(n)]
    settling = frozenset(x for x in nodes if rnd.random() < 0.5)
    owners: dict[int, str] = {q: rnd.choice(nodes) for q in range(p) if rnd.random() < 0.5}
    for _ in range(4 * n + 4):
        for me in rnd.sample(nodes, len(nodes)):
            d = decide(OwnershipSnapshot(p, me, tuple(nodes), dict(owners), settling))
            for q in d.release:
                del owners[q]
            for q in d.claim:
                assert q not in owners
                owners[q] = me
    assert len(owners) == p
    settled = tuple(x for x in nodes if x not in settling)
    for me in settled:
        keep = target_share(p, tuple(sorted({*settled, me})), me)
        assert sum(1 for o in owners.values() if o == me) <= max(keep, target_share(p, tuple(nodes), me))


def test_a_long_free_partition_is_rescued_beyond_the_share() -> None:
    """c is eligible but does not claim its share: a and b, at their own shares, take it once it is long free."""
    owners = {0: "a", 1: "a", 2: "a", 3: "b", 4: "b", 5: "b"}
    d = decide(OwnershipSnapshot(8, "a", ("a", "b", "c"), owners))
    assert d.claim == ()  # not long free yet: c's to claim
    d = decide(OwnershipSnapshot(8, "a", ("a", "b", "c"), owners, long_free=frozenset({6, 7})))
    assert set(d.claim) == {6, 7} and set(d.rescue) == {6, 7}
    assert d.release == ()


def test_a_planner_that_may_not_own_rescues_nothing() -> None:
    d = decide(OwnershipSnapshot(8, "z", ("a", "b"), {0: "a"}, long_free=frozenset({5})))
    assert d.target == 0 and d.claim == ()


def test_a_rescued_partition_is_not_surplus_until_its_hold_is_over() -> None:
    owners = {0: "a", 1: "a", 2: "a", 3: "a", 4: "b", 5: "b", 6: "b", 7: "b"}
    held = OwnershipSnapshot(8, "a", ("a", "b", "c"), owners, rescued=frozenset({3}))
    assert decide(held).release == ()  # a's share is 3 (8 over 3, remainder to a): 3 held + 1 rescued
    over = OwnershipSnapshot(8, "a", ("a", "b", "c"), owners)
    assert len(decide(over).release) == 1  # the hold is over: surplus, back to c


def test_no_surplus_is_released_while_partitions_stay_free() -> None:
    """A short peer that leaves free partitions unclaimed would not claim released ones either."""
    owners = dict.fromkeys(range(6), "a")
    stuck = OwnershipSnapshot(8, "a", ("a", "b"), owners, long_free=frozenset({7}))
    d = decide(stuck)
    assert d.release == () and d.rescue == (7,)
    leaving = OwnershipSnapshot(8, "a", ("b",), owners, long_free=frozenset({7}))
    assert len(decide(leaving).release) == 6  # not eligible: everything goes, free partitions or not


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.integers(2, 5), st.integers(2, 40), st.randoms(use_true_random=False))
def test_a_deaf_planner_share_is_served_without_ping_pong(n: int, p: int, rnd: object) -> None:
    """One eligible planner never claims. Simulated rounds of 0.5 s with the grace and hold the Ownership
    loop applies: every partition is owned again within a grace and a round of being freed, and a
    partition changes hands at most once per hold (no claim/release round after round)."""
    import random

    assert isinstance(rnd, random.Random)
    nodes = [f"node-{i}" for i in range(n)]
    deaf = rnd.choice(nodes)
    grace, hold, step = 1.0, 5.0, 0.5
    owners: dict[int, str] = {q: rnd.choice(nodes) for q in range(p) if rnd.random() < 0.5 and True}
    owners = {q: o for q, o in owners.items() if o != deaf}
    free_since: dict[int, float] = {}
    rescued: dict[str, dict[int, float]] = {x: {} for x in nodes}
    moves: dict[int, list[float]] = {q: [] for q in range(p)}
    longest_free = 0.0
    t = 0.0
    for _ in range(200):
        t += step
        for me in rnd.sample(nodes, len(nodes)):
            for q in range(p):
                if q in owners:
                    free_since.pop(q, None)
                else:
                    free_since.setdefault(q, t)
            mine_rescued = {q for q, at in rescued[me].items() if owners.get(q) == me and t - at < hold}
            snap_ = OwnershipSnapshot(p, me, tuple(nodes), dict(owners),
                                      long_free=frozenset(q for q, s in free_since.items() if t - s >= grace),
                                      rescued=frozenset(mine_rescued))
            d = decide(snap_)
            if me == deaf:
                continue  # it decides, but none of its claims get through
            for q in d.release:
                del owners[q]
                moves[q].append(t)
            for q in d.claim:
                if q not in owners:
                    owners[q] = me
                    if q in d.rescue:
                        rescued[me][q] = t
        if t > 10:  # after the start-up (the initial split)
            longest_free = max([longest_free, *(t - s for q, s in free_since.items() if q not in owners)])
    assert longest_free <= grace + 2 * step, f"a partition was free {longest_free:.1f} s"
    for q, ts in moves.items():
        late = [x for x in ts if x > 10]
        for x, y in itertools.pairwise(late):
            assert y - x >= hold, f"partition {q} released at {x} and again at {y}: ping-pong"
