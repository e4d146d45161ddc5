"""The drill checker (chaos/check.py) on synthetic recorded runs: a clean run passes and is valid, and
the meta-tests prove it can fail: a duplicated effect fails I1, dropped skip records fail I2, a
decreasing accepted token fails I4, and runs whose faults exercised nothing are invalid, not passed."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from chaos.check import EXIT, check_run, fixed_period_ms, independent_times, planned_times
from chaos.record import FaultRecord, OpRecord, Run, WatchRecord, load_run, write_run
from scheduler.execution import (
    ErrorClass,
    ExecState,
    Execution,
    Trigger,
    dispatch,
    new_execution,
    replay,
    result,
    started,
)
from scheduler.ids import ExecutionId, FencingToken, execution_id
from scheduler.model import ScheduleState
from scheduler.store.codec import encode_schedule
from scheduler.store.keyspace import partition_for
from scheduler.timeplan import Overlap, parse_spec
from tests.chaos.synth import KS, POLICIES, T0, P, Synth, clean_run, sched
from tests.chaos.synth import SCENARIO as SCENARIO_TEXT


def token_of(x: Synth, sid: str) -> FencingToken:
    """The current claim's token of the schedule's partition (the highest so far: the sink accepts it)."""
    p = partition_for(sid, P)
    return FencingToken(p, x.owners[p][1])


def judged(run: Run) -> tuple[str, dict[str, int], list[str]]:
    """Write the run, read it back as the CLI would, judge it: (verdict, violations per invariant, invalid)."""
    write_run(run)
    v = check_run(load_run(run.directory))
    return v.result, {k: i.count for k, i in v.invariants.items() if i.count}, v.invalid


def test_clean_run_passes_and_is_valid(tmp_path: Path) -> None:
    _, run = clean_run(tmp_path / "run")
    write_run(run)
    v = check_run(load_run(tmp_path / "run"))
    assert (v.result, v.exit_code, v.invalid) == ("pass", 0, [])
    assert all(i.status in ("pass", "n/a") for i in v.invariants.values())
    assert v.invariants["I2"].checked > 600 and v.stats["outcomes"]["skipped_overlap_skip"] > 20
    row = v.faults[0]
    assert (row.takeovers, row.stale_rejected) == (2, 1)
    assert row.rto_s is not None and 2.0 < row.rto_s < 3.0  # the caught-up runs started ~2.6 s late
    assert v.stats["lag"]["during"]["max_s"] > v.stats["lag"]["before"]["max_s"]


def test_meta_duplicated_effect_fails_i1(tmp_path: Path) -> None:
    x, run = clean_run(tmp_path / "run")
    eid = execution_id("s-003", T0 + 10_000)
    tok = token_of(x, "s-003")
    first = next(e for e in run.effects if e.exec_id == eid and e.phase == "start")
    x.effect(eid, 1, tok, "r1-w2", first.t_ms + 5_000, first.t_ms + 5_100)  # the same run, again, elsewhere
    verdict, fails, _ = judged(x.build(tmp_path / "run"))
    assert verdict == "fail" and EXIT[verdict] == 1
    assert fails.get("I1") == 1


def test_a_rerun_the_operator_asked_for_is_not_a_duplicate(tmp_path: Path) -> None:
    from chaos.record import OpRecord

    x, _ = clean_run(tmp_path / "run")
    eid = execution_id("s-003", T0 + 10_000)
    tok = token_of(x, "s-003")
    x.ops.append(OpRecord(T0 + 14_000, "rerun", "s-003", True, T0 + 14_010, result={"execution_id": eid}))
    x.effect(eid, 2, tok, "r1-w2", T0 + 14_100, T0 + 14_200)
    assert judged(x.build(tmp_path / "run"))[0] == "pass"


def test_meta_an_acknowledged_rerun_that_never_ran_fails_i2(tmp_path: Path) -> None:
    """The rerun (or replay) the API acknowledged must run again: here its record still says succeeded, from
    the first run, and no effect started after the call (a rerun lost silently)."""
    x, _ = clean_run(tmp_path / "run")
    eid = execution_id("s-003", T0 + 10_000)
    x.ops.append(OpRecord(T0 + 14_000, "replay", "s-003", True, T0 + 14_010, result={"execution_id": eid}))
    run = x.build(tmp_path / "run")
    write_run(run)
    v = check_run(load_run(run.directory))
    assert v.result == "fail" and v.invariants["I2"].count == 1, v.invariants["I2"].examples
    assert v.invariants["I2"].examples[0].startswith(f"[rerun-lost] replay of {eid} acknowledged")


def test_meta_two_attempts_at_once_fail_i1(tmp_path: Path) -> None:
    x, _ = clean_run(tmp_path / "run")
    eid = execution_id("s-004", T0 + 12_000)
    tok = token_of(x, "s-004")
    x.effect(eid, 2, tok, "r1-w1", T0 + 12_000, None)  # started, never ended, no crash explains it
    verdict, fails, _ = judged(x.build(tmp_path / "run"))
    assert verdict == "fail" and fails.get("I1", 0) >= 1


def test_an_attempt_cut_short_by_a_worker_crash_is_not_counted(tmp_path: Path) -> None:
    x, _ = clean_run(tmp_path / "run")
    eid = execution_id("s-004", T0 + 40_000)
    tok = token_of(x, "s-004")
    x.effects = [e for e in x.effects if e.exec_id != eid]
    x.effect(eid, 1, tok, "r1-w2", T0 + 40_040, None)  # r1-w2 killed mid-run (F7) ...
    x.effect(eid, 2, tok, "r1-w1", T0 + 44_000, T0 + 44_100)  # ... and the retry ran it once
    x.faults.append(FaultRecord(1, "F7", "r1-w2", T0 + 40_050, T0 + 41_000, {}, "worker", healthy_ms=T0 + 41_500))
    _, fails, _ = judged(x.build(tmp_path / "run"))
    assert "I1" not in fails, fails


def test_a_completed_effect_whose_result_died_with_its_worker_is_not_a_duplicate(tmp_path: Path) -> None:
    """The effect ended, then the worker was killed before its result landed (F5 here): the retry under the
    same idempotency key is at-least-once, not a duplicate. Without the crash it is one."""
    x, _ = clean_run(tmp_path / "run")
    eid = execution_id("s-004", T0 + 40_000)
    tok = token_of(x, "s-004")
    x.effects = [e for e in x.effects if e.exec_id != eid]
    key = KS.execution(partition_for("s-004", P), "s-004", T0 + 40_000).decode()
    x.watch = [w for w in x.watch if w.key != key]  # its result never landed (no success recorded)
    x.effect(eid, 1, tok, "r1-w2", T0 + 40_040, T0 + 40_045)  # done, result not yet sent ...
    x.effect(eid, 2, tok, "r1-w1", T0 + 44_000, T0 + 44_100)  # ... the retry after the crash
    plain = x.build(tmp_path / "dup")
    assert judged(plain)[1].get("I1", 0) == 1, "without a crash two completed effects are a duplicate"
    x.faults.append(FaultRecord(1, "F5", "r1", T0 + 40_050, T0 + 41_000, {}, "region", healthy_ms=T0 + 41_500))
    _, fails, _ = judged(x.build(tmp_path / "run"))
    assert "I1" not in fails, fails


def test_meta_dropped_skip_records_fail_i2(tmp_path: Path) -> None:
    x, _ = clean_run(tmp_path / "run")
    x.watch = [w for w in x.watch if not ("/slow-000/" in w.key and b"overlap_skip" in w.value)]
    verdict, fails, _ = judged(x.build(tmp_path / "run"))
    assert verdict == "fail" and fails.get("I2", 0) >= 20  # every dropped one is a silent gap


def test_meta_manufactured_overlap_skip_fails_i2(tmp_path: Path) -> None:
    """Issue 9 item 3: an overlap skip while nothing of the schedule was running is not justified."""
    x, _ = clean_run(tmp_path / "run")
    x.effects = [e for e in x.effects if not e.schedule_id.startswith("slow-")]
    x.watch = [w for w in x.watch if not ("/slow-000/" in w.key and b'"running"' in w.value)]
    verdict, fails, _ = judged(x.build(tmp_path / "run"))
    assert verdict == "fail" and fails.get("I2", 0) >= 20


def test_meta_decreasing_token_fails_i4(tmp_path: Path) -> None:
    """What the sink's fencing check (turned off, SCHED_TEST_MODE) would have refused: a stale planner's
    dispatch accepted after its successor's."""
    x, _ = clean_run(tmp_path / "run")
    x.effects = [replace(e, accepted=True) if not e.accepted else e for e in x.effects]
    verdict, fails, _ = judged(x.build(tmp_path / "run"))
    assert verdict == "fail" and fails.get("I4") == 1


