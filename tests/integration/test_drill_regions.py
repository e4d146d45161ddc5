"""The region drill (issues 10 and 11): chaos/scenarios/regions.toml on real processes, judged by the harness's
checker. Three regions, r1 primary; F5 kills r1's planners, worker and etcd member, and r2 must take planning
over by automatic failover; then a pause beyond the lease and a skewed clock in r2, and a switchover back to
r1 by command. Every CI run: valid, every invariant I1 to I8 clean, I3's steady-state bounds included, no run
over a fault's or the switchover's own bound, and the policy's history showing the failover and the move back.
I3 was judged in full mode only until the worker credit fix (a planner handed partitions got slots within a few
round trips, not 5-6): two runs after it had p99 0.25-0.30 s outside faults and a worst run of 0.38 s, against
1.5 s and 2 s (regions1 had p99 1.01 s before it; docs/drills.md, "Status")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from chaos.runner import RunOptions, run_drill
from chaos.scenario import load

pytestmark = [pytest.mark.etcd]

REGIONS = Path(__file__).resolve().parents[2] / "chaos" / "scenarios" / "regions.toml"


def test_the_primary_fails_over_and_planning_comes_back_by_switchover(tmp_path: Path) -> None:
    r = asyncio.run(run_drill(load(REGIONS), RunOptions(tmp_path / "run", network="auto", progress=print)))
    v = r.verdict
    print("\n" + r.report["md"].read_text()[:6000])
    assert not v.invalid, v.invalid
    bad = {k: i.examples[:5] for k, i in v.invariants.items() if i.count}
    assert not bad, bad
    bounded = [x for x in v.invariants["I3"].examples
               if x.startswith(("[lag-during]", "[lag-switchover]", "[early]"))]
    assert not bounded, bounded
    moves = [(c["kind"], c["from"], c["primary"]) for c in v.stats["region_changes"]]
    assert moves[0] == ("switchover", "", "r1")
    assert ("automatic failover", "r1", "r2") in moves, moves
    assert moves[-1][2] == "r1", moves  # the switchover op moved planning back
    assert v.stats["duplicates"] == 0 and v.stats["silent_misses"] == 0
    f5 = next(f for f in v.faults if f.type == "F5")
    assert f5.takeovers >= 1
    assert v.stats["lag"]["switchover"]["n"] > 0
