"""Every etcd key the project writes, in one place (the table in docs/keyspace.md mirrors it).

Partitions are zero-padded so that a prefix range lists them in order.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from scheduler.ids import ExecutionId
from scheduler.timeplan.hashing import stable_u64

_PART_WIDTH = 5  # up to 65,536 partitions
_MS_WIDTH = 13  # epoch milliseconds until the year 2286


@functools.lru_cache(maxsize=1 << 17)
def partition_for(schedule_id: str, partitions: int) -> int:
    """`stable_u64("P\\x00" + id) % P`: a compatibility contract, like the H hash (never change it).
    Cached: it is on the path of every ledger write (a SHA-256 each time otherwise)."""
    return stable_u64(f"P\x00{schedule_id}") % partitions


@dataclass(frozen=True)
class Keyspace:
    prefix: str = "/sched"

    def _k(self, *parts: str) -> bytes:
        return "/".join((self.prefix, *parts)).encode()

    @property
    def cluster_config(self) -> bytes:
        return self._k("cluster", "config")

    @property
    def region_policy(self) -> bytes:
        return self._k("cluster", "region")

    # ---- tenant quotas (issue 14) -----------------------------------------------------------------

    @property
    def default_quota(self) -> bytes:
        return self._k("cluster", "quota")

    @property
    def quotas(self) -> bytes:
        return self._k("quotas", "")

    def quota(self, tenant: str) -> bytes:
        return self._k("quotas", tenant)

    @property
    def all_usage(self) -> bytes:
        return self._k("usage", "")

    def usage(self, tenant: str) -> bytes:
        return self._k("usage", tenant)

    @property
    def members(self) -> bytes:
        return self._k("members", "")

    def member(self, node_id: str) -> bytes:
        return self._k("members", node_id)

    @property
    def owners(self) -> bytes:
        return self._k("owners", "")

    def owner(self, partition: int) -> bytes:
        return self._k("owners", f"{partition:0{_PART_WIDTH}d}")

    @property
    def checkpoints(self) -> bytes:
        return self._k("checkpoints", "")

    def checkpoint(self, partition: int) -> bytes:
        return self._k("checkpoints", f"{partition:0{_PART_WIDTH}d}")

    # ---- schedules, ledger (issue 4) ------------------------------------------------------------

    def schedules(self, partition: int) -> bytes:
        return self._k("schedules", f"{partition:0{_PART_WIDTH}d}", "")

    def schedule(self, partition: int, schedule_id: str) -> bytes:
        return self._k("schedules", f"{partition:0{_PART_WIDTH}d}", schedule_id)

    @property
    def all_schedules(self) -> bytes:
        return self._k("schedules", "")

    @property
    def all_executions(self) -> bytes:
        return self._k("executions", "")

    def executions(self, partition: int, schedule_id: str | None = None) -> bytes:
        if schedule_id is None:
            return self._k("executions", f"{partition:0{_PART_WIDTH}d}", "")
        return self._k("executions", f"{partition:0{_PART_WIDTH}d}", schedule_id, "")

    def execution(self, partition: int, schedule_id: str, planned_ms: int) -> bytes:
        return self._k("executions", f"{partition:0{_PART_WIDTH}d}", schedule_id, f"{planned_ms:0{_MS_WIDTH}d}")

    def skip_of(self, key: bytes) -> tuple[str, int, int]:
        """A skip key's (schedule id, after, through): the inverse of `skip`."""
        sid, span = self._split("skips", key)
        after, _, through = span.partition(b"-")
        return sid, int(after), int(through)

    @staticmethod
    def planned_key_part(planned_ms: int) -> bytes:
        """The last segment of an execution key (`execution`): zero-padded, so keys compare as numbers do."""
        return f"{planned_ms:0{_MS_WIDTH}d}".encode()

    def execution_id_of(self, key: bytes) -> ExecutionId:
        """The execution an execution key stands for (the inverse of `execution`)."""
        return self._id_in("executions", key)

    def _id_in(self, kind: str, key: bytes) -> ExecutionId:
        """`<prefix>/<kind>/<partition>/<schedule id>/<planned ms>` -> (schedule id, planned ms)."""
        sid, planned = self._split(kind, key)
        return ExecutionId(sid, int(planned))

    def _split(self, kind: str, key: bytes) -> tuple[str, bytes]:
        """`<prefix>/<kind>/<partition>/<schedule id>/<last>` -> (schedule id, last segment)."""
        head, _, last = key.rpartition(b"/")
        return head[len(self._k(kind, "")) + _PART_WIDTH + 1:].decode(), last

    def skips(self, partition: int, schedule_id: str | None = None) -> bytes:
        if schedule_id is None:
            return self._k("skips", f"{partition:0{_PART_WIDTH}d}", "")
        return self._k("skips", f"{partition:0{_PART_WIDTH}d}", schedule_id, "")

    def skip(self, partition: int, schedule_id: str, after_ms: int, through_ms: int) -> bytes:
        return self._k("skips", f"{partition:0{_PART_WIDTH}d}", schedule_id,
                       f"{after_ms:0{_MS_WIDTH}d}-{through_ms:0{_MS_WIDTH}d}")

    @property
    def all_tombstones(self) -> bytes:
        return self._k("tombstones", "")

    def tombstones(self, partition: int) -> bytes:
        return self._k("tombstones", f"{partition:0{_PART_WIDTH}d}", "")

    def tombstone(self, partition: int, schedule_id: str) -> bytes:
        """"This schedule was deleted at <ms>; it was <value>": written with the delete, so an owner that
        never saw the schedule (the delete landed while the partition had none) still records its planned
        times between the checkpoint and the delete; deleted by the owner that did."""
        return self._k("tombstones", f"{partition:0{_PART_WIDTH}d}", schedule_id)

    def holds(self, partition: int) -> bytes:
        return self._k("holds", f"{partition:0{_PART_WIDTH}d}", "")

    def hold(self, partition: int, schedule_id: str) -> bytes:
        """"This schedule's planned times after <from> were not materialized" (its pool's workers were
        gone or saturated): written with the checkpoint that passes them, so a new owner catches up on
        them by the missed-run policy; deleted by the owner that did."""
        return self._k("holds", f"{partition:0{_PART_WIDTH}d}", schedule_id)

    def dead_letters(self, partition: int | None = None, schedule_id: str | None = None) -> bytes:
        """The dead-letter index: all of it, one partition's, or one schedule's (`schedule_id` needs
        its `partition`)."""
        if partition is None:
            return self._k("dead", "")
        if schedule_id is None:
            return self._k("dead", f"{partition:0{_PART_WIDTH}d}", "")
        return self._k("dead", f"{partition:0{_PART_WIDTH}d}", schedule_id, "")

    def dead_letter(self, partition: int, schedule_id: str, planned_ms: int) -> bytes:
        """The dead-letter index key of one execution (its value: store.ledger.DeadLetterEntry)."""
        return self._k("dead", f"{partition:0{_PART_WIDTH}d}", schedule_id, f"{planned_ms:0{_MS_WIDTH}d}")

    def dead_letter_of(self, key: bytes) -> ExecutionId:
        """The execution a dead-letter index key stands for (the inverse of `dead_letter`)."""
        return self._id_in("dead", key)

    def notices(self, partition: int | None = None) -> bytes:
        if partition is None:
            return self._k("notices", "")
        return self._k("notices", f"{partition:0{_PART_WIDTH}d}", "")

    def notice(self, partition: int, schedule_id: str, from_ms: int, through_ms: int) -> bytes:
        """"Re-read this schedule's records with planned times in [from, through]": written by whoever
        changes execution records the partition's owner did not write (API operations, a result
        recorded by another node), in the same txn as the change."""
        return self._k("notices", f"{partition:0{_PART_WIDTH}d}", schedule_id,
                       f"{from_ms:0{_MS_WIDTH}d}-{through_ms:0{_MS_WIDTH}d}")

    def drain(self, node_id: str) -> bytes:
        return self._k("drain", node_id)

    @staticmethod
    def partition_of(key: bytes) -> int:
        """The partition number at the end of an owners/ or checkpoints/ key."""
        return int(key.rsplit(b"/", 1)[1])

    @staticmethod
    def partition_of_schedule(key: bytes) -> int:
        """The partition number in a schedules/<partition>/<id> key."""
        return int(key.rsplit(b"/", 2)[-2])

    @property
    def drains(self) -> bytes:
        return self._k("drain", "")

    @property
    def audit(self) -> bytes:
        return self._k("audit", "")

    def audit_event(self, at_ms: int, node_id: str, seq: int) -> bytes:
        """Time first, so a prefix range lists the log oldest first and the oldest are the ones trimmed."""
        return self._k("audit", f"{at_ms:0{_MS_WIDTH}d}-{node_id}-{seq:06d}")

    @property
    def regions(self) -> bytes:
        return self._k("regions", "")

    def region(self, name: str) -> bytes:
        return self._k("regions", name)

    @staticmethod
    def last_segment(key: bytes) -> str:
        return key.rsplit(b"/", 1)[1].decode()
