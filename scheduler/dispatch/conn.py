"""One worker stream as the planner sees it: who is on it, what it may be sent, what it holds.

Shared by the stream service (dispatch/service.py: credits, assignments) and the liveness bookkeeping
(dispatch/liveness.py: last-seen time, what the stream holds and what becomes of it when it ends).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb

AttemptKey = tuple[str, int]  # (execution id, attempt)


@dataclass
class Conn:
    worker_id: str
    pool: str
    region: str
    task_types: frozenset[str]
    out: asyncio.Queue[wpb.PlannerMessage | None]  # None ends the stream
    credits: int = 0
    last_seen: float = 0.0  # monotonic time of the last message (any message proves the worker alive)
    dead: bool = False  # the watchdog ended this stream (silent for heartbeat_timeout)
    running: dict[AttemptKey, str] = field(default_factory=dict)  # attempts out on this stream -> task type
    capacity: int = 0  # Hello.capacity, for cluster status
