"""The executions-per-second quota on a planner: a per-tenant pacer that defers a planned run's start.

A run over its tenant's rate is still materialized at its planned time, in the same fenced batch as ever
(so the checkpoint moves on, the record is in the ledger, and a new owner finds it): only its `due_ms` is
pushed back to the tenant's next free slot, and the record says by how much (`quota_deferred_ms`, "qd").
Nothing is dropped and no partition waits on a tenant: a deferral is a later start, visible in the ledger
and in `scheduler_quota_deferred_total{tenant}`. Runs keep their order within a tenant.

The slots are a GCRA (generic cell rate algorithm: one instant per tenant, the earliest its next run may
start) without a burst allowance: a tenant's runs start at least 1/rate s apart. A burst allowance (a
second's worth at once) lets a tenant fill a shared pool's workers for that moment, which is the delay to
other tenants the quota is there to prevent (measured with one: 5.0x the other tenant's baseline start lag
in tests/integration/test_quota_fairness.py, against 0.9-1.2x without). Each
planner paces its own partitions with its share of the cluster-wide rate (partitions owned / P), so the
cluster lets through about the quota when a tenant's schedules spread over the partitions (ids hash
uniformly); a tenant with very few schedules may get less than its rate from a many-planner cluster.
Pure apart from the functions it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace

from scheduler.execution import Execution, Trigger
from scheduler.metrics.core import GuardedCounter

TENANT_LIMIT = 1000  # tenants with their own deferral series (the rest: _other)


@dataclass
class DeferralStats:
    """Counts for the metrics: runs deferred and the time they were deferred by, per tenant."""

    runs: GuardedCounter = field(default_factory=lambda: GuardedCounter(TENANT_LIMIT))
    ms: GuardedCounter = field(default_factory=lambda: GuardedCounter(TENANT_LIMIT))


class TenantPacer:
    def __init__(self, rate_of: Callable[[str], float], share: Callable[[], float],
                 enabled: Callable[[], bool] = lambda: True) -> None:
        # `enabled`: whether any tenant has a rate at all (with none, a round's runs pass through untouched)
        self.rate_of, self.share, self.enabled = rate_of, share, enabled
        self._tat: dict[str, float] = {}  # tenant -> theoretical arrival time (ms) of its next run
        self.stats = DeferralStats()

    def forget(self) -> None:
        """Quotas changed: tenants without a rate any more need no slot (a raised rate keeps its slot)."""
        self._tat = {t: v for t, v in self._tat.items() if self.rate_of(t) > 0}

    def slot(self, tenant: str, due_ms: int) -> int:
        """When a run of `tenant` due at `due_ms` may start (>= due_ms), taking that slot."""
        rate = self.rate_of(tenant)
        if rate <= 0:
            return due_ms
        interval = 1000.0 / (rate * self.share())
        start = max(float(due_ms), self._tat.get(tenant, float(due_ms)))
        self._tat[tenant] = start + interval
        return max(due_ms, int(start + 0.999))

    def pace(self, execs: Iterable[Execution]) -> Iterator[Execution]:
        """The runs with their start deferred where their tenant is over its rate. Only first runs of
        planned times are paced: a retry, trigger, rerun or backfill was asked for by someone."""
        if not self.enabled():
            yield from execs
            return
        for e in execs:
            if e.trigger is not Trigger.SCHEDULED or e.attempt or e.quota_deferred_ms:
                yield e
                continue
            at = self.slot(e.tenant, e.due_ms)
            if at == e.due_ms:
                yield e
                continue
            self.stats.runs.inc(e.tenant)
            self.stats.ms.inc(e.tenant, at - e.due_ms)
            yield replace(e, due_ms=at, quota_deferred_ms=at - e.due_ms)
