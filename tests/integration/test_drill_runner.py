"""The drill runner (chaos/runner.py) on real processes, and the meta-tests that prove its checker can fail.

One short drill (etcd, 2 planners, 1 worker, the effect sink, proxy links): F1 and F2 beyond the lease
with a write held in flight, a pause and a resume. It must be valid (every fault exercised what it
was meant to: takeovers, a stale write refused by etcd's fence on the wire) and safe (I1, I2, I4, I5,
I6 hold). Then, issue 10's meta-tests:
- the same recorded run with its skip records removed fails I2 (silent misses);
- the same run with an accepted effect duplicated fails I1;
- a run whose planners write without the fence compare (`unsafe_disable_fencing`, test mode only)
  fails I4: the held write lands after the takeover, and the checker sees a write without its claim.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from chaos.check import check_run
from chaos.record import load_run
from chaos.runner import DrillResult, RunOptions, run_drill
from chaos.scenario import loads
from chaos.verdict import Verdict

pytestmark = [pytest.mark.etcd]

SCENARIO = """
[scenario]
name = "runner-meta"
description = "F1 and F2 beyond the lease on two planners; a pause and a resume"
duration_s = 40
seed = 3
[cluster]
planners_per_region = 2
workers_per_region = 1
partitions = 8
lease_ttl_s = 2.0
renew_interval_s = 0.5
planner = { lookahead_ms = 1000, late_grace_ms = 2000 }
[lag]
steady_p99_s = 1.5
steady_max_s = 3.0
fault_max_s = 8.0
settle_s = 6.0
liveness_s = 15.0
judge_grace_s = 5.0
[validity]
min_executions = 300
min_planned_per_fault = 20
[[load.schedules]]
name = "sec"
count = 12
spec = "* * * * * *"
[[load.schedules]]
name = "sh"
count = 3
spec = "@every 2s"
executor = "shell"
hold_ms = 200
[[operations]]
at_s = 6
op = "pause"
target = "sec-001"
[[operations]]
at_s = 14
op = "resume"
target = "sec-001"
[faults]
warmup_s = 5
cooldown_s = 10
min_gap_s = 3
health_timeout_s = 40
[[faults.fixed]]
type = "F1"
at_s = 8
duration_s = 2
[[faults.fixed]]
type = "F2"
at_s = 18
params = { ttl_multiple = 2.5 }
"""


def run(tmp: Path, name: str, **opts: object) -> DrillResult:
    import asyncio

    s = loads(SCENARIO, "runner-meta")
    return asyncio.run(run_drill(s, RunOptions(tmp / name, scenario_text=SCENARIO, **opts)))  # type: ignore[arg-type]


def bad(v: Verdict) -> dict[str, list[str]]:
    return {k: i.examples[:5] for k, i in v.invariants.items() if i.count}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> DrillResult:
    return run(tmp_path_factory.mktemp("drill"), "run")


def test_a_drill_on_real_processes_is_valid_and_safe(recorded: DrillResult) -> None:
    v = recorded.verdict
    print("\n" + recorded.report["md"].read_text()[:5000])
    assert not v.invalid, v.invalid
    safety = {k: v.invariants[k] for k in ("I1", "I2", "I4", "I5", "I6")}
    assert all(i.count == 0 for i in safety.values()), {k: i.examples[:5] for k, i in safety.items()}
    assert v.invariants["I2"].checked > 300 and v.stats["silent_misses"] == 0
    # F2 was frozen with a write in flight, and etcd's fence refused it after the takeover (seen on the wire).
    assert v.stats["stale_txns_refused_by_etcd"] >= 1
    f2 = next(r for r in v.faults if r.type == "F2")
    assert f2.takeovers >= 1 and f2.stale_rejected >= 1
    ops = [json.loads(x) for x in (recorded.directory / "ops.jsonl").read_text().splitlines()]
    assert {o["op"] for o in ops if o["ok"]} >= {"create", "pause", "resume"}


def test_dropping_the_recorded_skip_records_fails_i2(recorded: DrillResult, tmp_path: Path) -> None:
    d = tmp_path / "no-skips"
    shutil.copytree(recorded.directory, d)
    lines = (d / "etcd-watch.jsonl").read_text().splitlines()
    skips = [x for x in lines if '"skip_reason"' in x or "/skips/" in json.loads(x)["key"]]
    assert skips, "the pause should have left skip records"
    dropped = {json.loads(x)["key"] for x in skips}
    (d / "etcd-watch.jsonl").write_text("".join(x + "\n" for x in lines if json.loads(x)["key"] not in dropped))
    v = check_run(load_run(d))
    assert v.result == "fail" and v.invariants["I2"].count > 0 and v.stats["silent_misses"] > 0, bad(v)


def test_a_duplicated_effect_fails_i1(recorded: DrillResult, tmp_path: Path) -> None:
    d = tmp_path / "dup"
    shutil.copytree(recorded.directory, d)
    effects = [json.loads(x) for x in (d / "effects.jsonl").read_text().splitlines()]
    first = next(e for e in effects if e["accepted"] and e["phase"] == "end" and e["schedule_id"].startswith("sec"))
    seq = max(e["seq"] for e in effects)
    start = {**first, "phase": "start", "attempt": 2, "seq": seq + 1, "t_ms": first["t_ms"] + 5000, "t_start_ms": 0}
    end = {**first, "attempt": 2, "seq": seq + 2, "t_ms": first["t_ms"] + 5100, "t_start_ms": first["t_ms"] + 5000}
    with (d / "effects.jsonl").open("a") as f:
        for e in (start, end):
            f.write(json.dumps(e) + "\n")
    v = check_run(load_run(d))
    assert v.result == "fail" and v.invariants["I1"].count >= 1, bad(v)
    assert any(first["exec_id"] in x for x in v.invariants["I1"].examples)


def test_planners_without_the_fence_fail_i4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHED_TEST_MODE", "1")
    r = run(tmp_path, "unfenced", unsafe_fencing_off=True)
    v = r.verdict
    print("\n" + r.report["md"].read_text()[:4000])
    assert v.result == "fail" and v.invariants["I4"].count >= 1, bad(v)