def test_meta_stale_checkpoint_and_dispatch_fail_i4(tmp_path: Path) -> None:
    x, _ = clean_run(tmp_path / "run")
    import json

    p = partition_for("s-000", P)
    x.put(KS.checkpoint(p), json.dumps({"watermark_ms": T0 + 90_000, "writer": "r1-p1", "token": 2}).encode(),
          T0 + 26_000)
    verdict, fails, _ = judged(x.build(tmp_path / "run"))
    assert verdict == "fail" and fails.get("I4") == 1


def test_meta_watermark_going_back_fails_i5_and_overlapping_owners_fail_i6(tmp_path: Path) -> None:
    import json

    x, _ = clean_run(tmp_path / "run")
    node, tok = x.owners[3]
    x.put(KS.checkpoint(3), json.dumps({"watermark_ms": T0, "writer": node, "token": tok}).encode(), T0 + 58_000)
    x.rev += 1
    owner = json.dumps({"node": "r1-p1", "lease": "a1"}).encode()  # a put over r1-p2's live claim
    x.watch.append(WatchRecord(x.rev, "PUT", KS.owner(3).decode(), owner, x.rev, x.rev, 0xA1, T0 + 58_500))
    verdict, fails, _ = judged(x.build(tmp_path / "run"))
    assert verdict == "fail" and fails.get("I5") == 1 and fails.get("I6") == 1


def test_a_pause_with_no_takeover_and_no_refusal_is_invalid_not_passed(tmp_path: Path) -> None:
    """The audit's lesson (issue 10): a paused planner that learns of the takeover before it writes
    proves nothing. Without a refused stale write the run says so."""
    x, _ = clean_run(tmp_path / "run")
    x.effects = [e for e in x.effects if e.accepted]
    verdict, fails, invalid = judged(x.build(tmp_path / "run"))
    assert (verdict, fails) == ("invalid", {}) and EXIT[verdict] == 3
    assert any("no stale write was refused" in r for r in invalid)


def test_thin_load_and_an_unhealed_cluster_are_invalid(tmp_path: Path) -> None:
    x, _ = clean_run(tmp_path / "run")
    x.faults[0] = replace(x.faults[0], healthy_ms=None)
    run = x.build(tmp_path / "run", steady_after=False)
    run.scenario_toml = run.scenario_toml.replace("min_executions = 100", "min_executions = 100000")
    verdict, _, invalid = judged(run)
    assert verdict == "invalid"
    assert len(invalid) == 3 and any("too little load" in r for r in invalid)


def test_slow_recovery_fails_i3_and_i7(tmp_path: Path) -> None:
    x, _ = clean_run(tmp_path / "run")
    late = {execution_id(f"s-{i:03d}", T0 + 40_000) for i in range(12)}
    x.effects = [replace(e, t_ms=e.t_ms + 15_000) if e.exec_id in late else e for e in x.effects]
    verdict, fails, _ = judged(x.build(tmp_path / "run"))
    assert verdict == "fail" and fails.get("I3", 0) >= 1 and fails.get("I7", 0) >= 1


def test_error_logs_fail_i8_unless_allowed(tmp_path: Path) -> None:
    x, _ = clean_run(tmp_path / "run")
    run = x.build(tmp_path / "run")
    write_run(run)
    (tmp_path / "run" / "logs").mkdir()
    (tmp_path / "run" / "logs" / "r1-p1.log").write_text(
        '{"ts": "2026-12-01T12:00:01.000Z", "level": "info", "msg": "fine"}\n'
        '{"ts": "2026-12-01T12:00:02.000Z", "level": "error", "msg": "restarting partition planner: boom"}\n')
    v = check_run(load_run(tmp_path / "run"))
    assert v.result == "fail" and v.invariants["I8"].count == 1
    allowed = run.scenario_toml + '[checks]\nallowed_errors = ["restarting partition planner"]\n'
    (tmp_path / "run" / "scenario.toml").write_text(allowed)
    assert check_run(load_run(tmp_path / "run")).invariants["I8"].count == 0


@pytest.mark.parametrize(("spec", "tz"), [("* * * * * *", "UTC"), ("*/5 * * * * *", "America/New_York"),
                                          ("@every 3s phase 1s", "UTC"), ("*/2 * * * * *", "Europe/Berlin")])
def test_the_two_computations_of_planned_times_agree(spec: str, tz: str) -> None:
    """Fixed-period specs are recomputed twice (time engine, plain arithmetic) across a DST change."""
    dst = 1_805_180_400_000 - 3_600_000  # around 2027-03-14 (US) / 2027-03-28 (EU) spring-forwards
    for start in (dst, 1_806_392_000_000):
        cross: list[str] = []
        times = planned_times(parse_spec(spec, tz=tz, schedule_id="x"), spec, start, start + 7_200_000, cross)
        assert not cross and times
        fp = fixed_period_ms(spec)
        assert fp is not None and times == independent_times(*fp, start, start + 7_200_000)


def test_only_fixed_period_specs_get_the_second_computation() -> None:
    assert fixed_period_ms("*/7 * * * * *") is None  # 7 does not divide 60: not a plain period
    assert fixed_period_ms("0 0-59 2 * * *") is None
    assert fixed_period_ms("@every 2s") == (2000, 0)


def test_a_bad_run_directory_names_the_file(tmp_path: Path) -> None:
    from chaos.record import RunError

    with pytest.raises(RunError, match=r"run\.json: missing"):
        load_run(tmp_path)
    _, run = clean_run(tmp_path / "r")
    write_run(run)
    with (tmp_path / "r" / "etcd-watch.jsonl").open("a") as f:
        f.write('{"rev": 1}\n{"rev": "x", "type": "PUT", "key": "k"}\n{"rev":')
    with pytest.raises(RunError, match=r"etcd-watch.jsonl:\d+: bad watch record"):
        load_run(tmp_path / "r")


def test_a_late_run_outside_the_faults_fails_i3_and_is_named(tmp_path: Path) -> None:
    """The steady bound names the run that broke it: an operator re-reading the report finds it."""
    x, _ = clean_run(tmp_path / "run")
    late = execution_id("s-004", T0 + 50_000)
    x.effects = [replace(e, t_ms=e.t_ms + 3_000) if e.exec_id == late else e for e in x.effects]
    run = x.build(tmp_path / "run")
    write_run(run)
    v = check_run(load_run(run.directory))
    assert v.result == "fail" and v.invariants["I3"].count == 1
    assert v.invariants["I3"].examples[0].startswith("[lag-after]") and late in v.invariants["I3"].examples[0]


def test_a_run_long_before_its_time_fails_i3(tmp_path: Path) -> None:
    """A planner whose clock runs ahead (F6 left in place, say) must not fire planned times early."""
    x, _ = clean_run(tmp_path / "run")
    early = execution_id("s-002", T0 + 45_000)
    x.effects = [replace(e, t_ms=e.t_ms - 30_000) if e.exec_id == early else e for e in x.effects]
    verdict, fails, _ = judged(x.build(tmp_path / "run"))
    assert verdict == "fail" and fails.get("I3") == 1


