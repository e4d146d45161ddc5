"""The versioned keyspace of the twin: etcd's MVCC model, reduced to what a client can observe.

Every key keeps its history as (revision, KeyValue | None) entries, None marking a delete, so a read
at any revision since the last compaction sees exactly what etcd would. Events of every revision are
kept in one log for watch replay. A write request runs as one `WriteTxn`: all its changes share one
revision, and the revision moves only if something changed (etcd's `len(txn.Changes()) != 0`).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass, field, replace

from scheduler.store.etcd.types import EventType, KeyValue, WatchEvent

__all__ = ["Keyspace", "WriteTxn", "in_range"]

_Entry = tuple[int, KeyValue | None]  # (revision, the key's value from then on; None = deleted)


def in_range(key: bytes, start: bytes, end: bytes) -> bool:
    """etcd's key-range rule: empty end = the one key, b"\\0" = every key from `start` on."""
    if not end:
        return key == start
    if end == b"\0":
        return key >= start
    return start <= key < end


def _revision_of(entry: _Entry) -> int:
    return entry[0]


class Keyspace:
    def __init__(self) -> None:
        self.revision = 1  # etcd's revision of an empty store
        self.compact_revision = 0
        self._keys: list[bytes] = []  # sorted: every key that has history
        self._history: dict[bytes, list[_Entry]] = {}
        self._log: list[WatchEvent] = []  # events since the compaction revision, in revision order;
        # each carries its prev_kv, which a watcher drops when it did not ask for it

    # ---- reads ----------------------------------------------------------------------------------

    def get(self, key: bytes, revision: int | None = None) -> KeyValue | None:
        """The key at `revision` (None = the latest, including writes of a running WriteTxn)."""
        entries = self._history.get(key)
        if not entries:
            return None
        if revision is None or revision >= entries[-1][0]:
            return entries[-1][1]
        i = bisect_right(entries, revision, key=_revision_of)
        return entries[i - 1][1] if i else None

    def keys(self, start: bytes, end: bytes) -> list[bytes]:
        """Keys with history in [start, end), in key order (some may be deleted at a given revision)."""
        if not end:
            return [start] if start in self._history else []
        lo = bisect_left(self._keys, start)
        hi = len(self._keys) if end == b"\0" else bisect_left(self._keys, end)
        return self._keys[lo:hi] if lo < hi else []

    def range(self, start: bytes, end: bytes, revision: int | None = None) -> list[KeyValue]:
        kvs = []
        for key in self.keys(start, end):
            kv = self.get(key, revision)
            if kv is not None:
                kvs.append(kv)
        return kvs

    def events(self, from_revision: int) -> list[WatchEvent]:
        """Logged events at or after `from_revision` (the caller checks compaction first)."""
        i = bisect_left(self._log, from_revision, key=_event_revision)
        return self._log[i:]

    # ---- compaction -----------------------------------------------------------------------------

    def compact(self, revision: int) -> None:
        """Forget history below `revision`: reads at `revision` and later are unchanged."""
        self.compact_revision = revision
        # etcd keeps the events *at* the compaction revision (measured: a watch from it replays them).
        self._log = self._log[bisect_left(self._log, revision, key=_event_revision):]
        gone = []
        for key, entries in self._history.items():
            # Keep the latest entry at or below `revision` (it is the key's value there) and all later ones.
            i = bisect_right(entries, revision, key=_revision_of)
            if i > 1:
                del entries[: i - 1]
            if entries[0][0] <= revision and entries[0][1] is None:
                del entries[0]  # a delete no read at or after `revision` can tell from "never existed"
            if not entries:
                gone.append(key)
        for key in gone:
            del self._history[key]
        if gone:
            self._keys = sorted(self._history)


def _event_revision(event: WatchEvent) -> int:
    return event.kv.mod_revision


@dataclass
class WriteTxn:
    """The changes of one write request. Writes land at once (later ops of the same txn read them,
    as in etcd); `commit()` then moves the store's revision if anything changed."""

    space: Keyspace
    revision: int = 0
    events: list[WatchEvent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.revision = self.space.revision + 1

    @property
    def read_revision(self) -> int:
        """The revision a read inside this txn sees: its own writes once it has made any."""
        return self.revision if self.events else self.space.revision

    def put(self, key: bytes, value: bytes, lease: int) -> tuple[KeyValue, KeyValue | None]:
        prev = self.space.get(key)
        if prev is None:
            kv = KeyValue(key, value, self.revision, self.revision, 1, lease)
        else:
            kv = replace(prev, value=value, mod_revision=self.revision, version=prev.version + 1, lease=lease)
        self._record(key, kv)
        self.events.append(WatchEvent(EventType.PUT, kv, prev))
        return kv, prev

    def delete(self, start: bytes, end: bytes) -> list[KeyValue]:
        """Delete the live keys in range; their previous values, in key order."""
        deleted = self.space.range(start, end)
        for prev in deleted:
            self._record(prev.key, None)
            # A delete event's kv is the bare key at the delete's revision, as etcd sends it.
            self.events.append(WatchEvent(EventType.DELETE, KeyValue(prev.key, b"", 0, self.revision, 0, 0), prev))
        return deleted

    def commit(self) -> int:
        """Apply and return the response header's revision."""
        if self.events:
            self.space.revision = self.revision
            self.space._log.extend(self.events)
        return self.space.revision

    def _record(self, key: bytes, kv: KeyValue | None) -> None:
        entries = self.space._history.get(key)
        if entries is None:
            entries = self.space._history[key] = []
            insort(self.space._keys, key)
        entries.append((self.revision, kv))
