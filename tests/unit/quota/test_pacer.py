"""The executions-per-second pacer (scheduler/quota/pacer.py) and the API's quota checks: pure."""

from __future__ import annotations

import itertools

import pytest

from scheduler.api.quota_checks import check_backfill, check_shape
from scheduler.errors import ResourceExhausted
from scheduler.execution import Execution, Trigger, new_execution
from scheduler.model import RetryPolicy, Schedule
from scheduler.quota.pacer import TenantPacer
from scheduler.quota.record import Quota


def run(tenant: str, planned: int, trigger: Trigger = Trigger.SCHEDULED) -> Execution:
    return new_execution(id=f"{tenant}@{planned}", schedule_id=tenant, tenant=tenant, pool="p", task_type="t",
                         planned_ms=planned, due_ms=planned, trigger=trigger, retry=RetryPolicy(), timeout_ms=1000)


def test_runs_over_the_rate_start_later_in_order_and_nothing_is_dropped() -> None:
    p = TenantPacer(lambda t: 10.0 if t == "a" else 0.0, lambda: 1.0)
    burst = [run("a", 1000 + i) for i in range(30)]
    out = list(p.pace([*burst, run("b", 1000)]))
    assert len(out) == 31  # every run comes out
    a = [e for e in out if e.tenant == "a"]
    assert [e.due_ms for e in a] == sorted(e.due_ms for e in a)
    assert a[0].due_ms == 1000 and a[0].quota_deferred_ms == 0
    assert all(y.due_ms - x.due_ms >= 99 for x, y in itertools.pairwise(a))  # 10/s: 100 ms apart
    assert all(e.due_ms == e.planned_ms + e.quota_deferred_ms for e in a)
    b = next(e for e in out if e.tenant == "b")
    assert b.due_ms == 1000 and b.quota_deferred_ms == 0  # no quota: untouched
    assert p.stats.runs.counts == {"a": 29}


def test_a_node_paces_with_its_share_and_only_planned_first_runs() -> None:
    p = TenantPacer(lambda t: 10.0, lambda: 0.25)  # owns a quarter of the partitions: 2.5/s here
    first, second = p.pace([run("a", 0), run("a", 0)])
    assert (first.due_ms, second.due_ms) == (0, 400)
    manual = run("a", 0, Trigger.BACKFILL)
    assert next(p.pace([manual])) is manual  # asked for by someone: not paced


def test_runs_under_the_rate_are_not_deferred_and_a_removed_quota_is_forgotten() -> None:
    rates = {"a": 1.0}
    p = TenantPacer(lambda t: rates.get(t, 0.0), lambda: 1.0)
    assert [e.due_ms for e in p.pace([run("a", 0), run("a", 1000), run("a", 2500)])] == [0, 1000, 2500]
    assert p.slot("a", 2600) == 3500
    rates.clear()
    p.forget()
    assert p.slot("a", 2700) == 2700


def test_shape_and_backfill_checks_name_the_quota_limit_and_use() -> None:
    s = Schedule(id="s", tenant="t", spec="* * * * *", worker_pool="p", task_type="x", labels={"a": "1", "b": "2"},
                 payload=b"xyz")
    check_shape(Quota(labels=2, payload_bytes=3), s)
    with pytest.raises(ResourceExhausted, match=r"schedules\[4\]\.labels: .*labels quota: limit 1 .* has 2"):
        check_shape(Quota(labels=1), s, "schedules[4]")
    with pytest.raises(ResourceExhausted, match="payload quota: limit 2 bytes, this one has 3"):
        check_shape(Quota(payload_bytes=2), s)
    plan = s.plan()
    check_backfill(Quota(backfill=10), "t", plan, 0, 10 * 60_000)  # exactly 10 minutes: 10 planned times
    with pytest.raises(ResourceExhausted, match="backfill quota: limit 9"):
        check_backfill(Quota(backfill=9), "t", plan, 0, 10 * 60_000)


def test_with_no_rate_anywhere_runs_pass_through_untouched() -> None:
    p = TenantPacer(lambda t: 5.0, lambda: 1.0, enabled=lambda: False)
    xs = [run("a", 0), run("a", 0)]
    assert list(p.pace(xs)) == xs and not p.stats.runs.counts
