"""A plan's load as the product's schedules: each `PlannedSchedule` becomes a `scheduler.model.Schedule`
whose executor reports to the effect sink (http: `http_payload`; shell: `shell_command`), with the
group's policies. Pure, so the runner and the tests build exactly the same schedules from a plan.
"""

from __future__ import annotations

import json

from chaos.plan import PlannedSchedule
from chaos.sink import http_payload, shell_command
from scheduler.model import Policies, RetryPolicy, Schedule, validate_schedule
from scheduler.timeplan import MissedRuns, Overlap

__all__ = ["EXECUTION_TIMEOUT_MS", "POOL_TENANT", "schedule_of"]

POOL_TENANT = "drill"
# Long enough for the longest hold plus a takeover: a drill judges placement and fencing, not timeouts.
EXECUTION_TIMEOUT_MS = 60_000
_RETRY = RetryPolicy(max_attempts=3, initial_backoff_ms=200, max_backoff_ms=2_000)


def schedule_of(p: PlannedSchedule, sink_url: str, *, pool: str | None = None) -> Schedule:
    """The schedule the runner creates for `p` (validated as the API would). `pool` overrides the
    group's pool (a harness whose workers serve another pool name)."""
    if p.executor == "http":
        payload, task = json.dumps(http_payload(sink_url, p.hold_ms, fail=p.fail)).encode(), "http"
    else:
        payload, task = json.dumps({"command": shell_command(sink_url, p.hold_ms, fail=p.fail)}).encode(), "shell"
    policies = Policies(
        missed_runs=MissedRuns(p.missed_runs), catchup_window_ms=p.catchup_window_ms, catchup_cap=p.catchup_cap,
        overlap=Overlap(p.overlap), jitter_ms=p.jitter_ms,
        retry=RetryPolicy(max_attempts=p.max_attempts, initial_backoff_ms=_RETRY.initial_backoff_ms,
                          max_backoff_ms=_RETRY.max_backoff_ms,
                          max_unknown_attempts=min(_RETRY.max_unknown_attempts, p.max_attempts)),
        execution_timeout_ms=max(EXECUTION_TIMEOUT_MS, 4 * p.hold_ms),
    )
    s = Schedule(id=p.id, tenant=POOL_TENANT, spec=p.spec, worker_pool=pool or p.pool, task_type=task,
                 time_zone=p.tz, payload=payload, labels={"drill": p.group}, policies=policies)
    validate_schedule(s)
    return s
