"""MemoryKeeper: the twin of `LeaseKeeper`, with the same deadline rule and the same loss rules.

`deadline() = last_ack + TTL - safety_margin`, where `last_ack` is the clock time a renewal that was
answered had been sent. A renewal goes out every `renew_interval` on the clock while the twin's
timers run (`MemoryEtcd.run_due`). A lost lease stays lost: etcd answered TTL 0 (expired or revoked),
or the deadline passed first; a later answer never revives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from scheduler.store.etcd.connection import Clock
from scheduler.store.etcd.errors import LeaseLost
from scheduler.store.etcd.lease import LeaseLostReason
from scheduler.store.etcd.types import Lease

__all__ = ["KeepaliveSink", "MemoryKeeper"]

log = logging.getLogger(__name__)

# How often wait_lost() looks at the clock by itself (real seconds), so that it returns in time even
# when the twin's timers stopped (closed client) or the clock is a fake moved by a test.
_POLL = 0.01


class KeepaliveSink(Protocol):
    """Where a keeper's renewals go: the client, which may drop them (paused, disconnected)."""

    def send_keepalive(self, lease_id: int) -> int | None:
        """etcd's answer (the TTL, 0 when the lease is gone), or None when nothing came back."""
        ...

    def forget_keeper(self, keeper: MemoryKeeper) -> None: ...


class MemoryKeeper:
    def __init__(
        self,
        sink: KeepaliveSink,
        clock: Clock,
        lease: Lease,
        *,
        safety_margin: float,
        renew_interval: float | None = None,
        ack_timeout: float | None = None,
    ) -> None:
        # The same refusals as LeaseKeeper, so a bad timing fails on the twin too.
        if not 0 <= safety_margin < lease.ttl:
            raise ValueError(f"safety_margin must be in [0, ttl={lease.ttl}), got {safety_margin}")
        self._sink = sink
        self._clock = clock
        self.lease_id = lease.id
        self.ttl = lease.ttl
        self.safety_margin = safety_margin
        self.renew_interval = lease.ttl / 3 if renew_interval is None else renew_interval
        if not 0 < self.renew_interval < lease.ttl - safety_margin:
            raise ValueError("renew_interval must be > 0 and below ttl - safety_margin")
        self.ack_timeout = self.renew_interval if ack_timeout is None else ack_timeout  # kept for parity
        self._last_ack = lease.sent_at  # the grant counts as the first acknowledged renewal
        self._next_send = clock()  # LeaseKeeper also renews at once when its stream opens
        self._lost: LeaseLostReason | None = None
        self._lost_event = asyncio.Event()
        self._stopped = False
        self.acks = 0

    # ---- what callers read (as LeaseKeeper) -----------------------------------------------------

    @property
    def last_ack(self) -> float:
        return self._last_ack

    def deadline(self) -> float:
        return self._last_ack + self.ttl - self.safety_margin

    def remaining(self) -> float:
        return self.deadline() - self._clock()

    @property
    def lost_reason(self) -> LeaseLostReason | None:
        self._observe_deadline()
        return self._lost

    def alive(self) -> bool:
        return self.lost_reason is None

    def check(self) -> None:
        reason = self.lost_reason
        if reason is not None:
            raise LeaseLost(f"lease {self.lease_id:x} lost: {reason.value}")

    async def wait_lost(self) -> LeaseLostReason:
        while (reason := self.lost_reason) is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lost_event.wait(), timeout=min(max(self.remaining(), 0.001), _POLL))
        return reason

    @property
    def stopped(self) -> bool:
        return self._stopped

    async def stop(self) -> None:
        """Stop renewing (the lease then expires on its own unless revoked)."""
        self._stopped = True
        self._sink.forget_keeper(self)

    async def __aenter__(self) -> MemoryKeeper:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # ---- driven by the twin's timers ------------------------------------------------------------

    def run_due(self) -> None:
        """Renew if a renewal is due. Called by MemoryEtcd.run_due after expired leases are gone."""
        if self._stopped or self.lost_reason is not None:
            return
        now = self._clock()
        if now < self._next_send:
            return
        self._next_send = now + self.renew_interval
        ttl = self._sink.send_keepalive(self.lease_id)
        if ttl is not None:
            self._on_ack(now, ttl)

    def _on_ack(self, sent_at: float, ttl: int) -> None:
        self._observe_deadline()
        if self._lost is not None:
            return
        if ttl <= 0:
            self._mark_lost(LeaseLostReason.EXPIRED)
            return
        self.ttl = min(self.ttl, ttl)
        self._last_ack = max(self._last_ack, sent_at)
        self.acks += 1

    def _observe_deadline(self) -> None:
        if self._lost is None and self._clock() >= self.deadline():
            self._mark_lost(LeaseLostReason.LOCAL_DEADLINE)

    def _mark_lost(self, reason: LeaseLostReason) -> None:
        if self._lost is None:
            self._lost = reason
            self._lost_event.set()
            log.info("lease %x lost: %s", self.lease_id, reason.value)
