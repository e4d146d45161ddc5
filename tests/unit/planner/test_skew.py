"""The clock-skew guard's pure decisions (scheduler/planner/skew.py): majority, lone planner, hysteresis,
and the bound on the planning clock between a jump and the round that trips the guard."""

from __future__ import annotations

import pytest

from scheduler.planner.skew import STABLE_ROUNDS, Anchor, Hysteresis, Verdict, bounded_now, judge

SKEW = 1_000


def test_lone_planner_cannot_judge_itself_and_keeps_planning() -> None:
    v = judge({}, SKEW)
    assert not v.judged and v.in_bounds and v.consensus_ms is None


def test_skewed_planner_against_two_agreeing_peers_is_out() -> None:
    v = judge({"a": 30_010, "b": 29_990}, SKEW)  # my clock is 30 s ahead of both
    assert v.judged and not v.in_bounds and v.consensus_ms == 30_000 and v.majority == 2


def test_good_planner_with_one_skewed_peer_is_in() -> None:
    v = judge({"a": 5, "skewed": -30_000}, SKEW)
    assert v.judged and v.in_bounds and v.consensus_ms is not None and abs(v.consensus_ms) <= 5


def test_behind_is_out_too() -> None:
    assert not judge({"a": -30_000, "b": -30_004}, SKEW).in_bounds


def test_two_planners_that_disagree_have_no_majority() -> None:
    # 1 of 2 is not more than half: neither can tell whose clock is wrong, so neither stands down.
    for offsets in ({"other": 30_000}, {"other": -30_000}):
        v = judge(offsets, SKEW)
        assert not v.judged and v.in_bounds


def test_three_different_clocks_nobody_stands_down() -> None:
    for offsets in ({"a": 30_000, "b": -30_000}, {"a": -30_000, "b": -60_000}, {"a": 30_000, "b": 60_000}):
        assert judge(offsets, SKEW).in_bounds


def test_peers_that_did_not_answer_count_but_never_vote() -> None:
    # 5 planners: my 2 answering peers agree against me, but 2 of 5 is no majority.
    v = judge({"a": 30_000, "b": 30_000, "c": None, "d": None}, SKEW)
    assert not v.judged and v.in_bounds and v.peers == 4 and v.answered == 2
    # With a third answering peer that agrees with them, they are 3 of 5.
    assert not judge({"a": 30_000, "b": 30_000, "c": 30_100, "d": None}, SKEW).in_bounds


def test_disagreeing_peers_must_agree_with_each_other() -> None:
    # 3 of 4 peers are off, but each by a different amount: no group of more than half agrees.
    v = judge({"a": 5_000, "b": 10_000, "c": 15_000, "d": 0}, SKEW)
    assert not v.judged and v.in_bounds


def test_within_the_bound_is_in() -> None:
    v = judge({"a": 900, "b": 950}, SKEW)  # the three clocks agree within 1 s
    assert v.judged and v.in_bounds


def test_just_over_the_bound_is_out() -> None:
    assert not judge({"a": 1_200, "b": 1_300}, SKEW).in_bounds


@pytest.mark.parametrize("n", [3, 5, 7])
def test_one_skewed_planner_among_n_is_the_only_one_out(n: int) -> None:
    clocks = {f"p{i}": (30_000 if i == 0 else i * 10) for i in range(n)}
    out = [me for me, mine in clocks.items()
           if not judge({o: mine - c for o, c in clocks.items() if o != me}, SKEW).in_bounds]
    assert out == ["p0"]


def _v(in_bounds: bool, judged: bool = True) -> Verdict:
    return Verdict(judged, in_bounds, 0 if in_bounds else 30_000, 2, 2, 2)


def test_hysteresis_trips_at_once_and_comes_back_after_the_stable_period() -> None:
    h = Hysteresis(stable_s=3.0)
    assert h.eligible
    assert h.feed(_v(False), 0.0) and not h.eligible
    assert not h.feed(_v(True), 1.0)
    assert not h.feed(_v(True), 2.0)
    assert not h.feed(_v(True), 3.0), "3 rounds, but only 2 s since the first good one"
    assert h.feed(_v(True), 4.0) and h.eligible


def test_hysteresis_a_bad_round_starts_the_stable_period_over() -> None:
    h = Hysteresis(stable_s=0.0)
    h.feed(_v(False), 0.0)
    h.feed(_v(True), 1.0)
    h.feed(_v(True), 2.0)
    h.feed(_v(False), 3.0)
    for t in range(4, 4 + STABLE_ROUNDS - 1):
        assert not h.feed(_v(True), float(t))
    assert h.feed(_v(True), 10.0) and h.eligible


def test_hysteresis_unjudged_rounds_count_towards_coming_back() -> None:
    # The peers went away: a planner that cannot judge itself keeps (here: resumes) planning.
    h = Hysteresis(stable_s=0.0)
    h.feed(_v(False), 0.0)
    for t in range(1, STABLE_ROUNDS + 1):
        h.feed(Verdict(False, True, None, 0, 0, 1), float(t))  # no live peer left
    assert h.eligible
    h.feed(_v(False), 10.0)
    for t in range(11, 11 + STABLE_ROUNDS):
        h.feed(Verdict(False, True, None, 1, 1, 1), float(t))  # one peer left, which disagrees: no majority
    assert h.eligible


def test_hysteresis_unanswered_probes_neither_bring_back_nor_reset() -> None:
    h = Hysteresis(stable_s=0.0)
    h.feed(_v(False), 0.0)
    h.feed(_v(True), 1.0)
    for t in range(2, 12):  # the peers are too slow to answer: no information
        assert not h.feed(Verdict(False, True, None, 2, 0, 1), float(t))
    assert not h.eligible
    for t in range(12, 12 + STABLE_ROUNDS - 1):
        h.feed(_v(True), float(t))
    assert h.eligible, "the good round before the silence still counts"


def test_bounded_now_holds_a_jumped_clock_near_the_majority() -> None:
    anchor = Anchor(majority_wall_ms=1_000_000, mono=100.0)
    # 2 s later by the monotonic clock the majority is at 1_002_000; our clock jumped +30 s.
    assert bounded_now(1_032_000, anchor, 102.0, SKEW) == 1_003_000
    assert bounded_now(972_000, anchor, 102.0, SKEW) == 1_001_000  # -30 s: at most 1 s late
    assert bounded_now(1_002_400, anchor, 102.0, SKEW) == 1_002_400  # within the bound: untouched
    assert bounded_now(1_032_000, None, 102.0, SKEW) == 1_032_000  # no majority known: nothing to bound by
