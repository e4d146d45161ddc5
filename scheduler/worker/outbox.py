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
    backoff: Backoff | None  # made on the first RETRY answer (most results never need one)
    sent_on: str | None = None
    sent_at: float = 0.0
    not_before: float = 0.0
    avoid_origin: bool = False  # the origin did not answer the attempt's start: another planner first


class Outbox:
    def __init__(self, ack_timeout: float, retry_base: float = 0.2, retry_cap: float = 5.0) -> None:
        self.ack_timeout = ack_timeout
        self._retry = (retry_base, retry_cap)
        self._items: dict[AttemptKey, _Pending] = {}
        # Sending new results must not cost a scan of every result awaiting its ack: `_fresh` holds
        # those to send at once, and the full scan (overdue acks, RETRY backoffs) happens only when
        # `_scan_at` (the earliest time one of them can be due) has come.
        self._fresh: dict[AttemptKey, None] = {}
        self._scan_at = float("inf")
        self.resent = 0  # sends after the first (answer overdue, stream lost, RETRY): logged at close

    def __len__(self) -> int:
        return len(self._items)

    def add(self, result: wpb.Result, origin: str, *, avoid_origin: bool = False) -> None:
        """`avoid_origin`: the origin planner left the attempt's start request unanswered (frozen, or cut
        off from the worker or etcd): its not_started result goes to another planner first, which records
        it (any planner can) and tells the owner, instead of waiting `ack_timeout` on a silent stream. A
        game day's planner froze right after recording a start, before its answer left: the worker gave up
        after start_timeout, sent not_started to that frozen planner, and the run waited for its thaw."""
        key = (result.execution_id, result.attempt)
        self._items[key] = _Pending(result, origin, None, avoid_origin=avoid_origin)
        self._fresh[key] = None

    def route(self, connected: list[str], now: float) -> dict[str, list[wpb.Result]]:
        """Which results to send now, grouped by stream: unsent ones and those whose answer is overdue,
        on their origin stream if it is up, otherwise spread over the connected streams."""
        if not connected:
            return {}
        if now >= self._scan_at:
            keys: list[AttemptKey] = list(self._items)
            self._scan_at = float("inf")
        else:
            keys = list(self._fresh)
        self._fresh.clear()
        out: dict[str, list[wpb.Result]] = {}
        spread = 0
        for key in keys:
            p = self._items.get(key)
            if p is None:
                continue
            overdue = p.sent_on is not None and now - p.sent_at >= self.ack_timeout
            if (p.sent_on is not None and not overdue) or now < p.not_before:
                self._scan_at = min(self._scan_at, p.sent_at + self.ack_timeout if p.sent_on is not None
                                    else p.not_before)
                continue
            if p.origin in connected and p.sent_on != p.origin and not p.avoid_origin:
                target = p.origin
            else:  # origin down, or it did not answer in time: try another planner
                avoid = (p.sent_on, p.origin) if p.avoid_origin else (p.sent_on,)
                others = [c for c in connected if c not in avoid] or [c for c in connected if c != p.sent_on] \
                    or connected
                target = others[spread % len(others)]
                spread += 1
            if p.sent_at:
                self.resent += 1
            p.sent_on, p.sent_at = target, now
            out.setdefault(target, []).append(p.result)
        if out:
            self._scan_at = min(self._scan_at, now + self.ack_timeout)
        return out

    def acked(self, key: AttemptKey, disposition: Disposition, now: float) -> None:
        p = self._items.get(key)
        if p is None:
            return
        if disposition is Disposition.FORGET:
            del self._items[key]
            self._fresh.pop(key, None)
        else:  # the planner could not record it now (etcd unreachable...): back off, then resend
            p.sent_on = None
            if p.backoff is None:
                p.backoff = Backoff(*self._retry)
            p.not_before = now + p.backoff.next()
            self._scan_at = min(self._scan_at, p.not_before)

    def stream_lost(self, stream: str) -> None:
        """Results in flight on a broken stream have no answer coming: send them again elsewhere."""
        for key, p in self._items.items():
            if p.sent_on == stream:
                p.sent_on = None
                self._fresh[key] = None

    def keys(self) -> Iterable[AttemptKey]:
        return self._items.keys()
