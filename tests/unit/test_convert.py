"""Domain <-> protobuf conversion at the edge: lossless round trips, defaults for unset fields."""

from __future__ import annotations

import pytest

from scheduler._gen.scheduler.v1 import schedule_pb2 as pb
from scheduler.api.convert import schedule_from_pb, schedule_to_pb
from scheduler.errors import InvalidArgument
from scheduler.ids import FencingToken
from scheduler.model import Policies, RetryPolicy, Schedule, ScheduleState, validate_schedule
from scheduler.timeplan import DstGap, DstOverlap, MissedRuns, Overlap

FULL = Schedule(
    id="billing-eu",
    tenant="acme",
    spec="30 2 * * *",
    worker_pool="pool-a",
    task_type="invoice",
    time_zone="Europe/London",
    payload=b"\x00\x01{}",
    labels={"team": "payments", "tier": "1"},
    state=ScheduleState.PAUSED,
    start_ms=1_767_225_600_000,
    end_ms=1_798_761_600_000,
    policies=Policies(
        missed_runs=MissedRuns.ALL,
        catchup_window_ms=7_200_000,
        catchup_cap=3,
        overlap=Overlap.BUFFER_ONE,
        dst_gap=DstGap.SKIP,
        dst_overlap=DstOverlap.BOTH,
        jitter_ms=15_000,
        retry=RetryPolicy(max_attempts=5, initial_backoff_ms=500, max_backoff_ms=30_000, multiplier=3.0,
                          max_unknown_attempts=2),
        execution_timeout_ms=60_000,
    ),
    version=7,
    paused_reason="maintenance",
)


def test_round_trip_keeps_every_field() -> None:
    assert schedule_from_pb(schedule_to_pb(FULL)) == FULL


def test_round_trip_through_the_wire() -> None:
    wire = schedule_to_pb(FULL).SerializeToString()
    assert schedule_from_pb(pb.Schedule.FromString(wire)) == FULL


def test_unset_fields_take_model_defaults() -> None:
    s = schedule_from_pb(pb.Schedule(id="a", tenant="t", spec="@hourly", worker_pool="p", task_type="x"))
    assert s == Schedule(id="a", tenant="t", spec="@hourly", worker_pool="p", task_type="x")
    validate_schedule(s)


def test_negative_duration_names_the_field() -> None:
    m = pb.Schedule(id="a", tenant="t", spec="@hourly", worker_pool="p", task_type="x")
    m.policies.jitter.seconds = -5
    with pytest.raises(InvalidArgument) as err:
        schedule_from_pb(m)
    assert err.value.field == "policies.jitter"


def test_unknown_enum_value_names_the_field() -> None:
    m = pb.Schedule(id="a", tenant="t", spec="@hourly", worker_pool="p", task_type="x")
    m.policies.overlap = 99  # type: ignore[assignment]
    with pytest.raises(InvalidArgument) as err:
        schedule_from_pb(m)
    assert err.value.field == "policies.overlap"


def test_an_attempt_shows_its_start_output_exit_code_and_cancel() -> None:
    from scheduler._gen.scheduler.v1 import execution_pb2 as epb
    from scheduler.api.convert import execution_to_pb
    from scheduler.execution import Attempt, ExecState, Execution, Trigger
    from scheduler.store.codec import decode_execution, encode_execution

    a = Attempt(1, "w1", "n1", FencingToken(3, 10), 1_000, 9_000, started_ms=1_200, finished_ms=2_000,
                start_by_ms=4_000, stdout_tail="hello\n", stderr_tail="oops\n", exit_code=0, stop_requested_ms=1_500)
    e = Execution(id="s@x", schedule_id="s", tenant="t", pool="p", task_type="shell", planned_ms=1_000,
                  due_ms=1_000, trigger=Trigger.SCHEDULED, retry=RetryPolicy(), timeout_ms=5_000,
                  state=ExecState.CANCELLED, attempt=1, attempts=(a,))
    assert decode_execution(encode_execution(e)) == e, "the record keeps every attempt field"
    out = execution_to_pb(e).attempts[0]
    assert out.outcome == epb.ATTEMPT_OUTCOME_CANCELLED, "finished with no error class: stopped by a cancel"
    assert (out.worker_id, out.started_at.ToMilliseconds(), out.start_by.ToMilliseconds()) == ("w1", 1_200, 4_000)
    assert (out.stdout_tail, out.stderr_tail, out.exit_code, out.stop_requested_at.ToMilliseconds()) == \
        ("hello\n", "oops\n", 0, 1_500)
    cancelling = execution_to_pb(Execution(**{**e.__dict__, "state": ExecState.CANCELLING}))
    assert cancelling.state == epb.EXECUTION_STATE_CANCELLING


