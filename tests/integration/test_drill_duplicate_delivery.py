"""F9, duplicate delivery, on real processes (chaos/runner.py): etcd, two planners whose assignment streams
repeat a fifth of their assignments 0-2 s later (the planners' test-only switch, dispatch/duplicate.py),
one worker, the effect sink.

- With the product's worker (dedupe by execution id + attempt) the drill passes, is valid, and the
  sink saw one effect per execution id (I1) although hundreds of assignments arrived twice.
- With the worker's dedupe switched off (`unsafe_disable_dedupe`, test mode only) the same drill fails
  I1: the check can fail, and it is the worker's dedupe that keeps it passing. Half the load holds its
  effect 1.5 s, so most repeats arrive while the first run is still going (the planner's start
  confirmation accepts a Started repeated by the same worker, so only the worker can refuse them); the
  other half is instant, so repeats also arrive after the first run finished.

One drill per test (about 45 s each on two cores).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from chaos.record import load_run
from chaos.runner import DrillResult, RunOptions, run_drill
from chaos.scenario import loads
from tests.integration.drill_scenarios import cluster, every_second, faults, header, scenario, validity

pytestmark = [pytest.mark.etcd]

SCENARIO = scenario(
    header("f9-duplicate-delivery", "both planners deliver a fifth of their assignments twice, 0-2 s apart", 24, 9),
    cluster(2, 1),
    # Tighter than drill_scenarios.LAG: a 24 s window with one fault.
    "[lag]\nsteady_p99_s = 1.5\nsteady_max_s = 3.0\nfault_max_s = 6.0\nsettle_s = 4.0\nliveness_s = 10.0\n"
    "judge_grace_s = 4.0\n",
    validity(200), every_second("quick", 10), every_second("held", 8, "hold_ms = 1500\n"),
    faults(4, 6, 2, 30),
    '[[faults.fixed]]\ntype = "F9"\nat_s = 4\nduration_s = 12\ntarget = "cluster"\n'
    'params = { probability = 0.2, delay_ms = 2000 }\n',
)


def run(tmp: Path, name: str, **opts: object) -> DrillResult:
    s = loads(SCENARIO, "f9-duplicate-delivery")
    return asyncio.run(run_drill(s, RunOptions(tmp / name, scenario_text=SCENARIO, **opts)))  # type: ignore[arg-type]


def _counts(r: DrillResult) -> dict[str, int]:
    (f9,) = [f for f in load_run(r.directory).faults if f.type == "F9"]
    return f9.counts


def _ignored(r: DrillResult) -> int:
    """Repeats the workers logged as ignored (their `duplicate_ignored` WARNINGs)."""
    logs = (r.directory / "logs").glob("*-w*.log")
    return sum(p.read_text(errors="replace").count('"duplicate_ignored"') for p in logs)


def test_duplicate_delivery_runs_each_execution_once(tmp_path: Path) -> None:
    r = run(tmp_path, "dedupe")
    v = r.verdict
    counts, ignored = _counts(r), _ignored(r)
    i1 = v.invariants["I1"]
    print(f"\nF9: {counts}; the worker ignored {ignored} repeat(s); I1 checked {i1.checked} execution ids, "
          f"{v.stats['outcomes'].get('effects_accepted')} effects accepted, {v.stats['duplicates']} duplicate(s)")
    print(r.report["md"].read_text()[:3000])
    assert not v.invalid, v.invalid
    assert v.result == "pass", {k: i.examples[:5] for k, i in v.invariants.items() if i.count}
    assert counts["duplicated"] >= 20, counts  # about a fifth of ~18 dispatches/s over 12 s: ~43
    # Every repeat reached the worker and was refused there (the few still in transit at the end aside).
    assert ignored >= counts["duplicated"] * 0.9, (ignored, counts)
    assert i1.count == 0 and v.stats["duplicates"] == 0


# The build with the dedupe removed is shown failing once per full run (SCHED_FULL=1); the synthetic
# "one assignment run twice" history (tests/chaos/test_check.py) keeps I1's ability to fail in CI.
@pytest.mark.slow
def test_without_the_workers_dedupe_the_same_drill_fails_i1(tmp_path: Path) -> None:
    r = run(tmp_path, "no-dedupe", unsafe_dedupe_off=True)
    v = r.verdict
    counts, i1 = _counts(r), v.invariants["I1"]
    print(f"\nF9: {counts}; I1 failed {i1.count} time(s), {v.stats['duplicates']} duplicated execution(s): "
          f"{i1.examples[:3]}")
    assert counts["duplicated"] >= 20, counts
    assert v.result == "fail" and i1.count >= 3, (v.result, i1.count, v.invalid)
    assert v.stats["duplicates"] >= 3
