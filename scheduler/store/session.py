"""One etcd lease per planner process, kept alive on one stream, with a local self-fence deadline.

The deadline is `monotonic time the last acknowledged keepalive was SENT + TTL - safety margin`:
etcd restarted the TTL no earlier than the send, so past the deadline etcd may already have expired
the lease and given our partitions away. `fenced()` turns true there even if etcd is unreachable
and nobody told us anything; owners stop all work at that moment.
"""

from __future__ import annotations

import logging

from scheduler.config import CoordinationSettings
from scheduler.errors import SchedError
from scheduler.store.etcd.deadline import LeaseObserver
from scheduler.store.etcd.errors import LeaseNotFound
from scheduler.store.kv import KV, Keeper

log = logging.getLogger(__name__)


class Session:
    def __init__(self, kv: KV, settings: CoordinationSettings, observer: LeaseObserver | None = None) -> None:
        self._kv = kv
        self._settings = settings
        self._observer = observer  # renew latency and failures (metrics)
        self._keeper: Keeper | None = None

    async def start(self) -> None:
        s = self._settings
        lease = await self._kv.lease_grant(s.lease_ttl, timeout=s.rpc_timeout)
        self._keeper = self._kv.keep_alive(
            lease, safety_margin=s.safety_margin, renew_interval=s.renew, ack_timeout=s.rpc_timeout
        )
        self._keeper.observer = self._observer
        log.info("session started", extra={"lease": f"{lease.id:x}", "ttl": lease.ttl})

    @property
    def keeper(self) -> Keeper:
        if self._keeper is None:
            raise SchedError("session not started")
        return self._keeper

    @property
    def lease_id(self) -> int:
        return self.keeper.lease_id

    def deadline(self) -> float:
        return self.keeper.deadline()

    def fenced(self) -> bool:
        """True once the lease may be gone: stop owning, whatever etcd has said so far."""
        if self._keeper is None:
            return True
        if self._settings.unsafe_disable_self_fence:
            return self._keeper.lost_reason is not None and self._keeper.lost_reason.name == "EXPIRED"
        return not self._keeper.alive()

    async def close(self, *, revoke: bool = True) -> bool:
        """Stop renewing; revoking hands our partitions over at once instead of after the TTL. True if the
        lease is known gone (revoked now, or etcd no longer has it); False if the revoke was not answered
        (etcd unreachable: the caller may try again, `revoke_lease`) or not asked for."""
        keeper, self._keeper = self._keeper, None
        if keeper is None:
            return False
        await keeper.stop()
        return revoke and await revoke_lease(self._kv, keeper.lease_id, self._settings.rpc_timeout)


async def revoke_lease(kv: KV, lease_id: int, timeout: float) -> bool:
    """One revoke, bounded by `timeout`: True if the lease is gone (revoked, or not found: expired or revoked
    before), False if etcd did not answer or refused (the TTL expires it anyway, once etcd has a leader)."""
    try:
        await kv.lease_revoke(lease_id, timeout=timeout)
    except LeaseNotFound:
        return True
    except Exception:  # best effort, never fatal: unreachable, no leader, outcome unknown
        return False
    return True
