"""The meta-tests that prove the drill checker can fail (issue 10), on real processes:
- the CI smoke drill's recorded run (the session fixture `smoke_run`, tests/integration/conftest.py; its
  own verdict is judged in tests/integration/test_drill_smoke.py) with its skip records removed fails I2
  (silent misses);
- the same run with an accepted effect duplicated fails I1;
- a short drill on loopback with proxy links (etcd, 2 planners, 1 worker: F1 and F2 beyond the lease with a
  write held in flight, a pause and a resume) whose planners write without the fence compare
  (`unsafe_disable_fencing`, test mode only): the held write reaches etcd after the takeover and is refused
  by the keys' own compares; the run is invalid (no fence refusal to show), never a pass.
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
from tests.integration.drill_scenarios import runner_meta

pytestmark = [pytest.mark.etcd]

SCENARIO = runner_meta()


def run(tmp: Path, name: str, **opts: object) -> DrillResult:
    import asyncio

    s = loads(SCENARIO, "runner-meta")
    return asyncio.run(run_drill(s, RunOptions(tmp / name, scenario_text=SCENARIO, **opts)))  # type: ignore[arg-type]


def bad(v: Verdict) -> dict[str, list[str]]:
    return {k: i.examples[:5] for k, i in v.invariants.items() if i.count}


def test_dropping_the_recorded_skip_records_fails_i2(smoke_run: DrillResult, tmp_path: Path) -> None:
    """The run's own skip records removed (the ranges under skips/, and every trace of the executions they
    cover), as a build that never wrote them would leave it: each owed planned time they covered (the
    `skip` and `latest` schedules' times missed across the takeovers and the region loss; a pause's times
    are not owed) is a silent gap."""
    d = tmp_path / "no-skips"
    shutil.copytree(smoke_run.directory, d)
    lines = (d / "etcd-watch.jsonl").read_text().splitlines()
    ranges = []
    for x in lines:
        key = json.loads(x)["key"]
        if "/skips/" in key:
            sid, span = key.split("/")[-2:]
            after, through = (int(v) for v in span.split("-"))
            ranges.append((sid, after, through))
    assert ranges, "the takeovers and the region loss should have left policy skips"

    def covered(key: str) -> bool:
        if "/skips/" in key:
            return True
        parts = key.split("/")
        if "/executions/" not in key or not parts[-1].isdigit():
            return False
        return any(parts[-2] == sid and a < int(parts[-1]) <= b for sid, a, b in ranges)

    kept = [x for x in lines if not covered(json.loads(x)["key"])]
    (d / "etcd-watch.jsonl").write_text("".join(x + "\n" for x in kept))
    v = check_run(load_run(d))
    assert v.result == "fail" and v.invariants["I2"].count > 0 and v.stats["silent_misses"] > 0, bad(v)


def test_a_duplicated_effect_fails_i1(smoke_run: DrillResult, tmp_path: Path) -> None:
    d = tmp_path / "dup"
    shutil.copytree(smoke_run.directory, d)
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


# Shown once per full run (SCHED_FULL=1), as the bar asks of a check run on a build with a protection
# removed: 53 s of CI time, while tests/chaos/test_check.py keeps I4's ability to fail in every CI run.
@pytest.mark.slow
def test_planners_without_the_fence_are_still_refused_by_the_keys_own_compares(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`unsafe_disable_fencing` (test mode only) takes the fence compare out of every owned write. The F2
    nemesis still lands the frozen planner's held write in etcd after the takeover (the wire shows it
    answered), and it is still refused: every owned write also compares the revision of the key it
    moves (a record's mod_revision, the checkpoint's), which the new owner has changed by then. So this
    build is not unsafe, and the run cannot pass either: with no fence there is no fence refusal, and
    I4c makes it invalid. (I4's own ability to fail is shown on histories where a stale write does land:
    tests/chaos/test_check.py.)"""
    monkeypatch.setenv("SCHED_TEST_MODE", "1")
    r = run(tmp_path, "unfenced", unsafe_fencing_off=True)
    v = r.verdict
    print("\n" + r.report["md"].read_text()[:3000])
    assert all(v.invariants[k].count == 0 for k in ("I1", "I2", "I4", "I5", "I6")), bad(v)
    # Never a pass: invalid for want of a fence refusal (or failed, if the shared machine also made it late).
    assert v.result != "pass" and any("I4c" in x for x in v.invalid), v.invalid
    f2 = next(f for f in load_run(r.directory).faults if f.type == "F2")
    assert f2.end_ms is not None
    stale = [t for t in load_run(r.directory).wire
             if t.planner == f2.target and not t.fenced and not t.succeeded
             and t.sent_ms <= f2.start_ms + 100 and t.answered_ms >= f2.start_ms + 2_000]  # held past the TTL
    near = [t for t in load_run(r.directory).wire if t.planner == f2.target
            and f2.start_ms - 1_000 <= t.sent_ms <= (f2.end_ms or f2.start_ms) + 1_000]
    assert stale, ("the held unfenced write should have reached etcd after the takeover and been refused; "
                   f"F2 {f2.start_ms}..{f2.end_ms} note {f2.note!r}; the target's txns on the wire then: {near[:10]}")
