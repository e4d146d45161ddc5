"""A TCP fault proxy for loopback drills: one listener on 127.0.0.1, every connection forwarded to one
upstream, with faults the runner switches while connections are open.

Used for a link (planner -> etcd, planner -> worker, etcd peer <-> peer) when network namespaces are
unavailable, and always for the flaky link F10 (latency, jitter, loss), which iptables cannot do here.

    async with FaultProxy("127.0.0.1", etcd_port, name="r1-p0->r1-etcd", seed=7) as proxy:
        planner_endpoint = proxy.address          # the port is the kernel's choice (bound to port 0)
        proxy.set_latency(0.1, 0.05)              # F10: 100 ms +- 50 ms each way, seeded
        proxy.blackhole()                         # F3 mode=drop: bytes swallowed, connections stay open
        proxy.heal()                              # pass-through again
        proxy.reset()                             # F3 mode=reset: RST every connection, refuse new ones
        windows = proxy.events                    # every change, with wall time, for faults.jsonl

Faults, per direction (`up`: client -> upstream, `down`: upstream -> client, `both`):

- **latency** `set_latency(latency_s, jitter_s)`: each chunk is held `latency +- jitter` (uniform,
  from `random.Random(seed)`, never below 0) and chunks keep their order, as netem does without
  reordering. Applies to chunks read after the change; ones already in flight keep their due time.
- **loss** `set_loss(p, retransmit_s)`: a TCP stream cannot lose bytes and stay a stream, so a "lost"
  chunk is what TCP makes of a lost segment: delivered late, after a retransmission timeout
  (`retransmit_s`, 200 ms = Linux's minimum RTO), holding up everything behind it. F10's `drop`.
- **blackhole** `blackhole()`: bytes are read and discarded (also the ones in flight); connections
  stay open; senders never block. The receiver's protocol state is then out of step with the
  sender's (HTTP/2: HPACK tables, flow-control windows, frames cut in half), so such a connection is
  useless after the fault: `heal()` resets the connections that lost bytes (`reset_damaged=True`),
  as a real partition's keepalive timeouts would, rather than leave them to fail at a random later
  moment. A partition whose connections survive intact is `stall`.
- **stall** `stall()`: nothing is read or forwarded; bytes wait in the kernel's buffers (the sender
  blocks when they fill) and flow on heal, late: TCP retransmitting across a healed partition.
  `stall("up")` or `stall("down")` is the half-open link (one direction stuck, the other works:
  F3's one-way variant), and a write sent during it may be applied after the heal.
- **refuse** `refuse()`: new connections are accepted and reset at once (RST); open ones carry on.
  The listener stays bound throughout: closing it would let another process take the port, and a
  client then sees ECONNRESET instead of ECONNREFUSED, which gRPC reports as UNAVAILABLE all the same.
- **reset** `reset()`: every open connection is closed with RST (SO_LINGER 0) on both sides, and
  (unless `refuse=False`) new ones are refused until `heal()`.
- **pass-through** `heal()`: all of the above off (`heal(direction)` clears one direction's
  latency, loss, blackhole and stall).

New connections get the faults in force: a blackholed or stalled link still completes the TCP
handshake (the proxy's listener accepts it), and then carries nothing, as a SYN that got through
and nothing after would.

Duplicate delivery (F9) is **not** done here and cannot be for gRPC: repeating bytes of an HTTP/2
stream repeats frames (a second HEADERS on a stream id is a protocol error; a repeated HPACK update
corrupts the header table; a repeated DATA frame breaks flow control and the message's length
prefix), so the connection dies with PROTOCOL_ERROR or COMPRESSION_ERROR instead of the server seeing
the request twice. Duplicating a *request* needs the gRPC layer (a client interceptor that sends the
RPC again, or a second client), which is where the catalogue puts it: the planner's assignment stream
repeats assignments itself under a test-only switch (scheduler/dispatch/duplicate.py, nemesis F9).

Counting: `stats` has connections accepted, refused, reset, failed to reach upstream, open now, and
bytes forwarded and discarded per direction. `events` records every fault change (harness wall time
in epoch ms and monotonic seconds, the action, the directions, the parameters and the resulting
state) so the runner can write fault windows from what was really done.

`close()` closes the listener and every connection and awaits every task it started.

For the runner (measured in tests/chaos/test_proxy.py with the project's etcd client, real etcd):

- The planner is the client: F3 `direction=outbound` is `up`, `inbound` is `down`. F3 `mode=drop`
  (iptables DROP: TCP retransmits, the connection resumes if it outlived the fault) is `stall()`;
  `blackhole()` is the harsher loss of bytes (the connection is reset on heal). `mode=reset` is
  `reset()`. F10 is `set_latency(latency_ms / 1000, jitter_ms / 1000)` + `set_loss(drop)`.
- The project's client calls with `wait_for_ready`, so during `reset()`/`refuse()` a unary call
  waits for a connection and fails at its **deadline** (`Unavailable` "DEADLINE_EXCEEDED" for a
  read, `OutcomeUnknown` for a write), not at once; an open stream (watch, lease keepalive) ends
  with UNAVAILABLE at once (< 2 s measured). After `heal()` it reconnects within its backoff
  (100 ms, growing to `reconnect_backoff_max`).
- A stalled link keeps its connection (gRPC's keepalive, 10 s + 5 s by default, ends it if the stall
  lasts longer); a blackholed one is reset at heal, so the client always reconnects after it.
- Every byte of a link passes through the event loop the proxy runs in: run proxies in a loop that
  is not blocked by other work, or latency grows by the loop's stalls (it is not for etcd's traffic
  of a few planners). The proxy itself is never faulted by the other faults: it belongs to the
  harness (like the sink), so it must not run inside a skewed or paused process.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["DEFAULT_RETRANSMIT_S", "Dialer", "Direction", "DirectionFaults", "FaultEvent", "FaultProxy", "ProxyStats"]

# Opens the upstream connection of one client connection: (host, port) -> streams. The default is
# asyncio.open_connection; a network-namespace run dials from the harness namespace instead (chaos/netns.py).
Dialer = Callable[[str, int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]

log = logging.getLogger(__name__)

CHUNK = 64 * 1024
QUEUE_CHUNKS = 256  # chunks held for latency per direction and connection (<= 16 MiB) before reading pauses
DEFAULT_RETRANSMIT_S = 0.2  # Linux's minimum TCP retransmission timeout
_LINGER_RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST and drops unsent data


class Direction(enum.StrEnum):
    UP = "up"  # client -> upstream
    DOWN = "down"  # upstream -> client


def _directions(direction: Direction | str) -> tuple[Direction, ...]:
    if direction == "both":
        return (Direction.UP, Direction.DOWN)
    try:
        return (Direction(direction),)
    except ValueError:
        raise ValueError(f"direction {direction!r}: expected 'up', 'down' or 'both'") from None


@dataclass
class DirectionFaults:
    """The faults in force on one direction of every connection."""

    latency_s: float = 0.0
    jitter_s: float = 0.0
    loss: float = 0.0  # probability that a chunk waits a retransmission timeout
    retransmit_s: float = DEFAULT_RETRANSMIT_S
    drop: bool = False
    stall: bool = False
    hold: bool = False  # read on, forward nothing: the bytes wait in the proxy (counted) until heal

    def delay(self, rng: random.Random) -> float:
        d = self.latency_s
        if self.jitter_s:
            d += rng.uniform(-self.jitter_s, self.jitter_s)
        if self.loss and rng.random() < self.loss:
            d += self.retransmit_s
        return max(d, 0.0)

    @property
    def clean(self) -> bool:
        return self == DirectionFaults(retransmit_s=self.retransmit_s)


@dataclass(frozen=True)
class FaultEvent:
    """One change of the proxy's faults, as done (not as planned)."""

    t_ms: int  # the harness's wall clock, epoch ms
    mono: float  # time.monotonic()
    proxy: str
    action: str  # latency, loss, blackhole, stall, refuse, reset, heal
    directions: tuple[str, ...]
    params: dict[str, Any]
    state: dict[str, Any]  # the faults in force after the change (FaultProxy.state())

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ProxyStats:
    accepted: int = 0  # connections forwarded to upstream
    refused: int = 0  # connections reset on arrival (refuse, reset)
    reset: int = 0  # open connections reset by reset() or heal(reset_damaged=True)
    upstream_failed: int = 0  # connections whose upstream could not be reached (the client got a RST)
    closed: int = 0  # connections ended, for any reason
    bytes: dict[str, int] = field(default_factory=lambda: {d.value: 0 for d in Direction})  # forwarded
    dropped: dict[str, int] = field(default_factory=lambda: {d.value: 0 for d in Direction})  # blackholed

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close with a RST rather than a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    writer.transport.abort()


