"""The audit log: every call that changes something (schedule writes, operator actions, admin actions),
who made it, when, and how it ended, in etcd under `audit/` (docs/keyspace.md).

One put per event, written before the call's answer leaves the server, so an answered call is in the
log (a planner that dies between the change and the put loses that one event; the action itself is
never undone for it). A put that fails is tried twice more (idempotent: the same key and value), which
delays that answer by at most three `timeout`s; after that the answer goes, and the put is tried again in the
background for up to a minute (logged `audit_delayed`, then `audit_recorded_late` or `audit_lost`).
Bounded by count: every `trim_every` writes a node counts the log and deletes the oldest beyond
`max_events`, so the log stays at most `max_events + trim_every x nodes` long. Two nodes trimming at once
delete the same oldest keys: harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from dataclasses import dataclass
from typing import Any

from scheduler.clock import Clock
from scheduler.store.etcd.errors import EtcdError
from scheduler.store.keyspace import Keyspace
from scheduler.store.kv import KV

log = logging.getLogger("scheduler.audit")

_RETRY_DELAYS = (0.1, 0.3)  # seconds before the second and third try of an event's put
# Then, in the background, every AUDIT_LATE_EVERY_S, AUDIT_LATE_TRIES times (a minute: an etcd without quorum).
AUDIT_LATE_EVERY_S = 0.5
AUDIT_LATE_TRIES = 120

# Calls that change state; reads are not audited (they would drown the rest, and change nothing).
_AUDITED = {
    "ScheduleService": {"CreateSchedule", "BatchCreateSchedules", "UpdateSchedule", "DeleteSchedule",
                        "PauseSchedule", "ResumeSchedule",
                        "TriggerSchedule", "RerunExecution", "Backfill", "CancelExecution", "ReplayDeadLetter",
                        "DiscardDeadLetter"},
    "AdminService": {"Switchover", "SetWorkerAffinity", "DrainPlanner", "UndrainPlanner", "SetTenantQuota",
                     "DeleteTenantQuota"},
}
_TARGET_FIELDS = ("execution_id", "schedule_id", "id", "node_id", "target_region", "pool", "tenant")
MAX_MESSAGE = 512


def audited(method: str) -> bool:
    """`/scheduler.v1.ScheduleService/TriggerSchedule` -> True."""
    service, _, name = method.strip("/").partition("/")
    return name in _AUDITED.get(service.rsplit(".", 1)[-1], set())


def target_of(request: Any) -> str:
    """What the call was about: the first id-like field the request has set (a schedule, an execution, a
    planner, a region, a pool)."""
    for name in _TARGET_FIELDS:
        v = getattr(request, name, None)
        if isinstance(v, str) and v:
            return v
    inner = getattr(request, "schedule", None)
    v = getattr(inner, "id", None)
    if isinstance(v, str) and v:
        return v
    many = getattr(request, "schedules", None)  # a batch create: its first id and how many
    if many:
        first = str(getattr(many[0], "id", ""))
        return f"{first} (+{len(many) - 1} more)" if len(many) > 1 else first
    return ""


@dataclass(frozen=True)
class AuditEvent:
    key: str
    at_ms: int
    who: str
    action: str
    target: str
    result: str  # the gRPC status code name: OK, PERMISSION_DENIED, NOT_FOUND, ...
    message: str
    node: str

    def encode(self) -> bytes:
        return json.dumps({"at_ms": self.at_ms, "who": self.who, "action": self.action, "target": self.target,
                           "result": self.result, "message": self.message, "node": self.node},
                          separators=(",", ":")).encode()

    @staticmethod
    def decode(key: bytes, value: bytes) -> AuditEvent:
        d = json.loads(value)
        return AuditEvent(Keyspace.last_segment(key), int(d.get("at_ms", 0)), str(d.get("who", "")),
                          str(d.get("action", "")), str(d.get("target", "")), str(d.get("result", "")),
                          str(d.get("message", "")), str(d.get("node", "")))


class AuditLog:
    def __init__(self, kv: KV, ks: Keyspace, clock: Clock, node_id: str, *, max_events: int = 10_000,
                 trim_every: int = 100, timeout: float = 1.0) -> None:
        self.kv, self.ks, self.clock, self.node_id = kv, ks, clock, node_id
        self.max_events, self.trim_every, self.timeout = max_events, trim_every, timeout
        self._seq = itertools.count()
        self._since_trim = trim_every  # trim on the first write: a restarted node may find the log over
        self._late: set[asyncio.Task[None]] = set()  # events still being put after their call was answered

    async def record(self, who: str, action: str, target: str, result: str, message: str = "") -> None:
        now = self.clock.wall_ms()
        key = self.ks.audit_event(now, self.node_id, next(self._seq) % 1_000_000)
        ev = AuditEvent(Keyspace.last_segment(key), now, who, action, target, result, message[:MAX_MESSAGE],
                        self.node_id)
        # A few tries: the put of one key and value is idempotent (a put whose answer was lost may have landed;
        # putting it again changes nothing), and a done action left unaudited is an error. The game day lost one
        # to a flaky link (F10, 200 +- 100 ms) on a single 1 s try.
        for delay in (*_RETRY_DELAYS, None):
            try:
                await self.kv.put(key, ev.encode(), timeout=self.timeout)
                break
            except (EtcdError, TimeoutError) as e:
                if delay is None:
                    # The action already happened; failing its answer now would make the caller retry it, and
                    # waiting longer holds the answer. Tried on in the background: a quorum loss outlasts these
                    # tries (the game day of session 30 lost a trigger's event 0.2 s into an F4).
                    log.warning("audit event not recorded yet: trying again", extra={
                        "event": "audit_delayed", "who": who, "action": action, "target": target,
                        "result": result, "error": str(e)})
                    task = asyncio.create_task(self._record_late(key, ev), name="audit-late")
                    self._late.add(task)
                    task.add_done_callback(self._late.discard)
                    return
                await asyncio.sleep(delay)
        await self._trim_now_and_then()

    async def _record_late(self, key: bytes, ev: AuditEvent) -> None:
        """Put the event again every AUDIT_LATE_EVERY_S until etcd takes it, AUDIT_LATE_TRIES times at most."""
        error = "no answer"
        try:
            for n in range(1, AUDIT_LATE_TRIES + 1):
                await asyncio.sleep(AUDIT_LATE_EVERY_S)
                try:
                    await self.kv.put(key, ev.encode(), timeout=self.timeout)
                except (EtcdError, TimeoutError) as e:
                    error = str(e)
                    continue
                log.info("audit event recorded late", extra={"event": "audit_recorded_late", "action": ev.action,
                                                             "target": ev.target, "tries": len(_RETRY_DELAYS) + 1 + n})
                await self._trim_now_and_then()
                return
        except asyncio.CancelledError:
            self._lost(ev, "the process stopped before etcd took it")
            raise
        self._lost(ev, f"{error} ({len(_RETRY_DELAYS) + 1 + AUDIT_LATE_TRIES} tries)")

    async def settled(self) -> None:
        """Wait for the events still being put in the background (tests)."""
        await asyncio.gather(*self._late, return_exceptions=True)

    def _lost(self, ev: AuditEvent, error: str) -> None:
        # A done action left unaudited is an error for the operator; a refused or failed one (etcd down: the
        # action failed on the same outage, a game day saw 13) changed nothing, so a warning.
        level = logging.ERROR if ev.result == "OK" else logging.WARNING
        log.log(level, "audit event not recorded", extra={"event": "audit_lost", "who": ev.who, "action": ev.action,
                                                           "target": ev.target, "result": ev.result, "error": error})

    async def _trim_now_and_then(self) -> None:
        self._since_trim += 1
        if self._since_trim >= self.trim_every:
            self._since_trim = 0
            with contextlib.suppress(EtcdError, TimeoutError):  # the next trim catches up
                await self.trim()

    async def trim(self) -> int:
        """Delete the oldest events beyond max_events; returns how many."""
        n = (await self.kv.range(self.ks.audit, prefix=True, count_only=True, timeout=self.timeout)).count
        excess = n - self.max_events
        if excess <= 0:
            return 0
        oldest = await self.kv.range(self.ks.audit, prefix=True, keys_only=True, limit=excess, timeout=self.timeout)
        if not oldest.kvs:
            return 0
        await self.kv.delete(oldest.kvs[0].key, range_end=oldest.kvs[-1].key + b"\x00", timeout=self.timeout)
        return len(oldest.kvs)

    async def list(self, *, after: str = "", limit: int = 100, newest_first: bool = False) -> tuple[
            list[AuditEvent], str]:
        """A page of events oldest first (or newest first), after the key `after`; the next page's cursor
        ("" at the end)."""
        from scheduler.store.etcd.types import SortOrder, SortTarget

        start, end = self.ks.audit, self.ks.audit[:-1] + b"0"  # `/audit/` .. `/audit0`: the whole prefix
        if after:
            if newest_first:
                end = self.ks.audit + after.encode()
            else:
                start = self.ks.audit + after.encode() + b"\x00"
        r = await self.kv.range(start, range_end=end, limit=limit + 1, timeout=self.timeout,
                                sort_order=SortOrder.DESCEND if newest_first else SortOrder.ASCEND,
                                sort_target=SortTarget.KEY)
        events = [AuditEvent.decode(x.key, x.value) for x in r.kvs[:limit]]
        return events, (events[-1].key if len(r.kvs) > limit and events else "")
