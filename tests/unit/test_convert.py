"""Domain <-> protobuf conversion at the edge: lossless round trips, defaults for unset fields."""

from __future__ import annotations

import pytest

from scheduler._gen.scheduler.v1 import schedule_pb2 as pb
from scheduler.api.convert import schedule_from_pb, schedule_to_pb
from scheduler.errors import InvalidArgument
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
