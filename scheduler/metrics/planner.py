"""A planner node's metrics. Names and labels are documented in docs/operations.md.

Events on the hot path (executions dispatched, results recorded) bump plain ints and lock-free
histograms, once per batch where the caller has one; everything that is a state (partitions owned,
lag, checkpoints, queue depth, workers) is read from the node when Prometheus scrapes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry

from scheduler import __version__
from scheduler.execution import ErrorClass, ExecState, Execution, Trigger
from scheduler.metrics.core import (
    SECONDS_BUCKETS,
    CallbackCollector,
    GuardedCounter,
    GuardedHistograms,
    LoopHistogram,
    counter_family,
    gauge_family,
    histogram_family,
)
from scheduler.quota.pacer import DeferralStats
from scheduler.status import NodeStatus

DEFAULT_SCHEDULE_LIMIT = 100  # schedules with their own start-lag series per process (the rest: _other)
TASK_TYPE_LIMIT = 100  # task types with their own dead_letter_total series per process

ATTEMPT_STATUSES = ("succeeded", "failed", "timeout")
# Every value a `reason` label can take, exported at 0 from the start: a labelled counter whose series
# appears only at its first increment hides that increment from rate() and increase(), so the first lost
# lease would never show on a dashboard or fire an alert. (tests/unit/test_metrics.py ties each tuple to
# the code that produces the reasons: LostReason, LeaseLostReason, the keeper, the partition restarts.)
RENEW_FAILURE_REASONS = ("stream_error", "stalled")
LEASE_LOST_REASONS = ("expired", "local_deadline")
PARTITION_LOST_REASONS = ("fenced_out", "owner_changed", "session_lost", "released", "unserved")
RESTART_REASONS = ("stale_state", "outcome_unknown", "compare_failed", "etcd_error", "malformed_txn")


def attempt_status(e: Execution) -> str:
    cur = e.current
    if cur is None or cur.succeeded:
        return "succeeded"
    return "timeout" if cur.error_class is ErrorClass.TIMEOUT else "failed"


class PlannerMetrics:
    def __init__(self, *, schedule_limit: int = DEFAULT_SCHEDULE_LIMIT, task_type_limit: int = TASK_TYPE_LIMIT) -> None:
        self.registry = CollectorRegistry()
        self.enqueued = 0
        self.attempts = dict.fromkeys(ATTEMPT_STATUSES, 0)
        self.dead_letters = GuardedCounter(task_type_limit)
        self.start_lag = GuardedHistograms(schedule_limit, SECONDS_BUCKETS)
        self.renew_latency = LoopHistogram(SECONDS_BUCKETS)
        self.renew_failures: dict[str, int] = dict.fromkeys(RENEW_FAILURE_REASONS, 0)
        self.leases_lost: dict[str, int] = dict.fromkeys(LEASE_LOST_REASONS, 0)
        self.partitions_lost: dict[str, int] = dict.fromkeys(PARTITION_LOST_REASONS, 0)
        self._status: Callable[[], NodeStatus] | None = None
        # Runs whose start a tenant's executions-per-second quota deferred (the node's pacer sets it).
        self.quota_deferrals: DeferralStats | None = None
        self.registry.register(CallbackCollector(self.collect))

    def observe(self, status: Callable[[], NodeStatus]) -> None:
        """Where the gauges read the node's state at scrape time (PlannerNode.status)."""
        self._status = status

    # ---- events (hot path: ints and lock-free histograms only) -------------------------------------

    def dispatched(self, execs: Sequence[Execution], now_ms: int) -> None:
        """One planner round's executions handed to the dispatch queue."""
        self.enqueued += len(execs)
        lag = self.start_lag
        for e in execs:
            # First attempts of planned runs only: a retry or a backfill is late on purpose.
            if e.attempt == 1 and e.trigger is Trigger.SCHEDULED:
                lag.observe(e.schedule_id, max(0, now_ms - e.due_ms) / 1000)

    def attempt_recorded(self, e: Execution) -> None:
        """An attempt's outcome written to the ledger by this node (a worker's result or a timeout)."""
        self.attempts[attempt_status(e)] += 1
        if e.state is ExecState.DEAD_LETTER:
            self.dead_letters.inc(e.task_type)

    def partition_lost(self, reason: str) -> None:
        self.partitions_lost[reason] = self.partitions_lost.get(reason, 0) + 1

    # LeaseObserver (scheduler/store/etcd/deadline.py)
    def renewed(self, latency_s: float) -> None:
        self.renew_latency.observe(latency_s)

    def renew_failed(self, reason: str) -> None:
        self.renew_failures[reason] = self.renew_failures.get(reason, 0) + 1

    def lease_lost(self, reason: str) -> None:
        self.leases_lost[reason] = self.leases_lost.get(reason, 0) + 1

    # ---- scrape ----------------------------------------------------------------------------------------

    def collect(self) -> Iterable[Metric]:
        yield CounterMetricFamily("due_jobs_enqueued", "Executions handed to the dispatch queue (each attempt once).",
                                  value=self.enqueued)
        yield counter_family("execution_attempts", "Attempt outcomes recorded in the ledger by this node.",
                             "status", self.attempts)
        yield self.dead_letters.family("dead_letter", "Executions moved to the dead-letter state by this node.",
                                       "task_type")
        yield self.start_lag.family(
            "scheduler_start_lag_seconds",
            "Dispatch time minus due time of first attempts, per schedule (first N schedules, then _other).",
            "schedule")
        yield histogram_family("scheduler_lease_renew_latency_seconds",
                               "Round trip of acknowledged lease keepalives.", self.renew_latency)
        yield counter_family("scheduler_lease_renew_failures", "Keepalive streams that broke or stalled.",
                             "reason", self.renew_failures)
        yield counter_family("scheduler_leases_lost", "Session leases lost (expired in etcd or local deadline).",
                             "reason", self.leases_lost)
        yield counter_family("scheduler_partitions_lost", "Partitions this node stopped owning, by reason.",
                             "reason", self.partitions_lost)
        q = self.quota_deferrals or DeferralStats()
        yield q.runs.family("scheduler_quota_deferred", "Planned runs whose start the tenant's executions-per-second "
                            "quota deferred (materialized on time, started later), per tenant.", "tenant")
        yield q.ms.family("scheduler_quota_deferred_ms",
                          "Milliseconds those deferrals added to the starts, per tenant.", "tenant")
        if self._status is not None:
            yield from _node_gauges(self._status())


