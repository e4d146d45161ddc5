"""Quota checks at the API edge (docs/operations.md, "Quotas"): pure, given the limits that apply.

Over a quota is RESOURCE_EXHAUSTED, as gRPC's status guide and Google's AIP-193 say for "a per-user quota"
(Kubernetes' ResourceQuota refuses with 403 "exceeded quota", Temporal's namespace limits with
RESOURCE_EXHAUSTED): the request was well formed, the tenant is at a limit an operator can raise. The
message names the quota, its limit and the current use, so that the caller can tell which to fix.
"""

from __future__ import annotations

from scheduler.errors import ResourceExhausted
from scheduler.model import Schedule
from scheduler.quota.record import Quota
from scheduler.timeplan import Plan


def check_shape(q: Quota, s: Schedule, where: str = "schedule") -> None:
    """The per-schedule quotas (labels, payload) of `s`'s tenant; `where` names the item in a batch."""
    if q.labels and len(s.labels) > q.labels:
        raise ResourceExhausted(f"{where}.labels: tenant {s.tenant!r} is over its labels quota: limit {q.labels} "
                                f"per schedule, this one has {len(s.labels)}")
    if q.payload_bytes and len(s.payload) > q.payload_bytes:
        raise ResourceExhausted(f"{where}.payload: tenant {s.tenant!r} is over its payload quota: limit "
                                f"{q.payload_bytes} bytes, this one has {len(s.payload)}")


def check_backfill(q: Quota, tenant: str, plan: Plan, start_ms: int, end_ms: int) -> None:
    """The backfill-size quota: the planned times in [start, end) (as the backfill counts them), counted up
    to one past the limit, before anything is written."""
    if not q.backfill:
        return
    for n, _ in enumerate(plan.between_ms(start_ms - 1, end_ms - 1), 1):
        if n > q.backfill:
            raise ResourceExhausted(f"tenant {tenant!r} is over its backfill quota: limit {q.backfill} planned "
                                    f"times per request, this range holds more; split it")
