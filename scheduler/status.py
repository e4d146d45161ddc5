"""A planner node's state as one immutable snapshot: what metrics, `cluster status` (the admin
service's local view) and a future console read, instead of reaching into the node's objects.

The node builds it (`PlannerNode.status()`) at scrape or request time; readers depend only on this
module, not on the node, the dispatcher or the partition loop (which removes the metrics <-> node
import cycle).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PartitionStatus:
    partition: int
    watermark_ms: int  # 0: never checkpointed
    oldest_waiting_ms: int | None  # due (or retry) time of the oldest execution waiting for a worker


@dataclass(frozen=True)
class WorkerStatus:
    worker_id: str
    pool: str
    region: str
    capacity: int  # assignments it may hold (Hello.capacity)
    credits: int  # assignments it can take now
    # Attempts it runs, as its latest heartbeat says (Hello.running before the first): the worker knows, and
    # every planner it streams to sees the same number, whichever planner dispatched them.
    running: int


@dataclass(frozen=True)
class NodeStatus:
    now_ms: int
    owned: tuple[PartitionStatus, ...]  # partitions this node owns, with their loop's view
    queue_depth: dict[str, int] = field(default_factory=dict)  # pool -> executions waiting for a worker
    workers: tuple[WorkerStatus, ...] = ()
    fenced_txns: int = 0
    fencing_rejections: int = 0
    restarts: dict[str, int] = field(default_factory=dict)  # partition loop reloads by reason

    def connected_workers(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for w in self.workers:
            out[w.pool] = out.get(w.pool, 0) + 1
        return out
