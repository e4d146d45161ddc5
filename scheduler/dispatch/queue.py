"""Due executions waiting for a worker: fair across tenants, capped per task type.

Per pool, one FIFO per tenant; `take()` serves tenants in weighted round-robin (a tenant with weight
w gets up to w items per turn), so one tenant's top-of-the-hour burst cannot starve the others.
A task type at its concurrency cap is passed over (its items wait) without blocking other types.
Pure data structure: no I/O, no clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class _Pool(Generic[T]):
    tenants: dict[str, deque[tuple[str, T]]] = field(default_factory=dict)  # tenant -> (task type, item)
    order: deque[str] = field(default_factory=deque)  # round-robin order of tenants with items
    served: dict[str, int] = field(default_factory=dict)  # items taken in the current turn


class FairQueue(Generic[T]):
    def __init__(self, weights: Mapping[str, int] | None = None, type_caps: Mapping[str, int] | None = None):
        self.weights = dict(weights or {})
        self.type_caps = dict(type_caps or {})
        self.in_flight: dict[str, int] = {}  # per task type, maintained by the caller via started/finished
        self._pools: dict[str, _Pool[T]] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def depth(self, pool: str) -> int:
        p = self._pools.get(pool)
        return sum(len(q) for q in p.tenants.values()) if p else 0

    def put(self, pool: str, tenant: str, task_type: str, item: T) -> None:
        p = self._pools.setdefault(pool, _Pool())
        q = p.tenants.get(tenant)
        if q is None:
            q = p.tenants[tenant] = deque()
            p.order.append(tenant)
        q.append((task_type, item))
        self._size += 1

    def _type_ok(self, task_type: str) -> bool:
        cap = self.type_caps.get(task_type)
        return cap is None or self.in_flight.get(task_type, 0) < cap

    def take(self, pool: str, accepts: Callable[[str], bool] = lambda _t: True,
             item_ok: Callable[[T], bool] | None = None) -> T | None:
        """The next item for a worker of `pool` that runs task types `accepts` says yes to (and, if given, that
        `item_ok` says yes to: the others wait for another worker)."""
        p = self._pools.get(pool)
        if p is None:
            return None
        for _ in range(len(p.order)):
            tenant = p.order[0]
            q = p.tenants[tenant]
            for i, (task_type, item) in enumerate(q):
                if accepts(task_type) and self._type_ok(task_type) and (item_ok is None or item_ok(item)):
                    del q[i]
                    self._size -= 1
                    self.in_flight[task_type] = self.in_flight.get(task_type, 0) + 1
                    p.served[tenant] = p.served.get(tenant, 0) + 1
                    if not q:
                        del p.tenants[tenant]
                        p.order.popleft()
                        p.served.pop(tenant, None)
                    elif p.served[tenant] >= self.weights.get(tenant, 1):
                        p.served[tenant] = 0
                        p.order.rotate(-1)
                    return item
            p.order.rotate(-1)  # nothing this worker can take from that tenant now
        return None

    def finished(self, task_type: str) -> None:
        n = self.in_flight.get(task_type, 0)
        if n > 0:
            self.in_flight[task_type] = n - 1

    def remove(self, pred: Callable[[T], bool]) -> list[T]:
        out: list[T] = []
        for p in self._pools.values():
            for tenant in list(p.tenants):
                q = p.tenants[tenant]
                keep = deque(x for x in q if not pred(x[1]))
                out += [x[1] for x in q if pred(x[1])]
                if keep:
                    p.tenants[tenant] = keep
                else:
                    del p.tenants[tenant]
                    p.order.remove(tenant)
                    p.served.pop(tenant, None)
        self._size -= len(out)
        return out

    def depths(self) -> dict[str, int]:
        """Items waiting, per pool (for metrics)."""
        return {pool: sum(len(q) for q in p.tenants.values()) for pool, p in self._pools.items()}
