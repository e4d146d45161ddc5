"""Which worker streams may receive a pool's executions now, under the region policy's worker affinity
(scheduler/region/affinity.py): the per-pool decision at dispatch time.

A worker is *local* when its region is the planning region: the policy's primary (without a policy,
this planner's own region, as every planner plans then). Local workers always qualify; a remote one:
- `strict`: never;
- `any`: always (local ones are still served first by the pump);
- `prefer`: once no local worker of the pool has had credit for `prefer_wait`. "Had credit" is kept as
  one monotonic timestamp per pool, refreshed by the dispatcher whenever it sees a local stream of the
  pool with credits (credit grants, each pump, a local stream's drain or end). The count starts when
  the planning region is (re)set, so that right after a start or a switchover the new region's workers
  get `prefer_wait` to connect before work goes abroad.

Hot path: the policy is turned into a dict pool -> (mode, wait in seconds) once per policy change;
`allows` is a region compare, a dict lookup and, for `prefer` only, one subtraction.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler.region.affinity import Affinity, AffinityPolicy, Mode

Rule = tuple[Mode, float]  # (mode, prefer_wait in seconds)


def _rule(a: Affinity) -> Rule:
    return a.mode, a.prefer_wait_ms / 1000


class AffinityGate:
    def __init__(self, region: str, monotonic: Callable[[], float]) -> None:
        self.own_region = region
        self.planning_region = region
        self._now = monotonic
        self._default: Rule = _rule(Affinity())
        self._rules: dict[str, Rule] = {}
        self._since = monotonic()  # when the planning region was set: "had credit" is counted from here
        self._credit_at: dict[str, float] = {}  # pool -> last time a local stream of it had credit

    def configure(self, planning_region: str | None, policy: AffinityPolicy) -> None:
        """A new policy (or none: `planning_region` None means this planner's own region)."""
        region = planning_region or self.own_region
        if region != self.planning_region:
            # The local set changed: what the old region's workers had proves nothing about the new one's.
            self.planning_region = region
            self._since = self._now()
            self._credit_at.clear()
        self._default = _rule(policy.default)
        self._rules = {pool: _rule(a) for pool, a in policy.pools}

    def rule(self, pool: str) -> Rule:
        return self._rules.get(pool, self._default)

    def local_credit(self, pool: str) -> None:
        """A local stream of `pool` has (or had until this moment) credit."""
        self._credit_at[pool] = self._now()

    def wait_left(self, pool: str) -> float:
        """For a remote stream of `pool`: seconds until it may be served (0: now; inf: never)."""
        mode, wait = self._rules.get(pool, self._default)
        if mode is Mode.ANY:
            return 0.0
        if mode is Mode.STRICT:
            return float("inf")
        left = self._credit_at.get(pool, self._since) + wait - self._now()
        return left if left > 0 else 0.0

    def allows(self, region: str, pool: str) -> bool:
        return region == self.planning_region or self.wait_left(pool) == 0.0
