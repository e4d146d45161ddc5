"""Which worker streams may receive a pool's executions now, under the region policy's worker affinity
(scheduler/region/affinity.py): the per-pool decision at dispatch time.

A worker is *local* when its region is the planning region: the policy's primary (without a policy,
this planner's own region, as every planner plans then). Local workers always qualify; a remote one:
- `strict`: never;
- `any`: always (local ones are still served first by the pump);
- `prefer`: for an execution of task type T, once no local worker of the pool that runs T has had
  credit for `prefer_wait`. The task type matters: a local worker of the pool that does not run T can
  never take the execution, so its credit must not hold the work at home (it would be held forever).
  The count starts when the planning region is (re)set, so that right after a start or a switchover the
  new region's workers get `prefer_wait` to connect before work goes abroad.

"Had credit" is kept as monotonic timestamps, refreshed by the dispatcher whenever it sees a local stream
with credits (credit grants, each pump, a local stream's drain or end), keyed the way the pump matches
streams to work (`not stream.task_types or t in stream.task_types`): a stream that lists no task types
runs all of them and stamps the pool (`_any_at`); one that lists some stamps each (pool, type)
(`_typed_at`).

Cost, and why it is split this way: the decision is on the hot path (the pump asks it for each queued
item a remote `prefer` stream could take), the refresh is not (once per local stream with credit per
pump or credit message). So a refresh is O(task types the stream advertises, usually one to three) dict
writes, and `allows` / `wait_left` stay O(1): a region compare, a dict lookup for the rule and, for
`prefer` only, two dict lookups and a subtraction. The alternative, asking at decision time whether some
local stream with credit runs T, would be a scan over every stream per item.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from scheduler.region.affinity import Affinity, AffinityPolicy, Mode

Rule = tuple[Mode, float]  # (mode, prefer_wait in seconds)
INF = float("inf")
# Module constants, not `Mode.PREFER` on the hot path: an enum member lookup costs ~90 ns on
# Python 3.11 (EnumType attribute access), five times the identity compare itself.
_PREFER, _ANY = Mode.PREFER, Mode.ANY


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
        self._any_at: dict[str, float] = {}  # pool -> last credit of a local stream running every type
        self._typed_at: dict[tuple[str, str], float] = {}  # (pool, task type) -> last credit of a local
        # stream that lists that type

    def configure(self, planning_region: str | None, policy: AffinityPolicy) -> None:
        """A new policy (or none: `planning_region` None means this planner's own region)."""
        region = planning_region or self.own_region
        if region != self.planning_region:
            # The local set changed: what the old region's workers had proves nothing about the new one's.
            self.planning_region = region
            self._since = self._now()
            self._any_at.clear()
            self._typed_at.clear()
        self._default = _rule(policy.default)
        self._rules = {pool: _rule(a) for pool, a in policy.pools}

    def rule(self, pool: str) -> Rule:
        return self._rules.get(pool, self._default)

    def local_credit(self, pool: str, task_types: Iterable[str] = ()) -> None:
        """A local stream of `pool` that runs `task_types` (none listed: every type) has (or had until
        this moment) credit."""
        now = self._now()
        empty = True
        for t in task_types:
            self._typed_at[(pool, t)] = now
            empty = False
        if empty:
            self._any_at[pool] = now

    def wait_left(self, pool: str, task_type: str) -> float:
        """For a remote stream of `pool` and an execution of `task_type`: seconds until it may be served
        (0: now; inf: never)."""
        mode, wait = self._rules.get(pool, self._default)
        if mode is not _PREFER:
            return 0.0 if mode is _ANY else INF
        since = self._since
        last = self._any_at.get(pool, since)
        typed = self._typed_at.get((pool, task_type), since)
        if typed > last:  # not max(): a builtin call costs more than the compare on this path
            last = typed
        left = last + wait - self._now()
        return left if left > 0 else 0.0

    def stream_wait_left(self, pool: str, task_types: Iterable[str]) -> float:
        """For a remote stream running `task_types` (none listed: every type): seconds until some
        execution it runs may be sent to it. Every type for a stream that lists none is bounded only by
        local streams that run every type: a type no local stream runs may go at once (after the start's
        wait). For capacity estimates, not the hot path: O(types listed)."""
        mode, wait = self._rules.get(pool, self._default)
        if mode is Mode.ANY:
            return 0.0
        if mode is Mode.STRICT:
            return INF
        types = tuple(task_types)
        if not types:
            left = self._any_at.get(pool, self._since) + wait - self._now()
            return left if left > 0 else 0.0
        return min(self.wait_left(pool, t) for t in types)

    def allows(self, region: str, pool: str, task_type: str) -> bool:
        return region == self.planning_region or self.wait_left(pool, task_type) == 0.0
