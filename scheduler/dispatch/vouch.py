"""Vouching for runs of a partition this node no longer owns (docs/workers.md, "Liveness").

A worker heartbeats on every planner stream it has and lists there every attempt it runs, marking those
whose origin that stream is (`RunningAttempt.origin`: the planner that dispatched the attempt or last
re-attached it, where its result goes first). A new owner takes the attempts in flight at its claim up as
orphans and gives up those that no worker lists to it within the heartbeat timeout: their worker is taken
for gone (dispatch/liveness.py, `Liveness.expect`). A worker cut off from the new owner only is not gone:
its stream to the planner the attempt came from is up, it runs the attempt and will send its result there.
Given up, the attempt was dispatched again while it ran: a second effect.

So the planner that hears such a worker list, on a stream holding it, an attempt it is the origin of in a
partition it no longer owns, puts a vouch notice (store/notices.py: `{"h": attempt, "w": worker}`) for the
owner, which keeps the orphan as if that worker had listed it there (`Liveness.vouched`). Once the owner
re-attaches it (the worker reaches the owner again), the worker moves the origin there and the vouches
stop. Cost: one notice per such attempt per `every` seconds (a third of the heartbeat timeout, so that a
lost or late one is followed by another well before the owner's wait runs out), in one txn per flush;
nothing for attempts of partitions this node owns, the common case.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Container, Sequence

from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.clock import Clock
from scheduler.dispatch.conn import AttemptKey
from scheduler.errors import SchedError
from scheduler.ids import ExecutionId
from scheduler.store.keyspace import Keyspace
from scheduler.store.kv import KV
from scheduler.store.notices import notice_op

log = logging.getLogger(__name__)

_MAX_PER_TXN = 120  # under etcd's default --max-txn-ops (128)
_KEPT = 20_000  # attempts whose last vouch is remembered; past it, those not vouched for lately are forgotten


def to_vouch(listed: Sequence[wpb.RunningAttempt], held: Container[AttemptKey],
             owns: Callable[[str], bool]) -> list[AttemptKey]:
    """The attempts of a heartbeat this node vouches for: listed as originating on this stream, held by it
    (assigned or re-attached here, so this node knows the worker had it), of a partition it does not own."""
    out: list[AttemptKey] = []
    for ra in listed:
        key = (ra.execution_id, ra.attempt)
        if ra.origin and key in held and not owns(ra.execution_id):
            out.append(key)
    return out


class Vouches:
    def __init__(self, *, kv: KV, ks: Keyspace, partitions: int, clock: Clock, owns: Callable[[str], bool],
                 every: float, timeout: float | None) -> None:
        """`owns`: whether this node owns an execution id's partition; `every`: seconds between two vouches
        for one attempt."""
        self.kv, self.ks, self.partitions, self.clock = kv, ks, partitions, clock
        self._owns, self.every, self.timeout = owns, every, timeout
        self._last: dict[AttemptKey, float] = {}  # monotonic time of each attempt's latest vouch
        self._pending: dict[AttemptKey, str] = {}  # to put, with their worker
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        self.failed = 0

    def heard(self, worker_id: str, listed: Sequence[wpb.RunningAttempt], held: Container[AttemptKey]) -> None:
        """A heartbeat of `worker_id` on a stream holding `held`. O(listed)."""
        if not listed:
            return
        now = self.clock.monotonic()
        for key in to_vouch(listed, held, self._owns):
            last = self._last.get(key)
            if last is not None and now - last < self.every:
                continue
            if last is None:
                log.info("vouching for a run of a partition owned elsewhere: its worker lists it here",
                         extra={"event": "attempt_vouched", "worker": worker_id, "execution_id": key[0],
                                "attempt": key[1]})
            self._last[key] = now
            self._pending[key] = worker_id
        if len(self._last) > _KEPT:
            self._last = {k: t for k, t in self._last.items() if now - t < 3 * self.every}
        if self._pending and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._flush(), name="vouches")

    async def _flush(self) -> None:
        while self._pending:
            batch = list(self._pending.items())[:_MAX_PER_TXN]
            for key, _ in batch:
                del self._pending[key]
            ops = []
            for (eid, attempt), worker in batch:
                try:
                    x = ExecutionId.parse(eid)
                except SchedError:
                    continue
                ops.append(notice_op(self.ks, self.partitions, x.schedule_id, x.planned_ms, held_attempt=attempt,
                                     worker=worker))
            try:
                await self.kv.txn([], ops, timeout=self.timeout)
            except SchedError as err:  # etcd unreachable from here: the next heartbeat tries again
                self.failed += len(batch)
                for key, _ in batch:
                    self._last.pop(key, None)
                log.warning("vouches not written: %s", err, extra={"event": "vouch_failed", "count": len(batch)})
                return
            self.sent += len(ops)
