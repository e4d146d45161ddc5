"""The in-memory twin of etcd behind the `KV` interface (scheduler/store/kv.py).

Faithful to what a client of etcd 3.5 observes: revisions (one per write request that changes
something), per-key create/mod revision and version, historical reads and compaction, txn compare
rules (missing keys, ranges), etcd's request checks (duplicate keys, too many ops, size), leases
expiring on an injected monotonic clock, keepers with `LeaseKeeper`'s self-fencing deadline, and
watches with history replay, progress notifications and `Compacted`. tests/store/contract/ runs one
suite against this twin and a real etcd.

    kv = MemoryKV(clock=fake.monotonic)          # a cluster of its own, one client
    other = kv.server.client()                   # a second process on the same cluster
    kv.pause_keepalives(); kv.fail_next("txn", after_apply=True); kv.disconnect()
"""

from scheduler.store.memory.client import MemoryKV, OpKind
from scheduler.store.memory.keeper import MemoryKeeper
from scheduler.store.memory.server import MemoryEtcd
from scheduler.store.memory.watch import MemoryWatcher

__all__ = ["MemoryEtcd", "MemoryKV", "MemoryKeeper", "MemoryWatcher", "OpKind"]
