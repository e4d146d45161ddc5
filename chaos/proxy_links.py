"""Planner <-> etcd links through fault proxies on loopback (chaos/proxy.py): one proxy per planner
and etcd member, so a fault on one planner's link leaves every other's alone, and a wire witness
(chaos/wire.py) on every connection, recording the fenced txns etcd refused.

How the catalogue's link faults map (the planner is the client; `up` is planner -> etcd):
- F3 `drop`: stall (nothing read or forwarded; TCP survives, so whatever the planner sent before its
  lease ran out reaches etcd *after* the heal, late: exactly the stale write the fence must refuse);
  `outbound` stalls `up`, `inbound` stalls `down`, `both` both. `reset`: every connection RST and new
  ones refused until the heal.
- F10: latency +- jitter on both directions, and `drop` as the share of chunks that arrive one
  retransmission timeout late (a TCP stream cannot lose bytes and stay valid).
- hold (F2 beyond the TTL): the planner's outgoing bytes are read but not forwarded, so the nemesis
  can see a write caught in flight before it freezes the planner. F1 `at = "write"` kills the planner
  there instead and drops what was held: a crash between two writes of a round (after a dispatch,
  before its checkpoint), aimed rather than left to chance.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Sequence

from chaos.proxy import Dialer, Direction, FaultProxy
from chaos.wire import FencedTxn, WireWitness
from scheduler.clock import SYSTEM_CLOCK

__all__ = ["ProxyLinks"]

_DIRECTIONS = {"both": "both", "outbound": "up", "inbound": "down"}


class ProxyLinks:
    kind = "proxy"

    def __init__(self, on_txn: Callable[[FencedTxn], None], owners_prefix: bytes, *,
                 listen: Callable[[], socket.socket] | None = None, dial: Dialer | None = None) -> None:
        """`listen` makes each proxy's listening socket and `dial` its upstream connections (default:
        loopback port 0, asyncio.open_connection); a namespace run makes both in the harness namespace
        (chaos/netns_cluster.py), so the proxies stay outside every fault there too."""
        self.on_txn = on_txn
        self.owners = owners_prefix
        self.listen = listen
        self.dial = dial
        self.proxies: dict[str, list[FaultProxy]] = {}
        self._witnesses: dict[tuple[str, int, int], WireWitness] = {}
        self._armed: dict[str, Callable[[], None]] = {}  # planner -> called as its next write is read

    async def start(self, etcd_endpoints: Sequence[str], planners: Sequence[str]) -> None:
        for p in planners:
            out = []
            for i, ep in enumerate(etcd_endpoints):
                host, _, port = ep.rpartition(":")
                proxy = FaultProxy(host, int(port), name=f"{p}->etcd{i}", dial=self.dial)
                proxy.tap = self._tap(p, i)
                out.append(await proxy.start(sock=None if self.listen is None else self.listen()))
            self.proxies[p] = out

    def _tap(self, planner: str, member: int) -> Callable[[int, Direction, bytes], None]:
        def tap(cid: int, d: Direction, data: bytes) -> None:
            key = (planner, member, cid)
            w = self._witnesses.get(key)
            if w is None:
                w = self._witnesses[key] = WireWitness(planner, self.owners, self.on_txn, SYSTEM_CLOCK.wall_ms)
            if d is not Direction.UP:
                w.server_bytes(data)
                return
            before = w.owned_writes
            w.client_bytes(data)
            if w.owned_writes > before and planner in self._armed:
                # The planner's next write was just read and is not forwarded yet: hold it (and everything
                # after it) in every link of the planner, and let the nemesis freeze the planner, all before
                # the proxy's sender runs again (one event loop: nothing interleaves with this callback).
                for x in self.proxies[planner]:
                    x.hold("up")
                self._armed.pop(planner)()

        return tap

    def endpoints_for(self, planner: str) -> list[str]:
        return [x.address for x in self.proxies[planner]]

    async def cut(self, planner: str, direction: str, mode: str) -> str:
        for x in self.proxies[planner]:
            if mode == "reset":
                x.reset(refuse=True)
            else:
                x.stall(_DIRECTIONS[direction])
        return f"{mode} {direction} on {len(self.proxies[planner])} link(s)"

    async def flaky(self, planner: str, latency_ms: int, jitter_ms: int, drop: float) -> str:
        for x in self.proxies[planner]:
            x.set_latency(latency_ms / 1000, min(jitter_ms, latency_ms) / 1000)
            if drop:
                x.set_loss(drop)
        return f"latency {latency_ms}+-{jitter_ms} ms, {drop:.0%} of chunks late"

    def arm_freeze(self, planner: str, freeze: Callable[[], None]) -> None:
        """On the planner's next write as a partition's owner (a fenced txn: chaos/wire.py's
        `owned_writes`): hold it in the link (not forwarded) and call `freeze` at once."""
        self._armed[planner] = freeze

    def disarm(self, planner: str) -> None:
        self._armed.pop(planner, None)

    async def hold(self, planner: str) -> str:
        for x in self.proxies[planner]:
            x.hold("up")
        return "outgoing bytes held"

    async def held_bytes(self, planner: str) -> int:
        return sum(x.held[Direction.UP] for x in self.proxies.get(planner, []))

    async def drop_held(self, planner: str) -> int:
        """Throw away what the planner's links hold (F1 at a write: the planner died before its write
        left the machine): every open connection is reset, which discards its held bytes unsent, and the
        links pass new connections again. Returns how many bytes were dropped."""
        dropped = await self.held_bytes(planner)
        for x in self.proxies[planner]:
            x.reset(refuse=False)
            x.heal()
        return dropped

    async def fenced_requests(self, planner: str) -> int:
        """Txns that write the cluster's keys this planner has sent so far (its wire witnesses' count),
        held ones included: fenced ones, and unfenced ones from a planner whose fence is switched off."""
        return sum(w.writes for (p, _, _), w in self._witnesses.items() if p == planner)

    async def heal(self, planner: str) -> str:
        reset = sum(x.heal() for x in self.proxies[planner])
        return f"{reset} damaged connection(s) reset" if reset else ""

    def retarget(self, member: int, endpoint: str) -> int:
        """Point every planner's link to etcd member `member` at `endpoint` (F12: the member that replaced
        it listens elsewhere), as a DNS name or a virtual IP per member slot re-resolves in production:
        the planners' endpoint lists stay as they are and their next connection reaches the new member.
        Connections still open to the old address are reset (there is nothing behind them). Returns how
        many links moved."""
        host, _, port = endpoint.rpartition(":")
        moved = 0
        for proxies in self.proxies.values():
            if member < len(proxies):
                x = proxies[member]
                x.upstream_host, x.upstream_port = host, int(port)
                x.reset(refuse=False)
                moved += 1
        return moved

    async def close(self) -> None:
        await asyncio.gather(*(x.close() for xs in self.proxies.values() for x in xs), return_exceptions=True)
        self._witnesses.clear()
