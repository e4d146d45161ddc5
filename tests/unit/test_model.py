"""Schedule validation names the field and the reason; execution ids are deterministic."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.errors import InvalidArgument
from scheduler.ids import execution_id, format_rfc3339_ms
from scheduler.model import (
    MAX_PAYLOAD_BYTES,
    Policies,
    RetryPolicy,
    Schedule,
    parse_rfc3339,
    validate_schedule,
)
from scheduler.timeplan import MissedRuns

GOOD = Schedule(id="billing-eu.daily", tenant="acme", spec="0 2 * * *", worker_pool="default", task_type="invoice")


def test_good_schedule_validates_to_a_plan() -> None:
    plan = validate_schedule(GOOD)
    assert plan.next_after_ms(0) == 2 * 3_600_000


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        pytest.param({"id": ""}, "id", "is required", id="empty-id"),
        pytest.param({"id": "a/b"}, "id", "may only contain", id="slash-in-id"),
        pytest.param({"id": "-x"}, "id", "must start alphanumeric", id="leading-dash"),
        pytest.param({"id": "x@y"}, "id", "may only contain", id="at-sign-reserved-for-execution-ids"),
        pytest.param({"id": "a" * 129}, "id", "limit is 128", id="long-id"),
        pytest.param({"tenant": "a b"}, "tenant", "may only contain", id="tenant-space"),
        pytest.param({"worker_pool": ""}, "worker_pool", "is required", id="no-pool"),
        pytest.param({"task_type": "x" * 65}, "task_type", "limit is 64", id="long-task-type"),
        pytest.param({"payload": b"x" * (MAX_PAYLOAD_BYTES + 1)}, "payload", "limit is 65536", id="big-payload"),
        pytest.param({"labels": {f"k{i}": "v" for i in range(33)}}, "labels", "limit is 32", id="many-labels"),
        pytest.param({"labels": {"bad key": "v"}}, "labels['bad key']", "key must be", id="label-key"),
        pytest.param({"labels": {"k": "v" * 257}}, "labels['k']", "value is longer", id="label-value"),
        pytest.param({"spec": "61 * * * *"}, "spec.minute", "61 is outside 0-59", id="bad-spec"),
        pytest.param({"time_zone": "Nowhere/City"}, "time_zone", "not a known IANA", id="bad-zone"),
        pytest.param({"start_ms": 10, "end_ms": 5}, "end_at", "before start_at", id="bounds-order"),
        pytest.param({"start_ms": 1, "end_ms": 2}, "spec", "never fires", id="empty-window"),
        pytest.param({"policies": Policies(catchup_cap=0)}, "policies.missed_runs.catchup_cap", "outside", id="cap"),
        pytest.param({"policies": Policies(jitter_ms=-1)}, "policies.jitter", "between", id="jitter"),
        pytest.param({"policies": Policies(jitter_ms=90_000_000)}, "policies.jitter", "is 1d1h; must be between",
                     id="jitter-human-units"),
        pytest.param({"policies": Policies(execution_timeout_ms=10)}, "policies.execution_timeout",
                     "is 10ms; must be between 1s and 7d", id="timeout"),
        pytest.param({"policies": Policies(retry=RetryPolicy(max_attempts=0))}, "policies.retry.max_attempts",
                     "outside", id="attempts"),
        pytest.param({"policies": Policies(retry=RetryPolicy(initial_backoff_ms=5, max_backoff_ms=1))},
                     "policies.retry.initial_backoff", "(initial_backoff 5ms, max_backoff 1ms)", id="backoff-order"),
    ],
)
def test_invalid_schedule(change: dict[str, object], field: str, reason: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        validate_schedule(replace(GOOD, **change))  # type: ignore[arg-type]
    assert err.value.field == field
    assert reason in err.value.reason


def test_policies_default_to_catch_up_latest() -> None:
    assert GOOD.policies.missed_runs is MissedRuns.LATEST


def test_execution_id_is_schedule_and_planned_ms() -> None:
    assert execution_id("billing", 1_767_225_600_000) == "billing@2026-01-01T00:00:00.000Z"
    assert execution_id("billing", 1_767_225_600_123) == "billing@2026-01-01T00:00:00.123Z"
    assert format_rfc3339_ms(0) == "1970-01-01T00:00:00.000Z"


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("2026-01-01T00:00:00Z", 1_767_225_600_000),
        ("2026-01-01T01:00:00+01:00", 1_767_225_600_000),
        ("2026-01-01T00:00:00.250Z", 1_767_225_600_250),
    ],
)
def test_parse_rfc3339(text: str, ms: int) -> None:
    assert parse_rfc3339(text, "start") == ms


@pytest.mark.parametrize("text", ["2026-01-01T00:00:00", "tomorrow", ""])
def test_parse_rfc3339_refuses(text: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_rfc3339(text, "start")
    assert err.value.field == "start"


def test_spec_whose_every_time_falls_in_dst_gaps_never_fires() -> None:
    """02:30 on the second Sunday of March never exists in New York (since 2007): with dst_gap=skip the
    schedule has no instant at all, and validation says so instead of accepting a dead schedule."""
    from scheduler.timeplan import DstGap

    s = replace(GOOD, spec="30 2 * 3 0#2", time_zone="America/New_York",
                policies=Policies(dst_gap=DstGap.SKIP), start_ms=1_767_225_600_000)
    with pytest.raises(InvalidArgument) as err:
        validate_schedule(s)
    assert err.value.field == "spec"
    assert "never fires" in err.value.reason
