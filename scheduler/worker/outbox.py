"""Results waiting for a ResultAck. A result stays here until a planner says RECORDED, DUPLICATE or
STALE; it is sent again (on any stream) when its stream breaks, when a planner answers RETRY, or when
no answer came within `ack_timeout`. Any planner can record any result, so a lost stream never loses
one: the worst case is a DUPLICATE answer."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.worker.attempt import AttemptKey
from scheduler.worker.backoff import Backoff


class Disposition(Enum):
    FORGET = "forget"  # RECORDED, DUPLICATE, STALE
    RETRY = "retry"


@dataclass
class _Pending:
    result: wpb.Result
    origin: str  # stream of the planner that dispatched the attempt: preferred for the first send
    backoff: Backoff
    sent_on: str | None = None
    sent_at: float = 0.0
    not_before: float = 0.0


class Outbox:
    def __init__(self, ack_timeout: float, retry_base: float = 0.2, retry_cap: float = 5.0) -> None:
        self.ack_timeout = ack_timeout
        self._retry = (retry_base, retry_cap)
        self._items: dict[AttemptKey, _Pending] = {}

    def __len__(self) -> int:
        return len(self._items)

    def add(self, result: wpb.Result, origin: str) -> None:
        self._items[(result.execution_id, result.attempt)] = _Pending(result, origin, Backoff(*self._retry))

    def route(self, connected: list[str], now: float) -> dict[str, list[wpb.Result]]:
        """Which results to send now, grouped by stream: unsent ones and those whose answer is overdue,
        on their origin stream if it is up, otherwise spread over the connected streams."""
        if not connected:
            return {}
        out: dict[str, list[wpb.Result]] = {}
        spread = 0
        for p in self._items.values():
            overdue = p.sent_on is not None and now - p.sent_at >= self.ack_timeout
            if (p.sent_on is not None and not overdue) or now < p.not_before:
                continue
            if p.origin in connected and p.sent_on != p.origin:
                target = p.origin
            else:  # origin down, or it did not answer in time: try another planner
                others = [c for c in connected if c != p.sent_on] or connected
                target = others[spread % len(others)]
                spread += 1
            p.sent_on, p.sent_at = target, now
            out.setdefault(target, []).append(p.result)
        return out

    def acked(self, key: AttemptKey, disposition: Disposition, now: float) -> None:
        p = self._items.get(key)
        if p is None:
            return
        if disposition is Disposition.FORGET:
            del self._items[key]
        else:  # the planner could not record it now (etcd unreachable...): back off, then resend
            p.sent_on = None
            p.not_before = now + p.backoff.next()

    def stream_lost(self, stream: str) -> None:
        """Results in flight on a broken stream have no answer coming: send them again elsewhere."""
        for p in self._items.values():
            if p.sent_on == stream:
                p.sent_on = None

    def keys(self) -> Iterable[AttemptKey]:
        return self._items.keys()