class _Link:
    """One client connection and its upstream connection: two directions, each a reader task and a
    sender task joined by a queue of (due time, chunk)."""

    def __init__(self, proxy: FaultProxy, cid: int, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.cid = cid
        self.client = (reader, writer)
        self.upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.damaged = False  # lost bytes to a blackhole: its protocol state is out of step
        self.tasks: set[asyncio.Task[None]] = set()
        self._ended = asyncio.Event()
        self._pipes_done = 0

    async def run(self) -> None:
        p = self.proxy
        try:
            self.upstream = await asyncio.wait_for(p.dial(p.upstream_host, p.upstream_port), p.connect_timeout)
        except (OSError, TimeoutError) as e:
            p.stats.upstream_failed += 1
            log.info("proxy %s: upstream %s:%d unreachable: %s", p.name, p.upstream_host, p.upstream_port, e)
            _rst(self.client[1])
            return
        p.stats.accepted += 1
        (cr, cw), (ur, uw) = self.client, self.upstream
        for d, src, dst in ((Direction.UP, cr, uw), (Direction.DOWN, ur, cw)):
            q: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue(QUEUE_CHUNKS)
            self._spawn(self._read(d, src, q), f"{p.name}#{self.cid}-{d}-read")
            self._spawn(self._send(d, dst, q), f"{p.name}#{self.cid}-{d}-send")
        await self._ended.wait()

    def _spawn(self, coro: Any, name: str) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        self.proxy._track(task)

    async def _read(self, d: Direction, src: asyncio.StreamReader,
                    q: asyncio.Queue[tuple[float, bytes | None]]) -> None:
        p = self.proxy
        loop = asyncio.get_running_loop()
        last_due = 0.0
        try:
            while True:
                await p._flowing[d].wait()  # stall: leave the bytes in the kernel (the sender blocks)
                data = await src.read(CHUNK)
                if data and p.tap is not None:
                    p.tap(self.cid, d, data)
                f = p.faults[d]
                if f.hold and data:
                    p.held[d] += len(data)
                if f.drop:
                    self.damaged = True
                    if not data:
                        return  # a FIN into the blackhole: lost like the bytes (heal resets the link)
                    p.stats.dropped[d] += len(data)
                    continue
                # Never earlier than the chunk before: a stream keeps its order whatever the jitter.
                last_due = max(loop.time() + (f.delay(p._rng) if data else 0.0), last_due)
                await q.put((last_due, data or None))
                if not data:
                    return  # EOF: the sender passes it on (a half-close) after the chunks before it
        except (ConnectionError, OSError):
            self._fail()

    async def _send(self, d: Direction, dst: asyncio.StreamWriter,
                    q: asyncio.Queue[tuple[float, bytes | None]]) -> None:
        p = self.proxy
        loop = asyncio.get_running_loop()
        try:
            while True:
                due, data = await q.get()
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                await p._flowing[d].wait()
                await p._forwarding[d].wait()  # hold: the chunk waits here until heal
                if data is None:
                    if dst.can_write_eof():
                        dst.write_eof()
                    self._pipe_done()
                    return
                if p.faults[d].drop:  # in flight when the blackhole began: swallowed as well
                    p.stats.dropped[d] += len(data)
                    self.damaged = True
                    continue
                dst.write(data)
                p.stats.bytes[d] += len(data)
                await dst.drain()
        except (ConnectionError, OSError):
            self._fail()

    def _pipe_done(self) -> None:
        self._pipes_done += 1
        if self._pipes_done == 2:  # both sides half-closed: the connection is over
            self.end()

    def _fail(self) -> None:
        # One side reset or vanished: reset the other too, as a router would pass on the RST.
        self.end(rst=True)

    def end(self, *, rst: bool = False) -> None:
        if self._ended.is_set():
            return
        self._ended.set()
        for pair in (self.client, self.upstream):
            if pair is None:
                continue
            if rst:
                _rst(pair[1])
            else:
                pair[1].transport.close()
        current = asyncio.current_task()
        for t in self.tasks:
            if t is not current:
                t.cancel()

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    async def wait_tasks(self) -> None:
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)


