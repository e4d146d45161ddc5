"""The twin's lease table: TTLs on the injected monotonic clock and the keys attached to each lease."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from scheduler.store.memory import _status

__all__ = ["DEFAULT_MIN_TTL", "LeaseState", "Leases"]

# etcd raises shorter TTLs to its minimum, 1.5 x election timeout rounded up: 2 s with default
# flags (measured: grant(0) and grant(1) both come back with TTL 2).
DEFAULT_MIN_TTL = 2
# Ids look like etcd's (large, positive), so code that squeezes them into 32 bits fails here too.
_FIRST_ID = 0x694D_7E57_0000_0001


@dataclass(slots=True)
class LeaseState:
    id: int
    ttl: int  # as granted
    expiry: float  # clock time at which it expires unless renewed
    keys: set[bytes] = field(default_factory=set)

    def remaining(self, now: float) -> int:
        # etcd answers TimeToLive with int64(remaining.Seconds()), which truncates: 2.99 s -> 2.
        return math.trunc(self.expiry - now)


class Leases:
    def __init__(self, min_ttl: int = DEFAULT_MIN_TTL) -> None:
        self.min_ttl = min_ttl
        self._leases: dict[int, LeaseState] = {}
        self._ids = itertools.count(_FIRST_ID)

    def grant(self, ttl: int, lease_id: int, now: float) -> LeaseState:
        if lease_id == 0:
            lease_id = next(i for i in self._ids if i not in self._leases)
        elif lease_id in self._leases:
            raise _status.error(_status.LEASE_EXISTS, write=True)
        ttl = max(ttl, self.min_ttl)
        lease = self._leases[lease_id] = LeaseState(lease_id, ttl, now + ttl)
        return lease

    def get(self, lease_id: int) -> LeaseState | None:
        return self._leases.get(lease_id)

    def pop(self, lease_id: int) -> LeaseState | None:
        return self._leases.pop(lease_id, None)

    def renew(self, lease_id: int, now: float) -> int:
        """A keepalive: the TTL etcd answers (0 when the lease is gone)."""
        lease = self._leases.get(lease_id)
        if lease is None:
            return 0
        lease.expiry = now + lease.ttl
        return lease.ttl

    def expired(self, now: float) -> list[LeaseState]:
        """Leases past their expiry, earliest first (etcd's lessor pops them off a heap in that order)."""
        return sorted((lease for lease in self._leases.values() if lease.expiry <= now), key=lambda lease: lease.expiry)

    def attach(self, lease_id: int, key: bytes) -> None:
        lease = self._leases.get(lease_id)
        if lease is not None:
            lease.keys.add(key)

    def detach(self, lease_id: int, key: bytes) -> None:
        lease = self._leases.get(lease_id)
        if lease is not None:
            lease.keys.discard(key)
