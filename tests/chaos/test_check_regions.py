"""The checker's region rules (chaos/regions.py) on synthetic runs: only the planning region's planners
claim (I6 `[wrong-region]`, with the in-flight race the product allows), an F5 on the planning region
that no failover followed is invalid, and the report lists the policy's changes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from chaos.check import Verdict, _Checker, check_run
from chaos.record import FaultRecord, OpRecord, load_run, write_run
from chaos.report import render_markdown
from chaos.scenario import loads
from scheduler.region.affinity import Affinity, Mode
from scheduler.region.policy import Change, ChangeKind, RegionPolicy, encode, moved, with_affinity
from tests.chaos.synth import SCENARIO, T0, clean_run

FIRST = RegionPolicy("r1", ("r2",), failover_grace_ms=6000,
                     history=(Change(T0 - 7000, ChangeKind.SWITCHOVER, "", "r1", "drill"),))


def judged(directory: Path, policies: list[tuple[int, RegionPolicy]], faults: Sequence[FaultRecord] = ()) -> Verdict:
    x, _ = clean_run(directory, [(t, encode(p)) for t, p in policies])
    x.faults += faults
    run = x.build(directory)
    write_run(run)
    return check_run(load_run(run.directory))


def test_a_run_whose_claims_follow_the_policy_passes_and_lists_it(tmp_path: Path) -> None:
    v = judged(tmp_path / "run", [(T0 - 7000, FIRST)])
    assert v.result == "pass", (v.invalid, {k: i.examples for k, i in v.invariants.items() if i.count})
    assert [(c["primary"], c["kind"]) for c in v.stats["region_changes"]] == [("r1", "switchover")]
    assert "| r1 | switchover |" in render_markdown(v, None)


def test_a_claim_by_a_planner_outside_the_planning_region_fails_i6(tmp_path: Path) -> None:
    # Planning moves to r2 at T0 + 1 s; r1-p2's takeover claims at T0 + 22.5 s come 21.5 s later.
    v = judged(tmp_path / "run", [(T0 - 7000, FIRST),
                                  (T0 + 1000, moved(FIRST, "r2", ChangeKind.SWITCHOVER, by="api", now_ms=T0 + 1000))])
    assert v.result == "fail" and v.invariants["I6"].count == 2, v.invariants["I6"].examples
    assert all("[wrong-region]" in e and "r1-p2 of r1" in e for e in v.invariants["I6"].examples)


def test_a_claim_in_flight_when_the_policy_moved_is_allowed(tmp_path: Path) -> None:
    # The move lands 1 s before the takeover claims: within 2 x TTL, the race the product allows.
    v = judged(tmp_path / "run", [(T0 - 7000, FIRST),
                                  (T0 + 21_500, moved(FIRST, "r2", ChangeKind.SWITCHOVER, by="api", now_ms=T0))])
    assert v.invariants["I6"].count == 0, v.invariants["I6"].examples


def _loss() -> FaultRecord:
    return FaultRecord(1, "F5", "r1", T0 + 40_000, T0 + 45_000, {"variant": "multi-region"}, "region",
                       "region loss", healthy_ms=T0 + 46_000)


def test_losing_the_planning_region_without_a_failover_is_invalid(tmp_path: Path) -> None:
    v = judged(tmp_path / "a", [(T0 - 7000, FIRST)], [_loss()])
    assert any("F5 on r1: the planning region was lost and no automatic failover followed" in r for r in v.invalid)
    failover = moved(FIRST, "r2", ChangeKind.FAILOVER, by="r2-p1", now_ms=T0 + 47_000)
    v = judged(tmp_path / "b", [(T0 - 7000, FIRST), (T0 + 47_000, failover)], [_loss()])
    assert not any("no automatic failover" in r for r in v.invalid), v.invalid


def test_a_failed_over_region_loss_is_judged_from_the_planned_times(tmp_path: Path) -> None:
    # With the failover the loss is no outage: lag counts from each run's planned time, not the heal.
    failover = moved(FIRST, "r2", ChangeKind.FAILOVER, by="r2-p1", now_ms=T0 + 47_000)
    x, _ = clean_run(tmp_path / "run", [(T0 - 7000, encode(FIRST)), (T0 + 47_000, encode(failover))])
    x.faults.append(_loss())
    run = x.build(tmp_path / "run")
    write_run(run)
    c = _Checker(load_run(run.directory), loads(SCENARIO, "synthetic"))
    assert c.failed_over(c.faults[1]) and not c.outage(c.faults[1])
    x.faults[-1] = FaultRecord(1, "F5", "r3", T0 + 40_000, T0 + 45_000, {"variant": "multi-region"}, "region",
                               "region loss", healthy_ms=T0 + 46_000)  # a standby's loss: no failover
    run = x.build(tmp_path / "run")
    write_run(run)
    c = _Checker(load_run(run.directory), loads(SCENARIO, "synthetic"))
    assert not c.failed_over(c.faults[1]) and c.outage(c.faults[1])


def test_runs_around_a_switchover_are_judged_as_its_pause(tmp_path: Path) -> None:
    x, _ = clean_run(tmp_path / "run", [(T0 - 7000, encode(FIRST))])
    x.ops.append(OpRecord(T0 + 40_000, "switchover", "r1", True, T0 + 40_100))
    run = x.build(tmp_path / "run")
    write_run(run)
    v = check_run(load_run(run.directory))
    # settle_s 4: the runs planned in [40 s, 44.1 s] of 13 every-second schedules.
    assert v.stats["lag"]["switchover"]["n"] == 5 * 13 - 2, v.stats["lag"]  # the slow one skips odd seconds
    assert "| switchover |" in render_markdown(v, None)


def test_a_rewrite_that_keeps_the_primary_does_not_restart_the_grace(tmp_path: Path) -> None:
    # Planning moved to r2 at T0 + 1 s; an affinity change rewrites the record 1 s before r1-p2's claims.
    to_r2 = moved(FIRST, "r2", ChangeKind.SWITCHOVER, by="api", now_ms=T0 + 1000)
    rewrite = with_affinity(to_r2, None, Affinity(Mode.ANY), by="api", now_ms=T0 + 21_500)
    v = judged(tmp_path / "run", [(T0 - 7000, FIRST), (T0 + 1000, to_r2), (T0 + 21_500, rewrite)])
    assert v.invariants["I6"].count == 2, v.invariants["I6"].examples