def test_a_worker_crash_that_crashed_nothing_is_invalid(tmp_path: Path) -> None:
    x, _ = clean_run(tmp_path / "run")
    # r1-w2 is idle between its slow run's end (41.54 s) and its next start (42.04 s).
    x.faults.append(FaultRecord(1, "F7", "r1-w2", T0 + 41_700, T0 + 41_900, {}, "worker", healthy_ms=T0 + 42_000))
    verdict, _, invalid = judged(x.build(tmp_path / "run"))
    assert verdict == "invalid" and any("crashed nothing mid-execution" in r for r in invalid), invalid


def test_a_duplicate_delivery_that_duplicated_nothing_is_invalid(tmp_path: Path) -> None:
    """F9 proves the worker's dedupe only if some assignment really arrived twice (its nemesis counts them)."""
    x, _ = clean_run(tmp_path / "run")
    x.faults.append(FaultRecord(1, "F9", "cluster", T0 + 40_000, T0 + 46_000, {"probability": 0.1}, "cluster",
                                healthy_ms=T0 + 46_100, counts={"duplicated": 0, "dispatched": 80}))
    verdict, _, invalid = judged(x.build(tmp_path / "run"))
    assert verdict == "invalid" and any("no assignment was delivered twice" in r for r in invalid), invalid
    x.faults[-1] = replace(x.faults[-1], counts={"duplicated": 9, "dispatched": 80})
    verdict, _, invalid = judged(x.build(tmp_path / "run2"))
    assert not any("delivered twice" in r for r in invalid), invalid


def test_one_assignment_run_twice_fails_i1(tmp_path: Path) -> None:
    """What F9 guards: a second delivery of the same attempt run again (same id, same attempt) is two effects."""
    x, _ = clean_run(tmp_path / "run")
    eid = execution_id("s-006", T0 + 44_000)
    first = next(e for e in x.effects if e.exec_id == eid and e.phase == "start")
    x.effect(eid, 1, token_of(x, "s-006"), first.worker, T0 + 45_200, T0 + 45_300)
    verdict, fails, _ = judged(x.build(tmp_path / "run"))
    assert verdict == "fail" and fails.get("I1") == 1, fails


def test_an_effect_cut_short_by_its_caller_then_retried_is_not_a_duplicate(tmp_path: Path) -> None:
    x, _ = clean_run(tmp_path / "run")
    eid = execution_id("s-006", T0 + 44_000)
    tok = token_of(x, "s-006")
    x.effects = [e for e in x.effects if e.exec_id != eid]
    x.effect(eid, 1, tok, "r1-w2", T0 + 44_040, None)
    x.seq += 1
    x.effects.append(replace(x.effects[-1], seq=x.seq, phase="abort", t_ms=T0 + 44_300))  # the worker died
    x.effect(eid, 2, tok, "r1-w1", T0 + 47_000, T0 + 47_100)
    _, fails, _ = judged(x.build(tmp_path / "run"))
    assert "I1" not in fails, fails


def test_an_acknowledged_pause_missing_from_etcd_fails_i2(tmp_path: Path) -> None:
    from chaos.record import OpRecord

    x, _ = clean_run(tmp_path / "run")
    x.ops.append(OpRecord(T0 + 50_000, "pause", "s-007", True, T0 + 50_020))  # said ok; never landed
    verdict, fails, _ = judged(x.build(tmp_path / "run"))
    assert verdict == "fail" and fails.get("I2") == 1


def test_a_pause_of_a_paused_schedule_writes_nothing_and_is_no_lost_op(tmp_path: Path) -> None:
    """The game day paused s twice in a row: the second pause changes nothing, writes nothing, and is
    acknowledged rightly. A resume of a paused schedule that writes nothing is still a lost op."""
    from chaos.record import OpRecord

    x, _ = clean_run(tmp_path / "run")
    x.ops.append(OpRecord(T0 + 31_000, "pause", "s-005", True, T0 + 31_020))  # paused since T0 + 30 s
    x.ops.append(OpRecord(T0 + 36_000, "resume", "s-005", True, T0 + 36_020))  # active since T0 + 35 s
    verdict, fails, _ = judged(x.build(tmp_path / "run"))
    assert "I2" not in fails, fails
    x.ops.append(OpRecord(T0 + 32_000, "resume", "s-005", True, T0 + 32_020))  # paused then: must have landed
    verdict, fails, _ = judged(x.build(tmp_path / "run2"))
    assert verdict == "fail" and fails.get("I2") == 1


def test_an_acknowledged_op_is_found_in_etcd_by_the_version_it_answered(tmp_path: Path) -> None:
    """The op's answer names its version (etcd's mod revision): the change is looked up by it, however late the
    harness's watch delivered it (a watch on a SIGSTOPped member delivered a resume 5 s late and the receipt-time
    check called it lost). A version the history does not have is a lost op."""
    from chaos.record import OpRecord

    x, _ = clean_run(tmp_path / "run")
    resumed = next(w for w in reversed(x.watch) if w.key.endswith("/s-005") and w.t_ms == T0 + 35_005)
    late = replace(resumed, t_ms=T0 + 45_000)  # the put as a stalled watch delivered it: 10 s after the op
    x.watch[x.watch.index(resumed)] = late
    x.ops[:] = [o for o in x.ops if not (o.op == "resume" and o.schedule_id == "s-005")]
    x.ops.append(OpRecord(T0 + 34_990, "resume", "s-005", True, T0 + 35_010, {}, {"version": resumed.rev}))
    verdict, fails, _ = judged(x.build(tmp_path / "run"))
    assert "I2" not in fails, fails
    x.ops.append(OpRecord(T0 + 50_000, "pause", "s-005", True, T0 + 50_020, {}, {"version": x.rev + 1000}))
    verdict, fails, _ = judged(x.build(tmp_path / "run2"))
    assert verdict == "fail" and fails.get("I2") == 1, fails


def test_the_cross_check_catches_a_time_engine_that_drops_a_time() -> None:
    """The second computation is not decoration: a plan that loses one instant is reported."""
    plan = parse_spec("* * * * * *", schedule_id="x")
    real = plan.between_ms

    def lossy(a: int, b: int) -> Iterator[int]:
        return (t for t in real(a, b) if t != T0 + 3000)

    plan.between_ms = lossy  # type: ignore[method-assign]
    cross: list[str] = []
    times = planned_times(plan, "* * * * * *", T0, T0 + 10_000, cross)
    assert T0 + 3000 not in times and len(cross) == 1 and "disagree on 1 planned times" in cross[0]


def test_the_cross_check_honours_the_schedules_bounds() -> None:
    plan = parse_spec("@every 2s", schedule_id="x", start_ms=T0 + 4000, end_ms=T0 + 8000)
    cross: list[str] = []
    assert planned_times(plan, "@every 2s", T0, T0 + 20_000, cross) == [T0 + 4000, T0 + 6000, T0 + 8000]
    assert not cross


def test_a_fenced_out_in_the_paused_planners_log_is_evidence_enough(tmp_path: Path) -> None:
    """I4c's evidence may come from etcd refusing the stale txn (the planner logs fenced_out) rather
    than from the sink."""
    x, _ = clean_run(tmp_path / "run")
    x.effects = [e for e in x.effects if e.accepted]
    run = x.build(tmp_path / "run")
    write_run(run)
    (tmp_path / "run" / "logs").mkdir()
    (tmp_path / "run" / "logs" / "r1-p1.log").write_text(
        '{"ts": "2026-12-01T12:00:26.100Z", "level": "warning", "msg": "fenced out", "event": "fenced_out"}\n')
    v = check_run(load_run(tmp_path / "run"))
    assert (v.result, v.invalid) == ("pass", []) and v.faults[0].stale_rejected == 1


