"""One worker stream as the planner sees it: who is on it, what it may be sent, what it holds.

Shared by the stream service (dispatch/service.py: credits, assignments) and the liveness bookkeeping
(dispatch/liveness.py: last-seen time, what the stream holds and what becomes of it when it ends).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.dispatch.scope import Scope
from scheduler.outqueue import JoiningQueue

AttemptKey = tuple[str, int]  # (execution id, attempt)
ASSIGNMENT_OVERHEAD = 512  # estimated bytes of an Assignment besides its payload (ids, times, token: about 200)


def _assignments_bytes(m: wpb.Assignments) -> int:
    return sum(len(a.payload) for a in m.assignments) + ASSIGNMENT_OVERHEAD * len(m.assignments)


def _size(m: wpb.PlannerMessage) -> int:
    kind = m.WhichOneof("body")
    if kind == "assignments":
        return _assignments_bytes(m.assignments)
    if kind == "start_ack":
        return 128 * len(m.start_ack.acks)
    if kind == "result_ack":
        return 128 * len(m.result_ack.acks)
    return 0  # not joined: its size does not matter


def _join(last: wpb.PlannerMessage, new: wpb.PlannerMessage) -> bool:
    """Assignments, start acks and result acks queued one right behind another go as one message (the
    worker handles the entries of one message in order, as it would the messages)."""
    kind = new.WhichOneof("body")
    if kind != last.WhichOneof("body"):
        return False
    if kind == "assignments":
        last.assignments.assignments.extend(new.assignments.assignments)
    elif kind == "start_ack":
        last.start_ack.acks.extend(new.start_ack.acks)
    elif kind == "result_ack":
        last.result_ack.acks.extend(new.result_ack.acks)
    else:
        return False
    return True


def outgoing() -> JoiningQueue[wpb.PlannerMessage]:
    """A stream's queue of messages to its worker (None ends the stream)."""
    return JoiningQueue(_join, _size)


@dataclass
class Held:
    """An attempt out on a stream: a lease that every sign of the worker holding it renews (the assignment
    itself, its start recorded through this stream, each heartbeat listing it). It ends with its result
    on the stream, a refused start, the stream's end, or `grace` seconds without a sign (liveness.py)."""

    task_type: str
    since: float  # monotonic time of the last sign that the worker holds it
    grace: float  # how long it may go without one: transit + start confirmation, or one heartbeat timeout


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
    running: dict[AttemptKey, Held] = field(default_factory=dict)  # attempts out on this stream
    capacity: int = 0  # Hello.capacity, for cluster status
    # How many attempts the worker says it runs (its latest heartbeat, or Hello before the first): what
    # `cluster status` shows. The worker is authoritative; `running` is this planner's share of it.
    reported: int = 0
    # What its worker may report on (dispatch/scope.py); None with auth off.
    scope: Scope | None = None
    # Attempts its heartbeats list that the scope refused to re-attach: refused (and logged) once, not on
    # every heartbeat.
    refused: set[AttemptKey] = field(default_factory=set)
    # Probes sent on this stream (liveness.py, "unheld"): seq -> monotonic time sent; the last few only.
    probes: dict[int, float] = field(default_factory=dict)
    probe_seq: int = 0
    # Hello.capabilities has WORKER_CAPABILITY_START_IN: it waits for Assignment.start_in and honours Disarm.
    # Without it, it is sent no run before the run's due time (it would start it at once).
    start_in: bool = True

    def runs(self, task_type: str) -> bool:
        """Does the worker run `task_type`? One that listed no task types in Hello runs them all."""
        return not self.task_types or task_type in self.task_types
