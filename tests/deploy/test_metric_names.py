"""The PromQL name extraction the rule and dashboard checks rely on, on named cases."""

from __future__ import annotations

import pytest

from tests.deploy.tools import exported_metric_names, metric_names_in


@pytest.mark.parametrize(("expr", "names"), [
    ("sum(rate(execution_attempts_total[5m]))", {"execution_attempts_total"}),
    ('1 - sum(rate(scheduler_start_lag_seconds_bucket{le="5.0"}[5m])) / sum(rate(scheduler_start_lag_seconds_count'
     '[5m]))', {"scheduler_start_lag_seconds_bucket", "scheduler_start_lag_seconds_count"}),
    ("sum by (node_id, region) (a * on (instance, job) group_left (node_id) b_info)", {"a", "b_info"}),
    ("histogram_quantile(0.99, sum by (le) (rate(x_bucket[$__rate_interval])))", {"x_bucket"}),
    ("max by (pool) (q) > 0 unless on (pool) sum by (pool) (w) > 0", {"q", "w"}),
    ("sched:partitions_unowned > 0", {"sched:partitions_unowned"}),
    ("absent(scheduler_partitions_owned)", {"scheduler_partitions_owned"}),
    ("topk(10, sched:x:p99)", {"sched:x:p99"}),
    ("1e3 * y", {"y"}),
])
def test_metric_names_in(expr: str, names: set[str]) -> None:
    assert metric_names_in(expr) == names


def test_the_exported_names_cover_both_roles() -> None:
    names = exported_metric_names()
    for n in ("scheduler_partitions", "scheduler_planner_info", "dead_letter_total", "execution_duration_ms_bucket",
              "scheduler_start_lag_seconds_bucket", "scheduler_worker_concurrency", "process_cpu_seconds_total",
              "scheduler_partitions_lost_total", "scheduler_clock_offset_seconds"):
        assert n in names, n
