"""A planner's held schedules share what they repeat (issue 12: <= 1 KiB of RSS per schedule)."""

from __future__ import annotations

import tracemalloc

from scheduler.clock import SystemClock
from scheduler.model import Policies, RetryPolicy, Schedule
from scheduler.planner.materialize import Materializer
from scheduler.planner.settings import PlannerSettings
from scheduler.store.codec import decode_stored_schedule, encode_schedule
from scheduler.store.schedules import StoredSchedule


def _value(i: int, spec: str = "0 0 1 1 *", **kw: object) -> bytes:
    s = Schedule(id=f"s{i:07d}", tenant=f"t{i % 10}", spec=spec, worker_pool="bench", task_type="noop", **kw)  # type: ignore[arg-type]
    return encode_schedule(s, activated_ms=1_700_000_000_000)


def test_decoded_schedules_share_policies_strings_and_plans() -> None:
    a, _, _ = decode_stored_schedule(_value(1), 1)
    b, _, _ = decode_stored_schedule(_value(11), 2)
    assert a.policies is b.policies
    assert a.spec is b.spec and a.worker_pool is b.worker_pool and a.tenant is b.tenant
    assert a.plan() is b.plan()


def test_what_differs_is_not_shared() -> None:
    a, _, _ = decode_stored_schedule(_value(1), 1)
    c, _, _ = decode_stored_schedule(_value(2, policies=Policies(catchup_cap=3, retry=RetryPolicy(max_attempts=5))), 2)
    assert c.policies.catchup_cap == 3 and c.policies.retry.max_attempts == 5
    assert a.policies is not c.policies
    assert a.plan() is not decode_stored_schedule(_value(3, time_zone="Europe/Paris"), 3)[0].plan()
    # `H` and `@every` depend on the schedule's id: those plans are the schedule's own.
    h1, _, _ = decode_stored_schedule(_value(4, spec="H H * * *"), 4)
    h2, _, _ = decode_stored_schedule(_value(5, spec="H H * * *"), 5)
    assert h1.plan() is not h2.plan()
    e1, _, _ = decode_stored_schedule(_value(6, spec="@every 1h"), 6)
    e2, _, _ = decode_stored_schedule(_value(7, spec="@every 1h"), 7)
    assert e1.plan() is not e2.plan()


def test_a_held_schedule_costs_well_under_a_kib() -> None:
    n = 20_000
    values = [_value(i) for i in range(n)]
    m = Materializer(0, PlannerSettings(), SystemClock(), set())
    tracemalloc.start()
    try:
        for i, v in enumerate(values):
            s, activated, meta = decode_stored_schedule(v, i + 1)
            m.track(StoredSchedule(s, activated, 0, meta), activated)
        size, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # ~710 B measured (1,683 B before sharing and slots); the bound leaves room for interpreter changes.
    assert size / n < 1024, size / n
