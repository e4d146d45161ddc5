"""Every etcd key the project writes, in one place (the table in docs/keyspace.md mirrors it).

Partitions are zero-padded so that a prefix range lists them in order.
"""

from __future__ import annotations

from dataclasses import dataclass

_PART_WIDTH = 5  # up to 65,536 partitions


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

    def drain(self, node_id: str) -> bytes:
        return self._k("drain", node_id)

    @staticmethod
    def partition_of(key: bytes) -> int:
        """The partition number at the end of an owners/ or checkpoints/ key."""
        return int(key.rsplit(b"/", 1)[1])

    @staticmethod
    def last_segment(key: bytes) -> str:
        return key.rsplit(b"/", 1)[1].decode()
