"""Process state as immutable snapshots: what metrics, `cluster status` (the admin service's local
view) and a future console read, instead of reaching into a process's objects.

`NodeStatus` is a planner node's (built by `PlannerNode.status()`), `WorkerProcessStatus` a worker
process's (built by `Worker.status()`), at scrape or request time. Readers depend only on this
module, not on the node, the dispatcher, the partition loop or the worker (which removes the
metrics <-> node and metrics <-> worker import cycles). It imports nothing of the project, so both
sides can use it without crossing a floor.
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
    """A planner's view of one connected worker stream (not the worker's own: WorkerProcessStatus)."""

    worker_id: str
    pool: str
    region: str
    capacity: int  # assignments it may hold (Hello.capacity)
    credits: int  # assignments it can take now
    # Attempts it runs, as its latest heartbeat says (Hello.running before the first): the worker knows, and
    # every planner it streams to sees the same number, whichever planner dispatched them.
    running: int


@dataclass(frozen=True)
class ClockStatus:
    """The clock-skew guard (scheduler/planner/clock_guard.py)."""

    eligible: bool = True  # False: out of bounds (or not yet judged), owning no partitions
    offset_ms: int | None = None  # this clock minus the peers' majority's; None: no majority last round
    peer_offsets_ms: dict[str, int | None] = field(default_factory=dict)  # this clock minus each peer's
    trips: int = 0  # times this planner stood down for skew


@dataclass(frozen=True)
class RegionStatus:
    """The region guard (scheduler/planner/region_guard.py): this planner's place in the region policy."""

    region: str = ""
    role: str = "any"  # primary (its region plans), standby (it waits), any (no policy: every region plans)
    policy_version: int = 0  # the record's mod_revision; 0: no policy
    changes: dict[str, int] = field(default_factory=dict)  # policy changes this planner saw, by kind
    # Since a primary planner was last live; 0 while one is; None: no policy.
    primary_last_seen_ago_ms: int | None = None


@dataclass(frozen=True)
class NodeStatus:
    now_ms: int
    owned: tuple[PartitionStatus, ...]  # partitions this node owns, with their loop's view
    queue_depth: dict[str, int] = field(default_factory=dict)  # pool -> executions waiting for a worker
    workers: tuple[WorkerStatus, ...] = ()
    fenced_txns: int = 0
    fencing_rejections: int = 0
    restarts: dict[str, int] = field(default_factory=dict)  # partition loop reloads by reason
    rounds: int = 0  # partition loop rounds this node ran, all partitions (about partitions / loop_interval a second)
    clock: ClockStatus = field(default_factory=ClockStatus)
    region: RegionStatus = field(default_factory=RegionStatus)
    # pool -> assignments this node sent to workers outside the planning region (worker affinity)
    cross_region_assignments: dict[str, int] = field(default_factory=dict)
    node_id: str = ""
    partitions: int = 0  # P, the cluster's partition count (the `partitions` setting); 0: unknown
    loop_stall_max_s: float = 0.0  # the longest the event loop went without a turn since the node started
    # Start windows per pool (dispatch/start_window.py): pool -> (size, hand-outs waiting for their start, times it
    # was halved, hand-outs that reached their start-by unanswered here); and armed runs disarmed (start ahead).
    start_windows: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)
    disarmed: int = 0

    def connected_workers(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for w in self.workers:
            out[w.pool] = out.get(w.pool, 0) + 1
        return out


@dataclass(frozen=True)
class WorkerProcessStatus:
    """A worker process's own state."""

    worker_id: str
    pool: str
    region: str
    concurrency: int  # most attempts it runs at once
    task_types: tuple[str, ...]  # its registered handlers
    held: int  # attempts assigned and not finished (running, or about to start)
    running: int  # of those, the ones whose handler runs
    planners: tuple[str, ...]  # addresses of the planner streams open now
    unacked_results: int  # results sent or waiting to be sent that no planner has acknowledged yet
    draining: bool