def _node_gauges(st: NodeStatus) -> Iterable[Metric]:
    now_ms = st.now_ms
    # Which process is which node: Prometheus knows a target by its address, operators (drain, cluster
    # status, owner keys) by node id; and during a rolling upgrade, which planners run which version.
    info = GaugeMetricFamily("scheduler_planner_info", "1, labelled with this planner's node id, region and version.",
                             labels=["node_id", "region", "version"])
    info.add_metric([st.node_id, st.region.region, __version__], 1)
    yield info
    yield GaugeMetricFamily("scheduler_partitions_owned", "Partitions this node owns now.", value=len(st.owned))
    # A busy loop delays every task on it, the lease keep-alive included (docs/architecture.md).
    yield GaugeMetricFamily("scheduler_event_loop_stall_max_seconds",
                            "The longest the planner's event loop went without a turn since it started.",
                            value=st.loop_stall_max_s)
    # P itself, so that "partitions without an owner" (P - sum of owned) needs no constant in alert rules.
    if st.partitions:
        yield GaugeMetricFamily("scheduler_partitions", "The cluster's partition count P (setting `partitions`).",
                                value=st.partitions)
    lag = GaugeMetricFamily("scheduler_lag_seconds",
                            "Now minus the oldest due time not yet dispatched, per owned partition (0: none).",
                            labels=["partition"])
    behind = GaugeMetricFamily(
        "scheduler_checkpoint_behind_seconds",
        "Now minus the partition's checkpoint watermark, floored at 0 (planning is behind when > 0).",
        labels=["partition"])
    watermark = GaugeMetricFamily("scheduler_checkpoint_watermark_timestamp_seconds",
                                  "The partition's checkpoint watermark (every planned time up to it is handled).",
                                  labels=["partition"])
    for part in st.owned:
        label = [str(part.partition)]
        oldest = part.oldest_waiting_ms
        lag.add_metric(label, max(0, now_ms - oldest) / 1000 if oldest is not None else 0.0)
        wm = part.watermark_ms
        if wm:
            behind.add_metric(label, max(0, now_ms - wm) / 1000)
            watermark.add_metric(label, wm / 1000)
    yield lag
    yield behind
    yield watermark
    yield CounterMetricFamily("scheduler_fenced_txns", "Owner writes sent with the fencing-token compare.",
                              value=st.fenced_txns)
    yield CounterMetricFamily("scheduler_fencing_rejections",
                              "Owner writes etcd refused because the fencing token was stale.",
                              value=st.fencing_rejections)
    yield CounterMetricFamily("scheduler_planner_rounds",
                              "Partition loop rounds this node ran, over all its partitions: about the partitions "
                              "owned / loop_interval a second; far above, a loop spins.", value=st.rounds)
    yield counter_family("scheduler_partition_restarts",
                         "Partition planners reloaded from etcd, by reason (stale_state, outcome_unknown, "
                         "compare_failed, etcd_error; malformed_txn is a bug).", "reason",
                         dict.fromkeys(RESTART_REASONS, 0) | st.restarts)
    depth = GaugeMetricFamily("scheduler_dispatch_queue_depth", "Executions waiting for a worker, per pool.",
                              labels=["pool"])
    workers = GaugeMetricFamily("scheduler_connected_workers", "Worker streams connected to this node, per pool.",
                                labels=["pool"])
    credits = GaugeMetricFamily("scheduler_worker_credits", "Assignments workers of the pool can take now.",
                                labels=["pool"])
    for pool, n in sorted(st.queue_depth.items()):
        depth.add_metric([pool], n)
    per_pool: dict[str, int] = {}
    for w in st.workers:
        per_pool[w.pool] = per_pool.get(w.pool, 0) + w.credits
    for pool, n in sorted(st.connected_workers().items()):
        workers.add_metric([pool], n)
        credits.add_metric([pool], per_pool.get(pool, 0))
    yield depth
    yield workers
    yield credits
    yield counter_family("scheduler_dispatch_cross_region_assignments",
                         "Assignments this node sent to a worker outside the planning region, per pool (worker "
                         "affinity `prefer` falling over, or `any`).", "pool", st.cross_region_assignments)
    windows = st.start_windows
    yield gauge_family("scheduler_dispatch_start_window",
                       "Hand-outs of the pool this node may have waiting for their start at once (adaptive unless "
                       "the start_window setting fixes it).", "pool", {p: w[0] for p, w in windows.items()})
    yield gauge_family("scheduler_dispatch_start_waiting",
                       "Hand-outs of the pool this node has waiting for their start now.", "pool",
                       {p: w[1] for p, w in windows.items()})
    yield counter_family("scheduler_dispatch_start_window_cuts",
                         "Times the pool's start window was halved: starts answered late (its workers, etcd or "
                         "this node overloaded).", "pool", {p: w[2] for p, w in windows.items()})
    yield counter_family("scheduler_dispatch_start_expired",
                         "Hand-outs of the pool that reached their start-by with no answer here (dispatched again "
                         "by their owner).", "pool", {p: w[3] for p, w in windows.items()})
    yield CounterMetricFamily("scheduler_dispatch_disarmed",
                              "Armed runs (start ahead) this node told their worker not to start.", value=st.disarmed)
    yield from _clock_gauges(st)
    yield from _region_gauges(st)