def test_a_history_that_stops_short_is_judged_up_to_its_end_and_invalid(tmp_path: Path) -> None:
    """The game day's harness watch died at t+402 s of 1,800: judged whole, the rest of the run looked lost
    (6,611 planned times, every later fault without a takeover) and the verdict said FAIL. The history is
    judged up to where it ends; the run is invalid, not failed, unless something fails inside that part."""
    from chaos.record import OpRecord

    x, _ = clean_run(tmp_path / "run")
    stop = T0 + 40_000
    x.watch = [w for w in x.watch if w.t_ms <= stop]  # the watch died here; the cluster went on
    x.ops.append(OpRecord(T0 + 50_000, "pause", "s-007", True, T0 + 50_020))  # acknowledged: in etcd, not seen
    # Judged as if the history were whole, the acknowledged pause is "lost": the check the cut replaces.
    verdict, fails, _ = judged(x.build(tmp_path / "whole"))
    assert verdict == "fail" and fails == {"I2": 1}, fails
    verdict, fails, invalid = judged(x.build(tmp_path / "cut", history_complete=False,
                                             harness_errors=["the etcd watch ended early"]))
    assert (verdict, fails) == ("invalid", {}), (fails, invalid)
    assert any("judged up to t+34.6s only" in why and "2 of 3 operations" in why for why in invalid), invalid
    # A violation inside the judged part still fails the run.
    eid = execution_id("s-003", T0 + 10_000)
    first = next(e for e in x.effects if e.exec_id == eid and e.phase == "start")
    x.effect(eid, 1, token_of(x, "s-003"), "r1-w2", first.t_ms + 5_000, first.t_ms + 5_100)
    verdict, fails, _ = judged(x.build(tmp_path / "dup", history_complete=False,
                                       harness_errors=["the etcd watch ended early"]))
    assert verdict == "fail" and fails == {"I1": 1}, fails



def _lost_with_worker(x: Synth, directory: Path, retry_after_kill_ms: int) -> Run:
    """s-004's run at 40 s is handed to r1-w2, which a fault kills before the run's effect (F7); the run is
    retried on r1-w1 `retry_after_kill_ms` after the kill, as the heartbeat timeout allows."""
    sid, t = "s-004", T0 + 40_000
    eid, tok = execution_id(sid, t), token_of(x, sid)
    key = KS.execution(partition_for(sid, P), sid, t).decode()
    x.watch = [w for w in x.watch if w.key != key]
    x.effects = [e for e in x.effects if e.exec_id != eid]
    kill, retry = t + 300, t + 300 + retry_after_kill_ms
    e = new_execution(id=eid, schedule_id=sid, tenant="t", pool="default", task_type="http", planned_ms=t,
                      due_ms=t, trigger=Trigger.SCHEDULED, retry=POLICIES.retry, timeout_ms=30_000)
    x.record(e, t - 1000)
    e = dispatch(e, worker="", planner="r1-p2", token=tok, now_ms=t + 10)
    x.record(e, t + 10)
    e = started(e, 1, t + 30, "r1-w2")
    x.record(e, t + 30)
    e, _ = result(e, 1, succeeded=False, error_class=ErrorClass.TIMEOUT, message="worker gone", now_ms=retry - 1000,
                  worker="r1-w2")
    x.record(e, retry - 1000)
    e = dispatch(e, worker="", planner="r1-p2", token=tok, now_ms=retry)
    x.record(e, retry)
    e = started(e, 2, retry + 20, "r1-w1")
    x.record(e, retry + 20)
    x.effect(eid, 2, tok, "r1-w1", retry + 40, retry + 120)
    e, _ = result(e, 2, succeeded=True, error_class=None, message="", now_ms=retry + 140, worker="r1-w1")
    x.record(e, retry + 140)
    x.faults.append(FaultRecord(1, "F7", "r1-w2", kill, kill + 1000, {}, "worker", healthy_ms=kill + 1500))
    return x.build(directory)


@pytest.mark.parametrize(("after_ms", "fails"), [(13_000, False), (19_000, True)])
def test_a_run_whose_worker_was_killed_is_judged_from_the_kill_on_the_worker_loss_bound(
        tmp_path: Path, after_ms: int, fails: bool) -> None:
    """Its retry must wait until the worker is known gone (the heartbeat timeout): 13 s after the kill is
    within `worker_loss_s` (16 s) though far over `fault_max_s` (6 s); 19 s is not. The half game day had three
    such runs judged on the fault bound (a region loss 0.1-0.35 s after their dispatch)."""
    x, _ = clean_run(tmp_path / "run")
    _, fails_by, _ = judged(_lost_with_worker(x, tmp_path / "lost", after_ms))
    if fails:
        assert fails_by.get("I3") == 1, fails_by
    else:
        assert "I3" not in fails_by, fails_by


@pytest.mark.parametrize(("outage_after_kill_ms", "fails"), [(2_400, False), (17_000, True)])
def test_a_lost_attempt_held_through_a_quorum_loss_is_judged_from_the_heal(
        tmp_path: Path, outage_after_kill_ms: int, fails: bool) -> None:
    """The worker is killed, then etcd loses quorum before its attempt could be given up: nothing is written
    until the heal, so the run, retried 20.4 s after the kill and 10.1 s after the heal, is judged from the
    heal (game day gd-s17a, every3-010@07:10:58: F7 on r3-w2, F4 of 2 members 2.4 s later for 7.9 s). An
    outage that began only after the retry was owed (17 s after the kill) excuses nothing."""
    x, _ = clean_run(tmp_path / "run")
    kill = T0 + 40_000 + 300
    start = kill + outage_after_kill_ms
    end = start + 1_500 if fails else kill + 10_300
    x.faults.append(FaultRecord(2, "F4", "etcd-1", start, end, {"members": 2}, "etcd", "etcd member loss",
                                healthy_ms=end + 200))
    _, fails_by, _ = judged(_lost_with_worker(x, tmp_path / "lost", 20_400))
    if fails:
        assert fails_by.get("I3") == 1, fails_by
    else:
        assert "I3" not in fails_by, fails_by


def _planned(key: str) -> int:
    return int(key.rsplit("/", 1)[1])


@pytest.mark.parametrize("policy", [Overlap.SKIP, Overlap.CANCEL_OTHER])
def test_a_superseded_skip_is_justified_only_under_cancel_other(tmp_path: Path, policy: Overlap) -> None:
    """`superseded` (cancel_other's newest-wins: an older run of a backlog skipped because a newer one was due
    too) is justified by the policy and a later due planned time, not by a run in progress at that instant.
    slow-000's overlap skips relabelled: under skip they are unjustified, under cancel_other they pass."""
    x, _ = clean_run(tmp_path / "run")
    key = KS.schedule(partition_for("slow-000", P), "slow-000").decode()
    value = encode_schedule(sched("slow-000", overlap=policy), activated_ms=T0 - 5000)
    x.watch = [replace(w, value=value) if w.key == key else w for w in x.watch]
    # Each skip written as the next planned time (a second later) came due: a backlog of two.
    x.watch = [replace(w, value=w.value.replace(b'"overlap_skip"', b'"superseded"'), t_ms=w.t_ms + 1000)
               if "/slow-000/" in w.key and b'"overlap_skip"' in w.value and _planned(w.key) < T0 + 50_000 else w
               for w in x.watch]
    _, fails, _ = judged(x.build(tmp_path / "run"))
    if policy is Overlap.SKIP:
        assert fails.get("I2", 0) >= 20, fails
    else:
        assert "I2" not in fails, fails


