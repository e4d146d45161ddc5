"""A worker process's metrics. Names and labels are documented in docs/operations.md.

`execution_duration_ms` is observed once per finished attempt into a lock-free histogram cached per
(task type, status); the gauges read the worker's status snapshot (scheduler/status.py,
`Worker.status()`) when Prometheus scrapes, through the callable given to `observe`: this module
does not import the worker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry

from scheduler.metrics.core import MS_BUCKETS, CallbackCollector, LoopHistogram
from scheduler.status import WorkerProcessStatus

UNREGISTERED = "_unregistered"  # the task-type label of assignments this worker has no handler for


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.received = 0
        self.duplicates_ignored = 0  # assignments delivered again for an attempt running or finished here
        # (task type, status) -> histogram. Bounded: task types are this worker's registered handlers
        # (others map to _unregistered) and statuses the three outcomes.
        self.durations: dict[tuple[str, str], LoopHistogram] = {}
        self._status: Callable[[], WorkerProcessStatus] | None = None
        self.registry.register(CallbackCollector(self.collect))

    def observe(self, status: Callable[[], WorkerProcessStatus]) -> None:
        """Where the gauges read the worker's state at scrape time (Worker.status)."""
        self._status = status

    def finished(self, task_type: str, status: str, duration_ms: float) -> None:
        key = (task_type, status)
        h = self.durations.get(key)
        if h is None:
            h = self.durations[key] = LoopHistogram(MS_BUCKETS)
        h.observe(duration_ms)

    def collect(self) -> Iterable[Metric]:
        fam = HistogramMetricFamily("execution_duration_ms",
                                    "Handler run time of attempts finished on this worker, in milliseconds.",
                                    labels=["task_type", "status"])
        for (task_type, status), h in sorted(self.durations.items()):
            fam.add_metric([task_type, status], h.buckets(), h.sum)
        yield fam
        yield CounterMetricFamily("scheduler_worker_assignments_received",
                                  "Assignments received from planners.", value=self.received)
        yield CounterMetricFamily("scheduler_worker_duplicate_assignments_ignored",
                                  "Assignments delivered again for an attempt running or finished here (run once).",
                                  value=self.duplicates_ignored)
        if self._status is None:
            return
        st = self._status()
        yield GaugeMetricFamily("scheduler_worker_running_attempts", "Attempts this worker holds now (running or "
                                "about to start).", value=st.held)
        yield GaugeMetricFamily("scheduler_worker_concurrency", "Most attempts this worker runs at once.",
                                value=st.concurrency)
        yield GaugeMetricFamily("scheduler_worker_connected_planners", "Planner streams open now.",
                                value=len(st.planners))
        yield GaugeMetricFamily("scheduler_worker_unacked_results",
                                "Results sent or waiting to be sent that no planner has acknowledged yet.",
                                value=st.unacked_results)
