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
from scheduler.store.etcd.deadline import LeaseDeadline, LeaseLostReason
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


class MemoryKeeper(LeaseDeadline):
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
        # The same rule and the same refusals as LeaseKeeper (one implementation: deadline.py).
        super().__init__(clock, lease, safety_margin=safety_margin, renew_interval=renew_interval,
                         ack_timeout=ack_timeout)
        self._sink = sink
        self._next_send = clock()  # LeaseKeeper also renews at once when its stream opens
        self._stopped = False

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
