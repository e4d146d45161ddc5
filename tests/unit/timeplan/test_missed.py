"""Missed-run decisions: named cases around a fixed anchor, plus an exhaustive accounting property."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.errors import InvalidArgument
from scheduler.timeplan import MissedRuns, SkipReason, parse_spec
from scheduler.timeplan.missed import MissedKind, SkipRange, cut_out, decide_missed, split_around

MIN = 60_000
HOUR = 60 * MIN
T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
EVERY_MINUTE = parse_spec("* * * * *")


def test_nothing_missed() -> None:
    d = decide_missed(EVERY_MINUTE, T0, T0 + 30_000, MissedRuns.ALL, None, 5)
    assert d.kind is MissedKind.NONE and d.run == () and d.skipped == ()
    assert d.next_wakeup_ms == T0 + MIN


def test_now_before_last_is_none() -> None:
    d = decide_missed(EVERY_MINUTE, T0, T0 - HOUR, MissedRuns.ALL, None, 5)
    assert d.kind is MissedKind.NONE
    assert d.next_wakeup_ms == T0 + MIN


def test_skip_policy_records_everything() -> None:
    d = decide_missed(EVERY_MINUTE, T0, T0 + 10 * MIN, MissedRuns.SKIP, None, 5)
    assert d.run == ()
    assert d.skipped == (SkipRange(SkipReason.POLICY_SKIP, T0, T0 + 10 * MIN),)
    assert d.kind is MissedKind.FEW


def test_latest_runs_the_newest_once() -> None:
    d = decide_missed(EVERY_MINUTE, T0, T0 + 10 * MIN + 5, MissedRuns.LATEST, None, 5)
    assert d.run == (T0 + 10 * MIN,)
    assert d.skipped == (SkipRange(SkipReason.POLICY_SKIP, T0, T0 + 10 * MIN - 1),)


def test_latest_with_a_single_miss_skips_nothing() -> None:
    d = decide_missed(EVERY_MINUTE, T0, T0 + MIN, MissedRuns.LATEST, None, 5)
    assert d.run == (T0 + MIN,) and d.skipped == ()


def test_all_under_cap_runs_all() -> None:
    d = decide_missed(EVERY_MINUTE, T0, T0 + 3 * MIN, MissedRuns.ALL, None, 5)
    assert d.kind is MissedKind.FEW
    assert d.run == (T0 + MIN, T0 + 2 * MIN, T0 + 3 * MIN)
    assert d.skipped == ()


def test_all_over_cap_keeps_the_newest() -> None:
    d = decide_missed(EVERY_MINUTE, T0, T0 + 10 * MIN, MissedRuns.ALL, None, 3)
    assert d.kind is MissedKind.TOO_MANY
    assert d.run == (T0 + 8 * MIN, T0 + 9 * MIN, T0 + 10 * MIN)
    assert d.skipped == (SkipRange(SkipReason.OVER_CAP, T0, T0 + 8 * MIN - 1),)


def test_exactly_cap_is_few() -> None:
    d = decide_missed(EVERY_MINUTE, T0, T0 + 3 * MIN, MissedRuns.ALL, None, 3)
    assert d.kind is MissedKind.FEW and len(d.run) == 3


def test_window_skips_old_times() -> None:
    d = decide_missed(EVERY_MINUTE, T0, T0 + 10 * MIN, MissedRuns.ALL, 2 * MIN + 1, 100)
    assert d.run == (T0 + 8 * MIN, T0 + 9 * MIN, T0 + 10 * MIN)
    assert d.skipped == (SkipRange(SkipReason.OUTSIDE_CATCHUP_WINDOW, T0, T0 + 8 * MIN - 1),)


def test_everything_outside_window() -> None:
    hourly = parse_spec("0 * * * *")
    d = decide_missed(hourly, T0, T0 + 2 * HOUR + 30 * MIN, MissedRuns.LATEST, 10 * MIN, 1)
    assert d.run == ()
    assert d.skipped == (SkipRange(SkipReason.OUTSIDE_CATCHUP_WINDOW, T0, T0 + 2 * HOUR + 20 * MIN),)
    assert d.next_wakeup_ms == T0 + 3 * HOUR


def test_week_long_outage_of_a_per_second_job_is_cheap() -> None:
    every_second = parse_spec("* * * * * *")
    d = decide_missed(every_second, T0, T0 + 7 * 24 * HOUR, MissedRuns.ALL, None, 10)
    assert len(d.run) == 10 and d.kind is MissedKind.TOO_MANY
    assert len(d.skipped) == 1  # one compact range, not 604,790 records


def test_bad_cap_and_window() -> None:
    with pytest.raises(ValueError, match="catchup_cap"):
        decide_missed(EVERY_MINUTE, T0, T0 + MIN, MissedRuns.ALL, None, 0)
    with pytest.raises(ValueError, match="catchup_window"):
        decide_missed(EVERY_MINUTE, T0, T0 + MIN, MissedRuns.ALL, -1, 1)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.sampled_from(["* * * * *", "*/7 * * * *", "0 * * * *", "*/20 * * * * *"]),
    st.integers(0, 3 * HOUR),
    st.sampled_from(list(MissedRuns)),
    st.one_of(st.none(), st.integers(0, 2 * HOUR)),
    st.integers(1, 20),
)
def test_every_missed_time_is_run_or_skipped_exactly_once(
    spec: str, span: int, policy: MissedRuns, window: int | None, cap: int
) -> None:
    plan = parse_spec(spec)
    d = decide_missed(plan, T0, T0 + span, policy, window, cap)
    missed = list(plan.between_ms(T0, T0 + span))
    accounted: list[int] = list(d.run)
    for r in d.skipped:
        accounted += list(plan.between_ms(r.after_ms, r.through_ms))
    assert sorted(accounted) == missed, "each missed planned time is run or skipped, exactly once"
    assert len(d.run) <= (1 if policy is MissedRuns.LATEST else cap)
    if policy is MissedRuns.SKIP:
        assert d.run == ()
    if window is not None:
        assert all(t > T0 + span - window for t in d.run)
    assert (d.kind is MissedKind.NONE) == (not missed)


@given(lo=st.integers(0, 30), width=st.integers(0, 30),
       recorded=st.lists(st.integers(-5, 70), unique=True).map(sorted))
def test_split_around_leaves_exactly_the_recorded_instants_out(lo: int, width: int, recorded: list[int]) -> None:
    """Every planned instant of the range is covered by exactly one piece unless it has a record of its
    own, and no piece covers a recorded one (a claim's catch-up must not skip a run written ahead)."""
    r = SkipRange(SkipReason.POLICY_SKIP, T0 + lo * 1000, T0 + (lo + width) * 1000)
    times = [T0 + t * 1000 for t in recorded]
    pieces = split_around(r, times)
    assert all(p.reason is r.reason and p.after_ms < p.through_ms for p in pieces)
    every_second = parse_spec("* * * * * *")
    covered = [t for p in pieces for t in every_second.between_ms(p.after_ms, p.through_ms)]
    assert covered == sorted(set(covered))  # no instant in two pieces
    wanted = [t for t in every_second.between_ms(r.after_ms, r.through_ms) if t not in times]
    assert covered == wanted


def test_split_around_a_run_written_ahead() -> None:
    r = SkipRange(SkipReason.POLICY_SKIP, T0 + 4_123, T0 + 6_363)
    assert split_around(r, [T0 + 5_000]) == [SkipRange(SkipReason.POLICY_SKIP, T0 + 4_123, T0 + 4_999),
                                            SkipRange(SkipReason.POLICY_SKIP, T0 + 5_000, T0 + 6_363)]
    assert split_around(r, [T0 + 1_000, T0 + 9_000]) == [r]


@given(st.integers(0, 30), st.integers(0, 30),
       st.lists(st.tuples(st.integers(0, 60_000), st.integers(0, 20_000)), max_size=4))
def test_cut_out_leaves_exactly_the_instants_other_skips_cover_out(lo: int, width: int,
                                                                   others: list[tuple[int, int]]) -> None:
    """Every planned instant of the range is covered by exactly one piece unless another skip record covers it,
    and no piece covers one that does (a claim's catch-up must not record a time a dead owner's skip decided)."""
    r = SkipRange(SkipReason.OUTSIDE_CATCHUP_WINDOW, T0 + lo * 1000, T0 + (lo + width) * 1000)
    covered_by = [(T0 + a, T0 + a + w) for a, w in others]
    pieces = cut_out(r, covered_by)
    assert all(p.reason is r.reason and p.after_ms < p.through_ms for p in pieces)
    every_second = parse_spec("* * * * * *")
    covered = [t for p in pieces for t in every_second.between_ms(p.after_ms, p.through_ms)]
    assert covered == sorted(set(covered))
    wanted = [t for t in every_second.between_ms(r.after_ms, r.through_ms)
              if not any(a < t <= b for a, b in covered_by)]
    assert covered == wanted


def test_cut_out_a_dead_owners_skip() -> None:
    r = SkipRange(SkipReason.OUTSIDE_CATCHUP_WINDOW, T0 + 18_888, T0 + 23_047)
    assert cut_out(r, [(T0 + 18_999, T0 + 19_011), (T0 + 19_011, T0 + 20_116)]) == [
        SkipRange(SkipReason.OUTSIDE_CATCHUP_WINDOW, T0 + 18_888, T0 + 18_999),
        SkipRange(SkipReason.OUTSIDE_CATCHUP_WINDOW, T0 + 20_116, T0 + 23_047)]
    assert cut_out(r, [(T0 + 1_000, T0 + 18_888), (T0 + 23_047, T0 + 30_000)]) == [r]
    assert cut_out(r, [(T0, T0 + 30_000)]) == []


def test_inherited_runs_go_through_the_policy_with_the_catch_up() -> None:
    """A claim's decision over the runs a dead owner wrote ahead (planner/inherited.py): the catch-up's runs are
    the newest, and count first."""
    from scheduler.timeplan.missed import decide_inherited

    times = [3_000, 1_000, 2_000]  # any order
    now = 10_000
    assert decide_inherited(times, 0, now, MissedRuns.SKIP) == dict.fromkeys((1_000, 2_000, 3_000),
                                                                               SkipReason.POLICY_SKIP)
    # latest: the newest inherited one runs only if the catch-up runs nothing
    assert decide_inherited(times, 0, now, MissedRuns.LATEST) == dict.fromkeys((1_000, 2_000),
                                                                                 SkipReason.POLICY_SKIP)
    assert decide_inherited(times, 1, now, MissedRuns.LATEST) == dict.fromkeys((1_000, 2_000, 3_000),
                                                                                 SkipReason.POLICY_SKIP)
    # all: the cap counts the catch-up's runs first, then the newest inherited ones
    assert decide_inherited(times, 1, now, MissedRuns.ALL, None, 3) == {1_000: SkipReason.OVER_CAP}
    assert decide_inherited(times, 3, now, MissedRuns.ALL, None, 3) == dict.fromkeys((1_000, 2_000, 3_000),
                                                                                      SkipReason.OVER_CAP)
    assert decide_inherited(times, 0, now, MissedRuns.ALL, None, 10) == {}  # a cap above them all: every one runs
    # the window counts back from now, whatever the policy
    assert decide_inherited(times, 0, now, MissedRuns.ALL, 8_500, 10) == {
        1_000: SkipReason.OUTSIDE_CATCHUP_WINDOW}
    assert decide_inherited(times, 0, now, MissedRuns.LATEST, 8_000) == {
        1_000: SkipReason.OUTSIDE_CATCHUP_WINDOW, 2_000: SkipReason.OUTSIDE_CATCHUP_WINDOW}
    assert decide_inherited([], 2, now, MissedRuns.SKIP) == {}
    with pytest.raises(InvalidArgument, match="catchup_cap"):
        decide_inherited(times, 0, now, MissedRuns.ALL, None, 0)
