"""The lease deadline rule, shared by the real keeper (lease.py) and the in-memory twin's keeper.

`deadline() = last_ack + TTL - safety_margin`, where `last_ack` is the monotonic time the latest
acknowledged keepalive was *sent* (etcd restarted the TTL no earlier than that). A lost lease stays
lost: etcd answered TTL <= 0 (expired or revoked), or the deadline passed first; a later answer
never revives it. One implementation, so the twin cannot drift from the rule safety depends on.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from typing import Protocol

from scheduler.store.etcd.errors import LeaseLost
from scheduler.store.etcd.types import Lease

log = logging.getLogger(__name__)


class LeaseLostReason(enum.Enum):
    EXPIRED = "etcd reports the lease gone (TTL <= 0: expired or revoked)"
    LOCAL_DEADLINE = "no keepalive acknowledged before the local deadline"


class LeaseObserver(Protocol):
    """Told about renewals (metrics). Called on the event loop; must be cheap and must not raise."""

    def renewed(self, latency_s: float) -> None: ...

    def renew_failed(self, reason: str) -> None: ...

    def lease_lost(self, reason: str) -> None: ...


class LeaseDeadline:
    def __init__(
        self,
        clock: Callable[[], float],
        lease: Lease,
        *,
        safety_margin: float,
        renew_interval: float | None = None,
        ack_timeout: float | None = None,
    ) -> None:
        if not 0 <= safety_margin < lease.ttl:
            raise ValueError(f"safety_margin must be in [0, ttl={lease.ttl}), got {safety_margin}")
        self._clock = clock
        self.lease_id = lease.id
        self.ttl = lease.ttl
        self.safety_margin = safety_margin
        self.renew_interval = lease.ttl / 3 if renew_interval is None else renew_interval
        if not 0 < self.renew_interval < lease.ttl - safety_margin:
            raise ValueError("renew_interval must be > 0 and below ttl - safety_margin")
        # An unanswered keepalive older than this means the stream (or its member) is stuck.
        self.ack_timeout = self.renew_interval if ack_timeout is None else ack_timeout
        self._last_ack = lease.sent_at  # the grant counts as the first acknowledged renewal
        self._lost: LeaseLostReason | None = None
        self._lost_event = asyncio.Event()
        self.acks = 0
        self.observer: LeaseObserver | None = None

    @property
    def last_ack(self) -> float:
        """Monotonic send time of the latest acknowledged keepalive (or of the grant)."""
        return self._last_ack

    def deadline(self) -> float:
        """After this monotonic time the caller must act as if the lease were gone."""
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
        """Raise `LeaseLost` unless the lease is held with time to spare."""
        reason = self.lost_reason
        if reason is not None:
            raise LeaseLost(f"lease {self.lease_id:x} lost: {reason.value}")

    def _mark_lost(self, reason: LeaseLostReason) -> None:
        if self._lost is None:
            self._lost = reason
            self._lost_event.set()
            log.warning("lease %x lost: %s", self.lease_id, reason.value)
            if self.observer is not None:
                self.observer.lease_lost(reason.name.lower())

    def _observe_deadline(self) -> None:
        if self._lost is None and self._clock() >= self.deadline():
            self._mark_lost(LeaseLostReason.LOCAL_DEADLINE)

    def _on_ack(self, sent_at: float, ttl: int) -> None:
        self._observe_deadline()  # a late answer must not revive a lease whose deadline has passed
        if self._lost is not None:
            return
        if ttl <= 0:
            self._mark_lost(LeaseLostReason.EXPIRED)
            return
        self.ttl = min(self.ttl, ttl)  # etcd echoes the granted TTL; never assume more than granted
        self._last_ack = max(self._last_ack, sent_at)
        self.acks += 1
        if self.observer is not None:
            self.observer.renewed(self._clock() - sent_at)
