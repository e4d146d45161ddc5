"""Metrics building blocks and settings: histogram buckets, the cardinality guard, per-process
registries, the metrics_address setting, the lease observer hook and the execution log fields."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scheduler.config import parse_listen_address
from scheduler.errors import InvalidArgument
from scheduler.execution import ErrorClass, Execution, Trigger, dispatch, log_fields, result
from scheduler.ids import FencingToken, execution_id
from scheduler.metrics.core import OTHER, GuardedCounter, GuardedHistograms, LoopHistogram
from scheduler.metrics.planner import PlannerMetrics
from scheduler.metrics.worker import WorkerMetrics
from scheduler.model import RetryPolicy
from scheduler.planner.pending import PendingIndex
from scheduler.planner.settings import PlannerSettings
from scheduler.status import ClockStatus, NodeStatus, RegionStatus, WorkerProcessStatus
from scheduler.store.etcd.deadline import LeaseDeadline
from scheduler.store.etcd.types import Lease
from scheduler.worker.settings import WorkerSettings


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def execution(sid: str = "s1", planned_ms: int = 1_000, due_ms: int = 1_000, max_attempts: int = 3) -> Execution:
    return Execution(id=execution_id(sid, planned_ms), schedule_id=sid, tenant="t", pool="p", task_type="shell",
                     planned_ms=planned_ms, due_ms=due_ms, trigger=Trigger.SCHEDULED,
                     retry=RetryPolicy(max_attempts=max_attempts), timeout_ms=10_000)


def test_histogram_buckets_are_cumulative_and_le_inclusive() -> None:
    h = LoopHistogram((1.0, 5.0))
    for v in (0.5, 1.0, 3.0, 5.0, 7.0):
        h.observe(v)
    assert h.buckets() == [("1.0", 2.0), ("5.0", 4.0), ("+Inf", 5.0)]
    assert (h.count, h.sum) == (5, 16.5)


def test_guard_gives_the_first_n_values_a_series_and_the_rest_other() -> None:
    g = GuardedHistograms(2, (1.0,))
    for sid in ("a", "b", "c", "d", "a", "c"):
        g.observe(sid, 0.5)
    fam = g.family("lag_seconds", "doc", "schedule")
    counts = {s.labels["schedule"]: s.value for s in fam.samples if s.name == "lag_seconds_count"}
    assert counts == {"a": 2, "b": 1, OTHER: 3}
    c = GuardedCounter(1)
    c.inc("x")
    c.inc("y", 2)
    c.inc("x")
    assert c.counts == {"x": 2, OTHER: 2}


def test_each_planner_metrics_has_its_own_registry_and_the_guard_holds() -> None:
    a, b = PlannerMetrics(schedule_limit=2), PlannerMetrics(schedule_limit=2)
    now = 10_000
    tok = FencingToken(1, 5)
    a.dispatched([dispatch(execution(f"s{i}", due_ms=now - 250), worker="", planner="n", token=tok, now_ms=now)
                  for i in range(5)], now)
    ok = dispatch(execution("s0"), worker="", planner="n", token=tok, now_ms=now)
    a.attempt_recorded(result(ok, 1, succeeded=True, error_class=None, message="", now_ms=now)[0])
    last = dispatch(execution("s9", max_attempts=1), worker="", planner="n", token=tok, now_ms=now)
    a.attempt_recorded(result(last, 1, succeeded=False, error_class=ErrorClass.TIMEOUT, message="", now_ms=now)[0])
    sa, sb = samples(generate_latest(a.registry)), samples(generate_latest(b.registry))
    assert sa[("due_jobs_enqueued_total", ())] == 5 and sb[("due_jobs_enqueued_total", ())] == 0
    lag = {dict(k[1])["schedule"]: v for k, v in sa.items() if k[0] == "scheduler_start_lag_seconds_count"}
    assert lag == {"s0": 1, "s1": 1, OTHER: 3}
    assert sa[("scheduler_start_lag_seconds_sum", (("schedule", "s0"),))] == pytest.approx(0.25)
    assert sa[("execution_attempts_total", (("status", "succeeded"),))] == 1
    assert sa[("execution_attempts_total", (("status", "timeout"),))] == 1
    assert sa[("dead_letter_total", (("task_type", "shell"),))] == 1
    assert ("dead_letter_total", (("task_type", "shell"),)) not in sb


def test_worker_metrics_duration_histogram() -> None:
    m = WorkerMetrics()
    m.finished("shell", "succeeded", 12)
    m.finished("shell", "failed", 3_000)
    s = samples(generate_latest(m.registry))
    assert s[("execution_duration_ms_count", (("status", "succeeded"), ("task_type", "shell")))] == 1
    assert s[("execution_duration_ms_bucket", (("le", "25.0"), ("status", "succeeded"), ("task_type", "shell")))] == 1
    assert s[("execution_duration_ms_sum", (("status", "failed"), ("task_type", "shell")))] == 3_000


def test_worker_metrics_gauges_read_the_status_snapshot() -> None:
    m = WorkerMetrics()
    assert ("scheduler_worker_concurrency", ()) not in samples(generate_latest(m.registry)), "nothing to observe yet"
    m.observe(lambda: WorkerProcessStatus(
        worker_id="w1", pool="p", region="r", concurrency=8, task_types=("shell",), held=3, running=2,
        planners=("a:1", "b:2"), unacked_results=5, draining=False))
    m.received = 4
    s = samples(generate_latest(m.registry))
    assert {k[0]: v for k, v in s.items() if k[0].startswith("scheduler_worker_")} == {
        "scheduler_worker_assignments_received_total": 4, "scheduler_worker_running_attempts": 3,
        "scheduler_worker_duplicate_assignments_ignored_total": 0,
        "scheduler_worker_concurrency": 8, "scheduler_worker_connected_planners": 2,
        "scheduler_worker_unacked_results": 5}


@pytest.mark.parametrize(("value", "want"), [
    ("", None), ("off", None), ("OFF", None), ("127.0.0.1:9100", ("127.0.0.1", 9100)), ("0.0.0.0:0", ("0.0.0.0", 0)),
    ("[::1]:9100", ("::1", 9100)), ("localhost:65535", ("localhost", 65535)),
])
def test_listen_address_accepts(value: str, want: tuple[str, int] | None) -> None:
    assert parse_listen_address("metrics_address", value) == want


@pytest.mark.parametrize("value", ["9100", ":9100", "host:", "host:http", "host:65536", "on", "host:-1"])
def test_listen_address_refuses_naming_the_field(value: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        parse_listen_address("metrics_address", value)
    assert e.value.field == "metrics_address" and "is not host:port" in str(e.value)


def test_metrics_settings_from_flags_env_and_toml(tmp_path: Path) -> None:
    toml = tmp_path / "s.toml"
    toml.write_text('metrics_address = "127.0.0.1:9300"\nmetrics_schedule_limit = 7\n')
    assert PlannerSettings.load({}, env={}, toml_file=toml).metrics_address == "127.0.0.1:9300"
    assert PlannerSettings.load({}, env={"SCHED_METRICS_ADDRESS": "off"}, toml_file=toml).metrics_address == "off"
    assert WorkerSettings.load({"metrics_address": "127.0.0.1:0"}, env={}).metrics_address == "127.0.0.1:0"
    for cls in (PlannerSettings, WorkerSettings):
        with pytest.raises(InvalidArgument) as e:
            cls.load({}, env={"SCHED_METRICS_ADDRESS": "nowhere"})
        assert e.value.field == "metrics_address"
    with pytest.raises(InvalidArgument) as e:
        PlannerSettings.load({"metrics_schedule_limit": "-1"}, env={})
    assert e.value.field == "metrics_schedule_limit"


def test_oldest_ready_skips_stale_entries() -> None:
    idx = PendingIndex()
    e1, e2 = execution("a", 1_000, 1_000), execution("b", 2_000, 2_000)
    idx.put(e1)
    idx.put(e2)
    assert idx.oldest_ready() == 1_000
    idx.put(dispatch(e1, worker="", planner="n", token=FencingToken(3, 9), now_ms=1_500))  # no longer waiting
    assert idx.oldest_ready() == 2_000
    idx.remove(e2.id)
    assert idx.oldest_ready() is None


class _Observer:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.lost: list[str] = []

    def renewed(self, latency_s: float) -> None:
        self.latencies.append(latency_s)

    def renew_failed(self, reason: str) -> None:
        raise AssertionError("not expected here")

    def lease_lost(self, reason: str) -> None:
        self.lost.append(reason)


def test_lease_observer_sees_renew_latency_and_loss() -> None:
    now = [100.0]
    d = LeaseDeadline(lambda: now[0], Lease(id=1, ttl=5, sent_at=100.0), safety_margin=0.5)
    obs = _Observer()
    d.observer = obs
    now[0] = 101.25
    d._on_ack(101.0, 5)
    assert obs.latencies == [pytest.approx(0.25)]
    now[0] = 200.0
    assert not d.alive()
    assert obs.lost == ["local_deadline"]


def test_execution_log_fields() -> None:
    e = execution("sched-x")
    assert log_fields(e, 4, FencingToken(4, 77)) == {"execution_id": e.id, "schedule_id": "sched-x", "partition": 4,
                                       "token": "4:77", "attempt": 0, "state": "scheduled"}
    d = dispatch(e, worker="", planner="n", token=FencingToken(9, 123), now_ms=5_000)
    assert {k: log_fields(d)[k] for k in ("partition", "token", "attempt")} == {"partition": 9, "token": "9:123",
                                                                              "attempt": 1}


def test_clock_guard_gauges_read_the_status_snapshot() -> None:
    m = PlannerMetrics()
    m.observe(lambda: NodeStatus(now_ms=0, owned=(), clock=ClockStatus(
        eligible=False, offset_ms=30_002, peer_offsets_ms={"p1": 30_001, "p2": 30_004, "p4": None}, trips=1)))
    s = samples(generate_latest(m.registry))
    assert s[("scheduler_clock_offset_seconds", ())] == pytest.approx(30.002)
    assert s[("scheduler_clock_peer_offset_seconds", (("peer", "p1"),))] == pytest.approx(30.001)
    assert ("scheduler_clock_peer_offset_seconds", (("peer", "p4"),)) not in s, "no sample: no series"
    assert s[("scheduler_clock_skew_ineligible", ())] == 1
    assert s[("scheduler_clock_skew_trips_total", ())] == 1
    m.observe(lambda: NodeStatus(now_ms=0, owned=()))  # alone: no majority, eligible
    s = samples(generate_latest(m.registry))
    assert ("scheduler_clock_offset_seconds", ()) not in s and s[("scheduler_clock_skew_ineligible", ())] == 0


def test_region_gauges() -> None:
    m = PlannerMetrics()
    m.observe(lambda: NodeStatus(now_ms=0, owned=(), region=RegionStatus(
        region="b", role="standby", policy_version=7, changes={"automatic failover": 1},
        primary_last_seen_ago_ms=2500)))
    text = generate_latest(m.registry).decode()
    assert 'scheduler_region_role{region="b",role="standby"} 1.0' in text
    assert "scheduler_region_policy_version 7.0" in text
    assert 'scheduler_region_policy_changes_total{kind="automatic failover"} 1.0' in text
    assert 'scheduler_region_policy_changes_total{kind="switchover"} 0.0' in text
    assert "scheduler_region_primary_last_seen_seconds 2.5" in text


def test_planner_info_and_partition_count() -> None:
    """`scheduler_planner_info` maps a scrape target to its node id (what drain and cluster status name) and
    version; `scheduler_partitions` is P, so "unowned partitions" is `max(P) - sum(owned)` in a rule."""
    from scheduler import __version__
    from scheduler.status import PartitionStatus

    m = PlannerMetrics()
    m.observe(lambda: NodeStatus(now_ms=5_000, owned=(PartitionStatus(3, 6_000, None),), node_id="r1-p1",
                                 partitions=16, region=RegionStatus(region="r1", role="primary")))
    s = samples(generate_latest(m.registry))
    assert s[("scheduler_planner_info", (("node_id", "r1-p1"), ("region", "r1"), ("version", __version__)))] == 1
    assert s[("scheduler_partitions", ())] == 16
    assert s[("scheduler_partitions_owned", ())] == 1
    m.observe(lambda: NodeStatus(now_ms=0, owned=()))  # P unknown (a status built without settings): no series
    assert ("scheduler_partitions", ()) not in samples(generate_latest(m.registry))


def test_reason_counters_start_at_zero_for_every_reason_the_code_produces() -> None:
    """increase() cannot see a counter's first increment if the series is born with it, so every reason is
    exported at 0 from the start; the tuples must name exactly the reasons the code produces."""
    from scheduler.metrics import planner as pm
    from scheduler.planner.ownership import LostReason
    from scheduler.store.etcd.deadline import LeaseLostReason

    assert set(pm.PARTITION_LOST_REASONS) == {r.value for r in LostReason}
    assert set(pm.LEASE_LOST_REASONS) == {r.name.lower() for r in LeaseLostReason}  # deadline.py's label
    m = PlannerMetrics()
    m.observe(lambda: NodeStatus(now_ms=0, owned=(), restarts={"etcd_error": 2}))
    s = samples(generate_latest(m.registry))
    for name, reasons in (("scheduler_lease_renew_failures_total", pm.RENEW_FAILURE_REASONS),
                          ("scheduler_leases_lost_total", pm.LEASE_LOST_REASONS),
                          ("scheduler_partitions_lost_total", pm.PARTITION_LOST_REASONS),
                          ("scheduler_partition_restarts_total", pm.RESTART_REASONS)):
        assert {r for (n, labels), _ in s.items() if n == name for _, r in labels} == set(reasons), name
    assert s[("scheduler_partition_restarts_total", (("reason", "etcd_error"),))] == 2
    assert s[("scheduler_partition_restarts_total", (("reason", "stale_state"),))] == 0


def test_start_window_and_disarm_series_read_the_status_snapshot() -> None:
    m = PlannerMetrics()
    m.observe(lambda: NodeStatus(now_ms=0, owned=(), start_windows={"a": (1024, 700, 2, 5), "b": (64, 0, 9, 0)},
                                 disarmed=3))
    s = samples(generate_latest(m.registry))
    assert s[("scheduler_dispatch_start_window", (("pool", "a"),))] == 1024
    assert s[("scheduler_dispatch_start_window", (("pool", "b"),))] == 64
    assert s[("scheduler_dispatch_start_waiting", (("pool", "a"),))] == 700
    assert s[("scheduler_dispatch_start_window_cuts_total", (("pool", "b"),))] == 9
    assert s[("scheduler_dispatch_start_expired_total", (("pool", "a"),))] == 5
    assert s[("scheduler_dispatch_disarmed_total", ())] == 3
