"""The planner <-> etcd links a drill can break: what each planner dials, and the link faults (F3
partition, F10 flaky link, and the held txn that F2 needs to land a stale write).

`DirectLinks`: planners dial etcd directly; no link fault can be made (a scenario asking for one is
refused before the run starts). `ProxyLinks` (chaos/proxy.py): one fault proxy per planner and etcd
member on loopback, so a fault on one planner's link leaves every other planner's alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

__all__ = ["DirectLinks", "LinkFaultUnsupported", "Links"]


class LinkFaultUnsupported(RuntimeError):
    """This topology cannot make that link fault."""


class Links(Protocol):
    kind: str

    async def start(self, etcd_endpoints: Sequence[str], planners: Sequence[str]) -> None: ...

    def endpoints_for(self, planner: str) -> list[str]: ...

    async def cut(self, planner: str, direction: str, mode: str) -> str: ...

    async def flaky(self, planner: str, latency_ms: int, jitter_ms: int, drop: float) -> str: ...

    def arm_freeze(self, planner: str, freeze: Callable[[], None]) -> None: ...

    def disarm(self, planner: str) -> None: ...

    async def hold(self, planner: str) -> str: ...

    async def held_bytes(self, planner: str) -> int: ...

    async def drop_held(self, planner: str) -> int: ...

    async def fenced_requests(self, planner: str) -> int: ...

    async def heal(self, planner: str) -> str: ...

    def retarget(self, member: int, endpoint: str) -> int: ...

    async def close(self) -> None: ...


class DirectLinks:
    kind = "direct"

    def __init__(self) -> None:
        self._endpoints: list[str] = []

    async def start(self, etcd_endpoints: Sequence[str], planners: Sequence[str]) -> None:
        self._endpoints = list(etcd_endpoints)

    def endpoints_for(self, planner: str) -> list[str]:
        return list(self._endpoints)

    async def cut(self, planner: str, direction: str, mode: str) -> str:
        raise LinkFaultUnsupported("direct links: no proxy or namespace to cut")

    async def flaky(self, planner: str, latency_ms: int, jitter_ms: int, drop: float) -> str:
        raise LinkFaultUnsupported("direct links: no proxy to slow down")

    def arm_freeze(self, planner: str, freeze: Callable[[], None]) -> None:
        raise LinkFaultUnsupported("direct links: no proxy to catch a write in")

    def disarm(self, planner: str) -> None:
        return None

    async def hold(self, planner: str) -> str:
        raise LinkFaultUnsupported("direct links: no proxy to hold a txn in")

    async def held_bytes(self, planner: str) -> int:
        return 0

    async def drop_held(self, planner: str) -> int:
        raise LinkFaultUnsupported("direct links: no proxy to hold a txn in")

    async def fenced_requests(self, planner: str) -> int:
        return 0

    async def heal(self, planner: str) -> str:
        return ""

    def retarget(self, member: int, endpoint: str) -> int:
        """Planners dial the members themselves: the running ones keep their endpoint lists (the replaced
        member's old address fails and their channel balances over the others); planners started from now
        on get the new address."""
        if 0 <= member < len(self._endpoints):
            self._endpoints[member] = endpoint
        return 0

    async def close(self) -> None:
        return None