def test_max_attempts_one_alone_means_never_retry() -> None:
    # An outside audit (session 36): `max_attempts = 1` ("1 = never retry", schedule.proto) was refused with
    # `max_unknown_attempts: must be between 1 and max_attempts`, a field the caller had not set (its default, 2).
    m = pb.Schedule(id="x", tenant="t", spec="* * * * *", worker_pool="p", task_type="x",
                    policies=pb.SchedulePolicies(retry=pb.RetryPolicy(max_attempts=1)))
    s = schedule_from_pb(m)
    validate_schedule(s)
    assert (s.policies.retry.max_attempts, s.policies.retry.max_unknown_attempts) == (1, 1)
    m.policies.retry.max_unknown_attempts = 2  # given, it is the caller's: refused, naming it and the bound
    with pytest.raises(InvalidArgument) as e:
        validate_schedule(schedule_from_pb(m))
    assert e.value.field == "policies.retry.max_unknown_attempts" and "1-max_attempts (1)" in e.value.reason


@pytest.mark.parametrize(("policies", "field"), [
    (pb.SchedulePolicies(retry=pb.RetryPolicy(backoff_multiplier=20)), "policies.retry.backoff_multiplier"),
    (pb.SchedulePolicies(missed_runs=pb.MissedRunPolicySettings(catchup_cap=0)), "policies.missed_runs.catchup_cap"),
])
def test_policy_errors_name_the_proto_field(policies: pb.SchedulePolicies, field: str) -> None:
    # The audit: `schedule.policies.retry.multiplier`, `schedule.policies.catchup_cap`: not the request's paths.
    m = pb.Schedule(id="x", tenant="t", spec="* * * * *", worker_pool="p", task_type="x", policies=policies)
    with pytest.raises(InvalidArgument) as e:
        validate_schedule(schedule_from_pb(m))
    assert e.value.field == field


@pytest.mark.parametrize("zone", ["localtime", "posixrules", "Factory", "right/UTC", "posix/America/New_York"])
def test_zone_files_that_are_not_iana_names_are_refused(zone: str) -> None:
    # The audit: `localtime` was stored and planned by each planner host's own /etc/localtime.
    m = pb.Schedule(id="x", tenant="t", spec="* * * * *", worker_pool="p", task_type="x", time_zone=zone)
    with pytest.raises(InvalidArgument) as e:
        validate_schedule(schedule_from_pb(m))
    assert e.value.field == "time_zone" and "IANA" in e.value.reason


def test_a_sub_millisecond_start_bound_is_rounded_up() -> None:
    # The audit: start_at 2031-01-01T00:00:00.000000001Z was stored as 00:00:00Z, which planned a run before it.
    m = pb.Schedule(id="x", tenant="t", spec="0 0 0 1 1 *", worker_pool="p", task_type="x")
    m.start_at.seconds, m.start_at.nanos = 1_924_992_000, 1  # 2031-01-01T00:00:00.000000001Z
    s = schedule_from_pb(m)
    assert s.start_ms == 1_924_992_000_001
    plan = validate_schedule(s)
    assert plan.next_after_ms(s.start_ms - 1) == 1_956_528_000_000  # 2032-01-01: the 2031 one is before the start


def test_a_start_after_the_planning_window_names_start_at() -> None:
    # The audit: start_at 9995 with no end_at said `spec: never fires between start_at and end_at`.
    m = pb.Schedule(id="x", tenant="t", spec="* * * * *", worker_pool="p", task_type="x")
    m.start_at.seconds = 253_260_000_000  # 9995-08-...
    with pytest.raises(InvalidArgument) as e:
        validate_schedule(schedule_from_pb(m))
    assert e.value.field == "start_at" and "9990-01-01" in e.value.reason