def _region_gauges(st: NodeStatus) -> Iterable[Metric]:
    r = st.region
    role = GaugeMetricFamily("scheduler_region_role",
                             "1 for this planner's role under the region policy (primary: its region plans; "
                             "standby: it waits; any: no policy).", labels=["region", "role"])
    role.add_metric([r.region, r.role], 1)
    yield role
    yield GaugeMetricFamily("scheduler_region_policy_version",
                            "The region policy record's version (etcd mod_revision) this planner acts on; 0: none.",
                            value=r.policy_version)
    changes = dict.fromkeys(("switchover", "automatic failover", "failback", "affinity"), 0) | r.changes
    yield counter_family("scheduler_region_policy_changes",
                         "Region policy changes this planner saw, by kind (every planner counts each once: "
                         "aggregate with max, not sum).", "kind", changes)
    ago = GaugeMetricFamily("scheduler_region_primary_last_seen_seconds",
                            "Seconds since a planner of the primary region last held a live session (0 while one "
                            "does; absent without a policy).")
    if r.primary_last_seen_ago_ms is not None:
        ago.add_metric([], r.primary_last_seen_ago_ms / 1000)
    yield ago


def _clock_gauges(st: NodeStatus) -> Iterable[Metric]:
    c = st.clock
    offset = GaugeMetricFamily("scheduler_clock_offset_seconds",
                               "This node's wall clock minus the majority of the planners' (absent: no majority).")
    if c.offset_ms is not None:
        offset.add_metric([], c.offset_ms / 1000)
    yield offset
    peers = GaugeMetricFamily("scheduler_clock_peer_offset_seconds",
                              "This node's wall clock minus each live peer's, as last probed.", labels=["peer"])
    for peer, ms in sorted(c.peer_offsets_ms.items()):
        if ms is not None:
            peers.add_metric([peer], ms / 1000)
    yield peers
    yield GaugeMetricFamily("scheduler_clock_skew_ineligible",
                            "1 while this node owns no partitions because its clock is out of bounds.",
                            value=0 if c.eligible else 1)
    yield CounterMetricFamily("scheduler_clock_skew_trips", "Times this node stood down for clock skew.",
                              value=c.trips)