class FaultProxy:
    """A loopback TCP proxy to `upstream_host:upstream_port` with runtime faults (module docstring)."""

    def __init__(self, upstream_host: str, upstream_port: int, *, name: str = "", seed: int = 0,
                 listen_host: str = "127.0.0.1", connect_timeout: float = 5.0, dial: Dialer | None = None) -> None:
        self.upstream_host = upstream_host
        self.dial: Dialer = dial or asyncio.open_connection
        self.upstream_port = upstream_port
        self.name = name or f"proxy->{upstream_host}:{upstream_port}"
        self.listen_host = listen_host
        self.connect_timeout = connect_timeout
        self.port = 0
        self.faults: dict[Direction, DirectionFaults] = {d: DirectionFaults() for d in Direction}
        self.refusing = False
        self.stats = ProxyStats()
        self.events: list[FaultEvent] = []
        self._rng = random.Random(seed)
        self._flowing: dict[Direction, asyncio.Event] = {}
        self._forwarding: dict[Direction, asyncio.Event] = {}  # cleared by hold(): read, do not send
        self.held: dict[Direction, int] = {d: 0 for d in Direction}  # bytes read and waiting behind a hold
        # Called with (connection id, direction, bytes) for every chunk read, before any fault applies: the
        # wire witness (chaos/wire.py) reads the traffic this way. Must be quick and must not raise.
        self.tap: Callable[[int, Direction, bytes], None] | None = None
        self._server: asyncio.Server | None = None
        self._links: dict[int, _Link] = {}
        self._tasks: set[asyncio.Task[Any]] = set()  # every task started for a connection, handlers included
        self._next_id = 0
        self._closed = False

    # ---- lifecycle ------------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """host:port to give clients instead of the upstream's."""
        return f"{self.listen_host}:{self.port}"

    @property
    def open_connections(self) -> int:
        return len(self._links)

    async def start(self, sock: socket.socket | None = None) -> FaultProxy:
        """Listen on listen_host, port 0 (the kernel's choice, read back: a port picked beforehand could be
        taken meanwhile), or on `sock`, a listening socket made elsewhere (chaos/netns.py `listen()`: a
        socket in the harness namespace); the proxy owns it from here on."""
        if self._server is not None:
            raise RuntimeError("a FaultProxy is started once")
        self._flowing = {d: asyncio.Event() for d in Direction}
        self._forwarding = {d: asyncio.Event() for d in Direction}
        self._sync_flow()  # a stall() set before start() holds from the first connection
        if sock is None:
            self._server = await asyncio.start_server(self._on_client, self.listen_host, 0)
        else:
            self._server = await asyncio.start_server(self._on_client, sock=sock)
        self.listen_host, port = self._server.sockets[0].getsockname()[:2]
        self.port = int(port)
        return self

    async def close(self) -> None:
        """Stop listening, close every connection, and wait for every task this proxy started."""
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.close()
        for link in list(self._links.values()):
            link.end()
        for t in list(self._tasks):  # handlers still connecting upstream, and every pipe
            t.cancel()
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if self._closed:
            _rst(writer)
            return
        self._track(task)
        link: _Link | None = None
        try:
            if self.refusing:
                self.stats.refused += 1
                _rst(writer)
                return
            self._next_id += 1
            link = _Link(self, self._next_id, reader, writer)
            self._links[link.cid] = link
            await link.run()
        except asyncio.CancelledError:
            pass  # close(): the link is ended below; nothing to report
        except Exception:  # never let asyncio log an unhandled callback error for one connection
            log.exception("proxy %s: connection handler failed", self.name)
        finally:
            if link is not None:
                link.end(rst=not self._closed)  # a no-op when it ended already; an error: RST both sides
                self._links.pop(link.cid, None)
                self.stats.closed += 1
                # Its pipes were cancelled by end(); close() awaits them if this wait is cut short.
                await link.wait_tasks()
            if not writer.transport.is_closing():
                writer.transport.abort()

    # ---- faults ---------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The faults in force now, JSON-ready."""
        return {"refusing": self.refusing, **{d.value: asdict(self.faults[d]) for d in Direction}}

    def _record(self, action: str, dirs: Iterable[Direction], **params: Any) -> None:
        self.events.append(FaultEvent(time.time_ns() // 1_000_000, time.monotonic(), self.name, action,
                                      tuple(d.value for d in dirs), params, self.state()))

    def _sync_flow(self) -> None:
        for d, ev in self._flowing.items():
            ev.clear() if self.faults[d].stall else ev.set()
        for d, ev in self._forwarding.items():
            ev.clear() if self.faults[d].hold else ev.set()

    def set_latency(self, latency_s: float, jitter_s: float = 0.0, *, direction: Direction | str = "both") -> None:
        """Hold each chunk `latency_s +- jitter_s` (0 turns latency off)."""
        if latency_s < 0 or jitter_s < 0:
            raise ValueError("latency and jitter are >= 0")
        dirs = _directions(direction)
        for d in dirs:
            self.faults[d].latency_s, self.faults[d].jitter_s = latency_s, jitter_s
        self._record("latency", dirs, latency_s=latency_s, jitter_s=jitter_s)

    def set_loss(self, probability: float, retransmit_s: float = DEFAULT_RETRANSMIT_S, *,
                 direction: Direction | str = "both") -> None:
        """Each chunk with this probability arrives `retransmit_s` late (a retransmitted segment)."""
        if not 0.0 <= probability <= 1.0 or retransmit_s < 0:
            raise ValueError("loss is a probability in [0, 1]; retransmit_s >= 0")
        dirs = _directions(direction)
        for d in dirs:
            self.faults[d].loss, self.faults[d].retransmit_s = probability, retransmit_s
        self._record("loss", dirs, probability=probability, retransmit_s=retransmit_s)

    def blackhole(self, direction: Direction | str = "both") -> None:
        """Swallow every byte (connections stay open); see heal() for what happens to them after."""
        dirs = _directions(direction)
        for d in dirs:
            self.faults[d].drop = True
        self._record("blackhole", dirs)

    def stall(self, direction: Direction | str = "both") -> None:
        """Forward nothing and read nothing: bytes wait and flow, late, on heal. One direction: half-open."""
        dirs = _directions(direction)
        for d in dirs:
            self.faults[d].stall = True
        self._sync_flow()
        self._record("stall", dirs)

    def hold(self, direction: Direction | str = "up") -> None:
        """Read on but forward nothing: the bytes wait in the proxy (`held`) and flow, in order, on
        heal. Unlike stall() the proxy sees them, so a caller can wait until a request is caught in
        flight (the F2 nemesis freezes a planner with its write held here)."""
        dirs = _directions(direction)
        for d in dirs:
            self.faults[d].hold = True
            self.held[d] = 0
        self._sync_flow()
        self._record("hold", dirs)

    def refuse(self, on: bool = True) -> None:
        """Reset new connections on arrival (open ones are left alone)."""
        self.refusing = on
        self._record("refuse", (), on=on)

    def reset(self, *, refuse: bool = True) -> int:
        """RST every open connection, both sides; refuse new ones until heal() unless `refuse=False`.
        Returns how many were reset."""
        links = list(self._links.values())
        for link in links:
            link.end(rst=True)
        self.stats.reset += len(links)
        if refuse:
            self.refusing = True
        self._record("reset", tuple(Direction), connections=len(links), refuse=refuse)
        return len(links)

    def heal(self, direction: Direction | str = "both", *, reset_damaged: bool = True) -> int:
        """Pass-through again (for `direction`; healing both also stops refusing). Connections that
        lost bytes to a blackhole are reset unless `reset_damaged=False`: their HTTP/2 (or any
        framed protocol's) state no longer matches the other side's. Returns how many were reset."""
        dirs = _directions(direction)
        for d in dirs:
            self.faults[d] = DirectionFaults()
        if len(dirs) == 2:
            self.refusing = False
        damaged = [link for link in self._links.values() if link.damaged] if reset_damaged else []
        for link in damaged:
            link.end(rst=True)
        self.stats.reset += len(damaged)
        self._sync_flow()
        self._record("heal", dirs, reset_damaged=len(damaged))
        return len(damaged)