@pytest.mark.parametrize("skewed", [False, True])
def test_a_superseded_skip_by_a_skewed_planner_is_judged_within_the_skew_bound(tmp_path: Path, skewed: bool) -> None:
    """Game day, session 31: 0.25 s into a +30 s F6, its planning clock held about 1 s ahead, a planner found the
    next run of a cancel_other schedule due 0.9 s before it was and superseded the one before it. Within the
    documented skew bound (docs/time.md, "Clock skew") that is justified when the partition's owner was skewed
    then; without a skew on it, a skip written 0.9 s before the later run came due is not (I2)."""
    x, _ = clean_run(tmp_path / "run")
    key = KS.schedule(partition_for("slow-000", P), "slow-000").decode()
    value = encode_schedule(sched("slow-000", overlap=Overlap.CANCEL_OTHER), activated_ms=T0 - 5000)
    x.watch = [replace(w, value=value) if w.key == key else w for w in x.watch]
    x.watch = [replace(w, value=w.value.replace(b'"overlap_skip"', b'"superseded"'), t_ms=_planned(w.key) + 100)
               if "/slow-000/" in w.key and b'"overlap_skip"' in w.value and _planned(w.key) < T0 + 50_000 else w
               for w in x.watch]
    if skewed:
        node = x.owners[partition_for("slow-000", P)][0]
        x.faults.append(FaultRecord(2, "F6", node, T0, T0 + 55_000, {"offset": "+30s"}, "planner", "clock skew",
                                    healthy_ms=T0 + 56_000))
    _, fails, _ = judged(x.build(tmp_path / "s"))
    if skewed:
        assert "I2" not in fails, fails
    else:
        assert fails.get("I2", 0) >= 20, fails


def _backfill_started_behind(x: Synth, sid: str, t2: int, worker: str) -> tuple[Execution, FencingToken]:
    """`sid`'s run at `t2` taken out of the history, and a backfill run of `sid` (one planned time long past)
    created, dispatched and started on `worker` 0.6 s after `t2` came due. Returns it and its token."""
    x.watch = [w for w in x.watch if w.key != KS.execution(partition_for(sid, P), sid, t2).decode()]
    x.effects = [e for e in x.effects if e.exec_id != execution_id(sid, t2)]
    p = partition_for(sid, P)
    node, tok = x.owners[p]
    token = FencingToken(p, tok)
    past = T0 + 5_500
    e = new_execution(id=execution_id(sid, past), schedule_id=sid, tenant="t", pool="default", task_type="http",
                      planned_ms=past, due_ms=t2 + 580, trigger=Trigger.BACKFILL, retry=POLICIES.retry,
                      timeout_ms=30_000)
    x.record(e, t2 + 580)
    e = dispatch(e, worker="", planner=node, token=token, now_ms=t2 + 590)
    x.record(e, t2 + 590)
    e = started(e, 1, t2 + 600, worker)
    x.record(e, t2 + 600)
    return e, token


def _queued_behind(x: Synth, sid: str, hold_ms: int) -> int:
    """A backfill run of `sid` (one planned time long past) starts 0.6 s after `sid`'s run at 43 s came due
    and runs `hold_ms`; the run at 43 s starts right after it ends. Returns its planned time."""
    from tests.chaos.synth import run_one

    t2 = T0 + 43_000
    e, token = _backfill_started_behind(x, sid, t2, "r1-w1")
    p = partition_for(sid, P)
    x.effect(e.id, 1, token, "r1-w1", t2 + 610, t2 + 610 + hold_ms)
    e, _ = result(e, 1, succeeded=True, error_class=None, message="", now_ms=t2 + 630 + hold_ms, worker="r1-w1")
    x.record(e, t2 + 630 + hold_ms)
    run_one(x, sched(sid), t2, x.owners[p], t2 + 640 + hold_ms, "r1-w2")
    return t2


@pytest.mark.parametrize(("policy", "later", "fails"), [(Overlap.BUFFER_ALL, None, False),
                                                     (Overlap.BUFFER_ALL, Overlap.ALLOW_ALL, False),
                                                     (Overlap.ALLOW_ALL, None, True)])
def test_a_run_queued_behind_its_own_schedules_run_is_judged_from_that_runs_end(
        tmp_path: Path, policy: Overlap, later: Overlap | None, fails: bool) -> None:
    """Under a waiting policy (buffer_one, buffer_all) a run that waits for a run of its own schedule that
    started after it came due (a backfill's, a rerun's, queued ahead of it) starts when that one ends: the
    wait is the policy's, and its lag counts from that end. A game day's buffer_one schedule waited 34 s
    behind a backfill of ten 3.6 s runs and read as 34 s late. Under allow_all nothing excuses the wait."""
    x, _ = clean_run(tmp_path / "run")
    sid = "s-007"
    key = KS.schedule(partition_for(sid, P), sid).decode()
    value = encode_schedule(sched(sid, overlap=policy), activated_ms=T0 - 5000)
    x.watch = [replace(w, value=value) if w.key == key else w for w in x.watch]
    _queued_behind(x, sid, hold_ms=7000)
    if later is not None:
        # A policy-only update after the wait (the same activation): the wait is judged on the policy in
        # force while it waited, not on the activation's last version.
        x.schedule(sched(sid, overlap=later), T0 - 5000, T0 + 55_000)
    _, fails_by, _ = judged(x.build(tmp_path / "q"))
    if fails:
        assert fails_by.get("I3", 0) >= 1, fails_by
    else:
        assert "I3" not in fails_by, fails_by


@pytest.mark.parametrize(("update_after_ms", "fails"), [(20, False), (-900, True)])
def test_an_overlap_skip_next_to_a_policy_update_is_judged_on_the_policy_either_side(
        tmp_path: Path, update_after_ms: int, fails: bool) -> None:
    """A full game day's buffer_one schedule wrote an overlap skip 20 ms before an update to allow_all landed
    (the API call was in flight): judged on the version seen within the slack after the write, allow_all, it
    read as a skip its policy never makes. The owner decided on the policy it held; any version in force
    within SLACK_MS of the write may justify it. An update 0.9 s before the skip does not."""
    x, _ = clean_run(tmp_path / "run")
    skips = [w for w in x.watch if "/slow-000/" in w.key and b'"overlap_skip"' in w.value]
    assert skips
    last = skips[len(skips) // 2]  # one well inside the window, its write moved to the end
    x.watch.remove(last)
    end = max(w.t_ms for w in x.watch) + 100
    skip_at, update_at = (end, end + update_after_ms) if update_after_ms > 0 else (end - update_after_ms, end)
    first, second = sorted([("skip", skip_at), ("update", update_at)], key=lambda kv: kv[1])
    for what, at in (first, second):
        if what == "skip":
            x.put(last.key.encode(), last.value, at)
        else:
            x.schedule(sched("slow-000", overlap=Overlap.ALLOW_ALL), T0 - 5000, at)
    _, fails_by, _ = judged(x.build(tmp_path / "u"))
    if fails:
        assert fails_by.get("I2", 0) == 1, fails_by
    else:
        assert "I2" not in fails_by, fails_by


def _queued_behind_a_killed_run(x: Synth, sid: str, given_up_after_kill_ms: int) -> None:
    """A backfill run of `sid` starts on r1-w2 0.6 s after `sid`'s run at 43 s came due (so that run queues
    behind it); a fault kills r1-w2 2 s later; the attempt is given up `given_up_after_kill_ms` after the
    kill and retried on r1-w1, and the run at 43 s starts at that moment."""
    t2 = T0 + 43_000
    e, token = _backfill_started_behind(x, sid, t2, "r1-w2")
    p = partition_for(sid, P)
    node = x.owners[p][0]
    kill = t2 + 2_600
    freed = kill + given_up_after_kill_ms
    x.effect(e.id, 1, token, "r1-w2", t2 + 610, kill, aborted=True)
    x.faults.append(FaultRecord(1, "F7", "r1-w2", kill, kill + 1000, {}, "worker", healthy_ms=kill + 1500))
    e, _ = result(e, 1, succeeded=False, error_class=ErrorClass.TIMEOUT, message="worker gone", now_ms=freed,
                  worker="r1-w2")
    x.record(e, freed)
    from tests.chaos.synth import run_one
    run_one(x, sched(sid, overlap=Overlap.SKIP), t2, x.owners[p], freed + 10, "r1-w1", hold_ms=200)
    e = dispatch(e, worker="", planner=node, token=token, now_ms=freed + 400)
    x.record(e, freed + 400)
    e = started(e, 2, freed + 420, "r1-w1")
    x.record(e, freed + 420)
    x.effect(e.id, 2, token, "r1-w1", freed + 430, freed + 500)
    e, _ = result(e, 2, succeeded=True, error_class=None, message="", now_ms=freed + 520, worker="r1-w1")
    x.record(e, freed + 520)


@pytest.mark.parametrize(("policy", "after_ms", "fails"), [(Overlap.SKIP, 10_800, False),
                                                          (Overlap.SKIP, 19_000, True),
                                                          (Overlap.ALLOW_ALL, 10_800, True)])
def test_a_run_queued_behind_a_run_whose_worker_was_killed_is_judged_from_the_kill(
        tmp_path: Path, policy: Overlap, after_ms: int, fails: bool) -> None:
    """Under skip too, a run queues behind a run of its schedule that started after its due time (no overlap:
    neither skipped nor run beside it). When that run's worker is killed, nothing starts behind it until its
    attempt is given up, the heartbeat timeout after the kill: the queued run's wait is the worker loss's,
    judged from the kill on `worker_loss_s` (16 s). A game day's skip schedule waited 13.5 s so, 10.8 s after
    the kill, and read as late against the 8 s fault bound. 19 s after the kill is late; under allow_all
    nothing excuses the wait."""
    x, _ = clean_run(tmp_path / "run")
    sid = "s-007"
    key = KS.schedule(partition_for(sid, P), sid).decode()
    value = encode_schedule(sched(sid, overlap=policy), activated_ms=T0 - 5000)
    x.watch = [replace(w, value=value) if w.key == key else w for w in x.watch]
    _queued_behind_a_killed_run(x, sid, after_ms)
    _, fails_by, _ = judged(x.build(tmp_path / "k"))
    if fails:
        assert fails_by.get("I3", 0) >= 1, fails_by
    else:
        assert "I3" not in fails_by, fails_by


def test_a_run_due_just_before_a_quorum_loss_is_the_outages(tmp_path: Path) -> None:
    """A run due 0.2 s before a quorum loss (nothing starts until the heal: a start is recorded in etcd
    first), inside the settle time of a worker crash before it: judged from the heal, as the outage's. A game
    day had 40 such runs read as 8-9.5 s late "in the F7"."""
    from tests.chaos.synth import run_one

    x, _ = clean_run(tmp_path / "run")
    sid, t = "s-004", T0 + 40_000
    key = KS.execution(partition_for(sid, P), sid, t).decode()
    x.watch = [w for w in x.watch if w.key != key]
    x.effects = [e for e in x.effects if e.exec_id != execution_id(sid, t)]
    heal = t + 200 + 10_000
    run_one(x, sched(sid), t, x.owners[partition_for(sid, P)], heal + 300, "r1-w1")
    x.faults.append(FaultRecord(1, "F7", "r1-w2", t - 1500, t - 500, {}, "worker", "worker crash",
                                healthy_ms=t - 400))
    x.faults.append(FaultRecord(2, "F4", "etcd-1", t + 200, heal, {"members": 2}, "etcd", "etcd member loss",
                                healthy_ms=heal + 200))
    _, fails_by, _ = judged(x.build(tmp_path / "o"))
    assert "I3" not in fails_by, fails_by


@pytest.mark.parametrize(("written", "fails"), [(T0 + 35_200, False), (T0 + 29_500, True)])
def test_a_paused_skip_is_justified_by_a_pause_between_its_time_and_the_skip(
        tmp_path: Path, written: int, fails: bool) -> None:
    """s-005's run at 29 s, due and not started when the pause at 30 s came, is withdrawn as `paused`; the
    owner wrote the skip after the resume at 35 s (docs/time.md, Activation): justified. Written at 29.5 s,
    before any pause, it is not."""
    x, _ = clean_run(tmp_path / "run")
    sid, t = "s-005", T0 + 29_000
    key = KS.execution(partition_for(sid, P), sid, t).decode()
    eid = execution_id(sid, t)
    x.watch = [w for w in x.watch if w.key != key]
    x.effects = [e for e in x.effects if e.exec_id != eid]
    e = new_execution(id=eid, schedule_id=sid, tenant="t", pool="default", task_type="http", planned_ms=t,
                      due_ms=t, trigger=Trigger.SCHEDULED, retry=POLICIES.retry, timeout_ms=30_000)
    x.record(e, t - 1000)
    x.record(replace(e, state=ExecState.SKIPPED, skip_reason="paused"), written)
    _, fails_by, _ = judged(x.build(tmp_path / "p"))
    if fails:
        assert fails_by.get("I2", 0) >= 1, fails_by
    else:
        assert "I2" not in fails_by, fails_by


@pytest.mark.parametrize(("start_after_resume_ms", "fails"), [(30, False), (4_000, True)])
def test_a_run_that_waited_through_a_pause_is_judged_from_the_resume(
        tmp_path: Path, start_after_resume_ms: int, fails: bool) -> None:
    """s-009's run at 45 s was dispatched as it came due; its start was never confirmed (the stream broke) and
    the pause 5 ms later parks its retry until the resume at 56 s (a pause starts nothing). Started 30 ms after
    the resume it is on time, though 11 s after its due time (a game day read such a run as 10.5 s late); 4 s
    after the resume, outside any fault window, it is late."""
    x, _ = clean_run(tmp_path / "run")
    sid, t, resume = "s-009", T0 + 45_000, T0 + 56_000
    p = partition_for(sid, P)
    node, tok = x.owners[p]
    token = FencingToken(p, tok)
    gone = {KS.execution(p, sid, T0 + s * 1000).decode() for s in range(45, 57)}
    x.watch = [w for w in x.watch if w.key not in gone]
    x.effects = [e for e in x.effects
                 if not (e.exec_id.startswith(sid + "@") and t <= ExecutionId.parse(e.exec_id).planned_ms <= resume)]
    x.schedule(replace(sched(sid), state=ScheduleState.PAUSED), t + 5, t + 5)
    x.ops.append(OpRecord(t, "pause", sid, True, t + 10))
    x.schedule(sched(sid), resume, resume)
    x.ops.append(OpRecord(resume - 10, "resume", sid, True, resume + 10))
    x.skip_range(sid, t, resume, "paused", resume + 100)
    e = new_execution(id=execution_id(sid, t), schedule_id=sid, tenant="t", pool="default", task_type="http",
                      planned_ms=t, due_ms=t, trigger=Trigger.SCHEDULED, retry=POLICIES.retry, timeout_ms=30_000)
    x.record(e, t - 1000)
    e = dispatch(e, worker="", planner=node, token=token, now_ms=t + 3)
    e, _ = result(e, 1, succeeded=False, error_class=ErrorClass.TRANSIENT, message="not started", now_ms=t + 20,
                  worker="r1-w1", not_started=True)
    x.record(e, t + 20)
    begin = resume + start_after_resume_ms
    e = dispatch(e, worker="", planner=node, token=token, now_ms=begin - 20)
    e = started(e, 2, begin - 10, "r1-w1")
    x.record(e, begin - 10)
    x.effect(e.id, 2, token, "r1-w1", begin, begin + 80)
    e, _ = result(e, 2, succeeded=True, error_class=None, message="", now_ms=begin + 100, worker="r1-w1")
    x.record(e, begin + 100)
    _, fails_by, _ = judged(x.build(tmp_path / "w"))
    if fails:
        assert fails_by.get("I3", 0) >= 1, fails_by
    else:
        assert not fails_by, fails_by


@pytest.mark.parametrize(("start_after_replay_ms", "fails"), [(30, False), (4_000, True)])
def test_a_replayed_dead_letter_is_judged_from_the_replay(
        tmp_path: Path, start_after_replay_ms: int, fails: bool) -> None:
    """s-009's run at 45 s never started: its one attempt was refused (the sink took it for stale) and it ended
    a dead letter; a worker was killed meanwhile; an operator replayed it at 80 s. Started 30 ms after the replay
    it is on time: it is the run the operator asked for (a game day read such a run, replayed 1,051 s after its
    planned time, as `lag-worker-lost`). Started 4 s after the replay, outside any fault window, it is late."""
    x, _ = clean_run(tmp_path / "run")
    sid, t, again = "s-009", T0 + 45_000, T0 + 80_000
    p = partition_for(sid, P)
    node, tok = x.owners[p]
    token = FencingToken(p, tok)
    key = KS.execution(p, sid, t).decode()
    x.watch = [w for w in x.watch if w.key != key]
    x.effects = [e for e in x.effects if e.exec_id != execution_id(sid, t)]
    x.faults.append(FaultRecord(1, "F7", "r1-w1", t + 2_000, t + 3_000, {}, "worker", "worker crash",
                                healthy_ms=t + 3_100))
    e = new_execution(id=execution_id(sid, t), schedule_id=sid, tenant="t", pool="default", task_type="http",
                      planned_ms=t, due_ms=t, trigger=Trigger.SCHEDULED, retry=POLICIES.retry, timeout_ms=30_000)
    x.record(e, t - 1000)
    e = dispatch(e, worker="r1-w1", planner=node, token=token, now_ms=t + 3)
    x.record(e, t + 3)
    e, _ = result(e, 1, succeeded=False, error_class=ErrorClass.PERMANENT, message="refused as stale",
                  now_ms=t + 50, worker="r1-w1")
    assert e.state is ExecState.DEAD_LETTER, e.state
    x.record(e, t + 50)
    e = replay(e, again)
    x.record(e, again)
    x.ops.append(OpRecord(again - 10, "replay", sid, True, again + 10))
    begin = again + start_after_replay_ms
    e = dispatch(e, worker="r1-w2", planner=node, token=token, now_ms=begin - 20)
    e = started(e, e.attempt, begin - 10, "r1-w2")
    x.record(e, begin - 10)
    x.effect(e.id, e.attempt, token, "r1-w2", begin, begin + 80)
    e, _ = result(e, e.attempt, succeeded=True, error_class=None, message="", now_ms=begin + 100, worker="r1-w2")
    x.record(e, begin + 100)
    _, fails_by, _ = judged(x.build(tmp_path / "w"))
    if fails:
        assert fails_by.get("I3", 0) >= 1, fails_by
    else:
        assert "I3" not in fails_by, fails_by


@pytest.mark.parametrize("first_attempt_ends_ms", [11_500, 12_100])
def test_a_retry_beside_a_run_due_while_its_attempt_ran_fails_i9(tmp_path: Path, first_attempt_ends_ms: int) -> None:
    """I9 (skip here): the retry of slow-000@10 s starts at 12.2 s beside the run due at 12 s. A violation when
    attempt 1 still ran at 12 s (the game days' 100-odd pairs a run before the retry-holds change), and since
    game day gd-s21b when that run came due in the retry's backoff gap too (attempt 1 ended at 11.5 s): it
    waits for the retry to end (docs/time.md)."""
    x, _ = clean_run(tmp_path / "run")
    eid = execution_id("slow-000", T0 + 10_000)
    x.effects = [replace(e, t_ms=T0 + first_attempt_ends_ms) if e.exec_id == eid and e.phase == "end" else e
                 for e in x.effects]
    x.effect(eid, 2, token_of(x, "slow-000"), "r1-w1", T0 + 12_200, T0 + 12_300)
    _, fails, _ = judged(x.build(tmp_path / "run"))
    assert fails.get("I9", 0) == 1, fails


@pytest.mark.parametrize(("update_seen_ms", "fails"), [(T0 + 40_010, False), (T0 + 38_000, True)])
def test_a_policy_update_counts_from_when_the_owner_decided_the_run(
        tmp_path: Path, update_seen_ms: int, fails: bool) -> None:
    """I9: s-003 (allow_all) is updated to `skip` while its run of 39 s is still under way (its effect ends at
    40.5 s). Its run of 40 s was dispatched at 40.000 and its effect began at 40.040. An update committed
    10 ms after that dispatch was not the owner's to apply to it (docs/time.md: a change takes effect when the
    owner sees it), though it came before the effect began (game day gd-s25 failed on such a pair). One
    seen 2 s before the dispatch was: two runs at once under `skip`."""
    x, _ = clean_run(tmp_path / "run")
    t39 = T0 + 39_000
    before = execution_id("s-003", t39)
    key = KS.execution(partition_for("s-003", P), "s-003", t39).decode()
    done = [w for w in x.watch if w.key == key][-1]  # its result, recorded at 40.520 instead
    x.watch = [w for w in x.watch if w is not done]
    x.effects = [replace(e, t_ms=T0 + 40_500) if e.exec_id == before and e.phase == "end" else e
                 for e in x.effects]
    x.schedule(sched("s-003", overlap=Overlap.SKIP), T0 - 5000, update_seen_ms)
    e = new_execution(id=before, schedule_id="s-003", tenant="t", pool="default", task_type="http", planned_ms=t39,
                      due_ms=t39, trigger=Trigger.SCHEDULED, retry=POLICIES.retry, timeout_ms=30_000)
    e = started(dispatch(e, worker="", planner=x.owners[partition_for("s-003", P)][0],
                         token=token_of(x, "s-003"), now_ms=t39), 1, t39 + 20, "r1-w2")
    e, _ = result(e, 1, succeeded=True, error_class=None, message="", now_ms=T0 + 40_520, worker="r1-w2")
    x.record(e, T0 + 40_520)
    x.ops.append(OpRecord(update_seen_ms - 20, "update", "s-003", True, update_seen_ms + 20))
    _, fails_by, _ = judged(x.build(tmp_path / "u"))
    if fails:
        assert fails_by.get("I9", 0) == 1, fails_by
    else:
        assert "I9" not in fails_by, fails_by


def test_a_retry_whose_first_attempt_left_no_effect_may_not_start_beside_a_run(tmp_path: Path) -> None:
    """I9: attempt 1 of slow-000@10 s never reached the sink (its worker was killed as it started, game day
    gd-s18a); its retry at 12.2 s beside the run due at 12 s is two runs at once all the same (allowed until
    gd-s21b as the backoff-gap case)."""
    x, _ = clean_run(tmp_path / "run")
    eid = execution_id("slow-000", T0 + 10_000)
    x.effects = [e for e in x.effects if e.exec_id != eid]
    x.effect(eid, 2, token_of(x, "slow-000"), "r1-w1", T0 + 12_200, T0 + 12_300)
    _, fails, _ = judged(x.build(tmp_path / "run"))
    assert fails.get("I9", 0) == 1, fails


@pytest.mark.parametrize("skewed", [False, True])
def test_an_overlap_skip_read_off_a_record_a_skewed_planner_stamped_is_judged_within_the_skew_bound(
        tmp_path: Path, skewed: bool) -> None:
    """Game day, session 18: an F6 skew (+30 s, held to about +1 s by the planning clock) made a planner stamp a
    dispatch 1 s late; the next owner read the run's end off that record and skipped the run due 0.95 s after
    the real end. Within the documented skew bound that skip is justified; without a skew on the planner that
    stamped the record it is a manufactured overlap (I2)."""
    x, _ = clean_run(tmp_path / "run")
    t = T0 + 40_000  # slow-000's run of 40 s ended at 40.1 s instead of 41.54 s: the skip of 41 s has no overlap
    eid = execution_id("slow-000", t)
    x.effects = [e for e in x.effects if not (e.exec_id == eid and e.phase == "end")]
    start = next(e for e in x.effects if e.exec_id == eid)
    x.effects.append(replace(start, seq=max(e.seq for e in x.effects) + 1, phase="end", t_ms=T0 + 40_100))
    key = KS.execution(partition_for("slow-000", P), "slow-000", t).decode()
    x.watch = [replace(w, t_ms=T0 + 40_125) if w.key == key and b'"succeeded"' in w.value else w for w in x.watch]
    if skewed:
        node = x.owners[partition_for("slow-000", P)][0]
        x.faults.append(FaultRecord(2, "F6", node, T0 + 39_500, T0 + 40_500, {"offset": "+30s"}, "planner",
                                    "clock skew", healthy_ms=T0 + 41_000))
    _, fails, _ = judged(x.build(tmp_path / "s"))
    if skewed:
        assert "I2" not in fails, fails
    else:
        assert fails.get("I2", 0) == 1, fails


@pytest.mark.parametrize("recorded", ["none", "maybe_applied"])
def test_a_rerun_whose_answer_never_came_allows_its_effect(tmp_path: Path, recorded: str) -> None:
    """Game day, session 19: the harness's rerun of the latest finished execution got no answer (the planner
    it asked was cut off), was applied all the same, and the retry chose again and reran another one. The
    harness now keeps its first choice across retries and records a failed request whose unanswered try may
    have been applied (`maybe_applied`): that rerun's effect is allowed; without the record it is a duplicate."""
    x, run = clean_run(tmp_path / "run")
    eid = execution_id("s-003", T0 + 10_000)
    tok = token_of(x, "s-003")
    first = next(e for e in run.effects if e.exec_id == eid and e.phase == "start")
    x.effect(eid, 2, tok, "r1-w2", first.t_ms + 5_000, first.t_ms + 5_100)
    if recorded == "maybe_applied":
        x.ops.append(OpRecord(first.t_ms + 4_000, "rerun", "s-003", False, first.t_ms + 9_000, {},
                              {"execution_id": eid, "maybe_applied": True}, "UNAVAILABLE: cut off"))
    _, fails, _ = judged(x.build(tmp_path / "r"))
    if recorded == "maybe_applied":
        assert "I1" not in fails, fails
    else:
        assert fails.get("I1") == 1, fails


@pytest.mark.parametrize("withdrawn", [True, False])
def test_a_run_of_a_time_the_new_spec_does_not_plan_fails_i2(tmp_path: Path, withdrawn: bool) -> None:
    """s-007 changed from every second to every 2 s at 40.9 s: its odd seconds from 43 s on are owed by no
    activation. Withdrawn (no record, no effect), I2 passes; run, each is `[not-owed-ran]`. The run at 41 s,
    100 ms after the change (within the watch's slack), may run under the spec before it."""
    x, _ = clean_run(tmp_path / "run")
    sid, at = "s-007", T0 + 40_900
    x.schedule(replace(sched(sid), spec="*/2 * * * * *"), at, at)
    x.ops.append(OpRecord(at - 10, "update", sid, True, at + 10))
    odd = {T0 + s * 1000 for s in range(43, 61, 2)}
    if withdrawn:
        keys = {KS.execution(partition_for(sid, P), sid, t).decode() for t in odd}
        x.watch = [w for w in x.watch if w.key not in keys]
        x.effects = [e for e in x.effects if not (e.schedule_id == sid and e.planned_ms in odd)]
    run = x.build(tmp_path / "c")
    write_run(run)
    i2 = check_run(load_run(run.directory)).invariants["I2"]
    lines = [line for line in i2.examples if "[not-owed-ran]" in line]
    if withdrawn:
        assert not i2.count, i2.examples
    else:
        assert lines and i2.count == len(lines), i2.examples
        assert {line.split()[1].rstrip(":") for line in lines} <= {execution_id(sid, t) for t in odd}
        assert not any(execution_id(sid, T0 + 41_000) in line for line in lines)  # within the slack


@pytest.mark.parametrize("by", ["the drill", "nobody"])
def test_a_cancelled_run_needs_a_cause_i2(tmp_path: Path, by: str) -> None:
    """I2: a cancel loses a run, so it must come from the overlap policy, a delete, or an operator's cancel of
    that run: here s-003@10 s, running, is cancelled with the drill's reason, by the drill's cancel op or by
    nobody (`[bad-cancel]`)."""
    from chaos.scenario import CANCEL_REASON
    from scheduler.execution import cancel

    x, _ = clean_run(tmp_path / "run")
    t = T0 + 10_000
    e = new_execution(id=execution_id("s-003", t), schedule_id="s-003", tenant="t", pool="default",
                      task_type="http", planned_ms=t, due_ms=t, trigger=Trigger.SCHEDULED,
                      retry=sched("s-003").policies.retry, timeout_ms=30_000)
    tok = token_of(x, "s-003")
    e = started(dispatch(e, worker="", planner="r1-p2", token=tok, now_ms=t), 1, t + 20, "r1-w1")
    e = cancel(e, CANCEL_REASON, t + 30, kill_after_ms=0)
    x.record(replace(e, state=ExecState.CANCELLED), t + 200)
    if by == "the drill":
        x.ops.append(OpRecord(t + 25, "cancel", "s-003", True, t + 35, result={"execution_id": e.id}))
    write_run(x.build(tmp_path / "run"))
    i2 = check_run(load_run(tmp_path / "run")).invariants["I2"]
    if by == "the drill":
        assert i2.count == 0, i2.examples
    else:
        assert i2.count == 1 and i2.examples[0].startswith("[bad-cancel]"), i2.examples


@pytest.mark.parametrize(("ahead_ms", "armed_at", "ok"), [
    (1000, 40_200, True),  # armed 100 ms before the pause, 800 ms before its time: started before the pause
    (0, 40_200, False),  # the planners do not start ahead: no excuse
    (1000, 40_400, False),  # its start was recorded after the pause: it had to be disarmed
    (400, 40_200, False),  # armed further ahead than the planners' start_ahead_ms (+ the watch's slack)
])
def test_a_run_armed_before_a_pause_may_run_after_it_under_start_ahead(
    tmp_path: Path, ahead_ms: int, armed_at: int, ok: bool
) -> None:
    """Start ahead (docs/time.md, Activation): s-006 is paused at 40.3 s; its run of 41 s was handed out ahead, its
    start recorded at `armed_at`, and ran at 41 s (its owner could not reach the worker in time). Started before
    the pause within the planners' start_ahead_ms, it counts as started then; otherwise `[not-owed-ran]`."""
    from chaos.context import SLACK_MS
    from scheduler.execution import dispatch, result, started

    assert SLACK_MS == 300, "the cases are placed around a watch slack of 300 ms"
    x, _ = clean_run(tmp_path / "run")
    sid, paused = "s-006", T0 + 40_300
    t = T0 + 41_000
    x.schedule(replace(sched(sid), state=ScheduleState.PAUSED), paused, paused)
    x.ops.append(OpRecord(paused - 10, "pause", sid, True, paused + 10))
    gone = {KS.execution(partition_for(sid, P), sid, T0 + s * 1000).decode() for s in range(41, 61)}
    x.watch = [w for w in x.watch if w.key not in gone]
    x.effects = [e for e in x.effects if not (e.schedule_id == sid and e.planned_ms > paused)]
    tok = token_of(x, sid)
    e = new_execution(id=execution_id(sid, t), schedule_id=sid, tenant="t", pool="default", task_type="http",
                      planned_ms=t, due_ms=t, trigger=Trigger.SCHEDULED, retry=sched(sid).policies.retry,
                      timeout_ms=30_000)
    x.record(e, T0 + 39_500)
    d = dispatch(e, worker="", planner="r1-p1", token=tok, now_ms=T0 + armed_at - 50, ahead_ms=1000)
    run_ = started(d, 1, T0 + armed_at, "r1-w1")
    x.record(run_, T0 + armed_at)
    done, _ = result(run_, 1, succeeded=True, error_class=None, message="", now_ms=t + 100, worker="r1-w1")
    x.record(done, t + 100)
    x.effect(e.id, 1, tok, "r1-w1", t, t + 50)
    scenario = SCENARIO_TEXT.replace("[cluster]\n", f"[cluster]\nplanner = {{ start_ahead_ms = {ahead_ms} }}\n", 1)
    _, fails, _ = judged(x.build(tmp_path / "c", scenario=scenario))
    if ok:
        assert "I2" not in fails, fails
    else:
        assert fails.get("I2") == 1, fails
