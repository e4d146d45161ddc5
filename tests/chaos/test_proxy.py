"""chaos/proxy.py: every fault on a plain TCP echo server, and gRPC (the project's etcd client against a
real etcd) through the proxy: intact under latency, timing out in a blackhole, working after heal,
UNAVAILABLE on reset and reconnecting after it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import grpc
import pytest

from chaos.infra.etcd import EtcdCluster
from chaos.infra.ports import unused_port
from chaos.proxy import Direction, FaultProxy
from scheduler.store.etcd import EtcdClient, OutcomeUnknown, Unavailable, _pb

T = TypeVar("T")


class Echo:
    """An echo server on 127.0.0.1:0 that also keeps what it received."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.append(w)
        with contextlib.suppress(ConnectionError, OSError, asyncio.CancelledError):
            while data := await r.read(65536):
                self.received += data
                w.write(data)
                await w.drain()
            w.write_eof()  # half-close answered by a half-close: the proxy must pass EOF both ways
        self._tasks.discard(task)

    async def __aenter__(self) -> Echo:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for w in self._writers:
            w.transport.abort()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@asynccontextmanager
async def echo_proxy(**options: object) -> AsyncIterator[tuple[Echo, FaultProxy]]:
    async with Echo() as echo, FaultProxy("127.0.0.1", echo.port, name="test", **options) as proxy:  # type: ignore[arg-type]
        yield echo, proxy
    # No task of the proxy outlives close(): the only one left is the test's own.
    assert {t for t in asyncio.all_tasks() if not t.done()} == {asyncio.current_task()}


async def connect(proxy: FaultProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", proxy.port)


async def roundtrip(r: asyncio.StreamReader, w: asyncio.StreamWriter, data: bytes, timeout: float = 5.0) -> bytes:
    w.write(data)
    await w.drain()
    return await asyncio.wait_for(r.readexactly(len(data)), timeout)


async def nothing_arrives(r: asyncio.StreamReader, within: float = 0.3) -> bool:
    try:
        data = await asyncio.wait_for(r.read(1), within)
    except TimeoutError:
        return True
    raise AssertionError(f"expected silence, got {data!r}")


def close(w: asyncio.StreamWriter) -> None:
    w.transport.abort()


# ---- plain TCP ---------------------------------------------------------------------------------------


async def test_pass_through_counts_bytes_and_connections() -> None:
    async with echo_proxy() as (_, proxy):
        assert proxy.port != 0 and proxy.address == f"127.0.0.1:{proxy.port}"
        r, w = await connect(proxy)
        payload = bytes(range(256)) * 4096  # 1 MiB: several chunks, order must hold
        assert await roundtrip(r, w, payload) == payload
        w.write_eof()  # a half-close travels through and comes back as the echo's half-close
        assert await asyncio.wait_for(r.read(), 5) == b""
        close(w)
        for _ in range(100):
            if proxy.open_connections == 0:
                break
            await asyncio.sleep(0.01)
        assert proxy.stats.accepted == 1 and proxy.stats.closed == 1 and proxy.open_connections == 0
        assert proxy.stats.bytes == {"up": len(payload), "down": len(payload)}
        assert proxy.stats.dropped == {"up": 0, "down": 0}


async def test_latency_and_jitter_keep_order_and_change_on_open_connections() -> None:
    async with echo_proxy(seed=3) as (_, proxy):
        r, w = await connect(proxy)
        t0 = time.monotonic()
        await roundtrip(r, w, b"x")
        fast = time.monotonic() - t0

        proxy.set_latency(0.1, direction="up")  # on the open connection
        proxy.set_latency(0.05, direction="down")
        t0 = time.monotonic()
        await roundtrip(r, w, b"y")
        slow = time.monotonic() - t0
        assert slow >= 0.15 > fast

        proxy.set_latency(0.03, 0.03)  # jitter as large as the latency: order must hold regardless
        messages = [f"{i:04d}".encode() for i in range(100)]
        for m in messages:
            w.write(m)
            await asyncio.sleep(0.001)
        got = await asyncio.wait_for(r.readexactly(400), 10)
        assert got == b"".join(messages)

        proxy.heal()
        t0 = time.monotonic()
        await roundtrip(r, w, b"z")
        assert time.monotonic() - t0 < slow  # the latency is gone (relative: a busy CI machine is slow anyway)
        close(w)
        assert [e.action for e in proxy.events] == ["latency", "latency", "latency", "heal"]
        assert proxy.events[0].directions == ("up",) and proxy.events[0].state["up"]["latency_s"] == 0.1
        assert all(abs(e.t_ms - time.time() * 1000) < 60_000 for e in proxy.events)


async def test_loss_delays_by_a_retransmission_timeout() -> None:
    async with echo_proxy() as (_, proxy):
        r, w = await connect(proxy)
        proxy.set_loss(1.0, 0.2, direction="down")
        t0 = time.monotonic()
        assert await roundtrip(r, w, b"late") == b"late"
        assert time.monotonic() - t0 >= 0.2
        close(w)


async def test_blackhole_swallows_bytes_keeps_the_connection_and_heal_resets_it() -> None:
    async with echo_proxy() as (echo, proxy):
        r, w = await connect(proxy)
        assert await roundtrip(r, w, b"before") == b"before"

        proxy.blackhole(direction="down")  # echo gets it, its answer is swallowed
        w.write(b"one")
        assert await nothing_arrives(r)
        assert bytes(echo.received).endswith(b"one") and proxy.stats.dropped["down"] == 3

        proxy.blackhole()  # both ways: echo gets nothing more either
        w.write(b"two")
        assert await nothing_arrives(r)
        assert not bytes(echo.received).endswith(b"two") and proxy.stats.dropped["up"] == 3
        assert proxy.open_connections == 1  # open all along: a partition, not a close

        r2, w2 = await connect(proxy)  # a new connection during the blackhole carries nothing either
        w2.write(b"new")
        assert await nothing_arrives(r2, 0.2)
        close(w2)

        assert proxy.heal() >= 1  # lost bytes: the connection is out of step, so it is reset
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(r.read(10), 5)
        r, w = await connect(proxy)
        assert await roundtrip(r, w, b"after") == b"after"
        close(w)


async def test_blackhole_heal_without_reset_keeps_the_connection() -> None:
    async with echo_proxy() as (_, proxy):
        r, w = await connect(proxy)
        proxy.blackhole("up")
        w.write(b"lost")
        assert await nothing_arrives(r)
        assert proxy.heal(reset_damaged=False) == 0
        assert await roundtrip(r, w, b"kept") == b"kept"
        close(w)


async def test_stall_holds_bytes_and_delivers_them_on_heal() -> None:
    async with echo_proxy() as (echo, proxy):
        r, w = await connect(proxy)
        proxy.stall("up")  # half-open: the client's bytes are stuck, nothing is lost
        w.write(b"held")
        assert await nothing_arrives(r)
        assert b"held" not in echo.received
        proxy.heal()
        assert await asyncio.wait_for(r.readexactly(4), 5) == b"held"  # delivered late, intact

        proxy.stall("down")  # the other half: echo receives, the answer waits
        w.write(b"back")
        assert await nothing_arrives(r)
        for _ in range(100):
            if bytes(echo.received).endswith(b"back"):
                break
            await asyncio.sleep(0.01)
        assert bytes(echo.received).endswith(b"back")
        assert proxy.heal() == 0  # nothing was lost, nothing is reset
        assert await asyncio.wait_for(r.readexactly(4), 5) == b"back"
        close(w)


async def test_reset_discards_held_bytes_unsent() -> None:
    """What ProxyLinks.drop_held relies on (F1 `at = "write"`): bytes caught by a hold and then reset never
    reach the server, not even after the heal, and new connections pass again."""
    async with echo_proxy() as (echo, proxy):
        r, w = await connect(proxy)
        assert await roundtrip(r, w, b"before") == b"before"
        proxy.hold("up")
        w.write(b"doomed-write")
        for _ in range(200):
            if proxy.held[Direction.UP] >= len(b"doomed-write"):
                break
            await asyncio.sleep(0.01)
        assert proxy.held[Direction.UP] == len(b"doomed-write")
        assert proxy.reset(refuse=False) == 1
        proxy.heal()
        await asyncio.sleep(0.2)
        assert b"doomed" not in echo.received
        close(w)
        r2, w2 = await connect(proxy)
        assert await roundtrip(r2, w2, b"after") == b"after"
        assert b"doomed" not in echo.received
        close(w2)


async def test_refuse_resets_new_connections_only() -> None:
    async with echo_proxy() as (_, proxy):
        r, w = await connect(proxy)
        proxy.refuse()
        r2, w2 = await connect(proxy)  # the handshake completes (the listener stays bound); then RST
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(r2.read(10), 5)
        close(w2)
        assert await roundtrip(r, w, b"still") == b"still"
        proxy.refuse(False)
        r3, w3 = await connect(proxy)
        assert await roundtrip(r3, w3, b"again") == b"again"
        close(w)
        close(w3)
        assert proxy.stats.refused == 1


async def test_reset_sends_rst_and_refuses_until_heal() -> None:
    async with echo_proxy() as (_, proxy):
        r, w = await connect(proxy)
        assert await roundtrip(r, w, b"a") == b"a"
        assert proxy.reset() == 1
        with pytest.raises(ConnectionResetError):  # RST (SO_LINGER 0), not a clean EOF
            await asyncio.wait_for(r.read(10), 5)
        r2, _ = await connect(proxy)
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(r2.read(10), 5)
        proxy.heal()
        r3, w3 = await connect(proxy)
        assert await roundtrip(r3, w3, b"b") == b"b"
        close(w3)
        assert proxy.stats.reset == 1 and proxy.stats.refused == 1
        assert [e.action for e in proxy.events] == ["reset", "heal"]


async def test_unreachable_upstream_resets_the_client() -> None:
    with unused_port() as port:
        async with FaultProxy("127.0.0.1", port) as proxy:
            r, w = await connect(proxy)
            with pytest.raises(ConnectionResetError):
                await asyncio.wait_for(r.read(10), 5)
            close(w)
            assert proxy.stats.upstream_failed == 1


async def test_close_ends_every_connection_and_task() -> None:
    async with Echo() as echo:
        proxy = await FaultProxy("127.0.0.1", echo.port).start()
        conns = [await connect(proxy) for _ in range(3)]
        for r, w in conns:
            await roundtrip(r, w, b"hi")
        proxy.set_latency(0.5)
        conns[0][1].write(b"in flight")  # queued behind latency when close() comes
        proxy.stall("up")
        await asyncio.sleep(0.05)
        await proxy.close()
        for r, w in conns:
            assert await asyncio.wait_for(r.read(), 5) == b""  # closed by the proxy
            close(w)
        assert {t for t in asyncio.all_tasks() if not t.done()} == {asyncio.current_task()}
        with pytest.raises(ConnectionRefusedError):  # the listener is gone too
            await asyncio.open_connection("127.0.0.1", proxy.port)


# ---- gRPC: the project's etcd client through the proxy --------------------------------------------


@pytest.mark.etcd
async def test_etcd_client_through_the_proxy(etcd_server: EtcdCluster, key_prefix: str) -> None:
    member = etcd_server.members[0]
    async with FaultProxy("127.0.0.1", member.client_port, name="client->etcd", seed=1) as proxy:
        config = etcd_server.config(endpoints=(proxy.address,), timeout=2.0, keepalive_time=1.0,
                                    keepalive_timeout=1.0)
        async with EtcdClient(config) as etcd:
            key = f"{key_prefix}k".encode()
            await etcd.put(key, b"v0")
            assert await value(etcd, key) == b"v0"

            # Latency with jitter: HTTP/2 framing survives, a large value comes back byte for byte.
            proxy.set_latency(0.05, 0.02)
            big = bytes(range(256)) * 4096
            t0 = time.monotonic()
            await etcd.put(key, big)
            assert await value(etcd, key) == big
            assert time.monotonic() - t0 >= 0.2  # two round trips, >= 2 x 2 x (0.05 - 0.02)
            proxy.heal()

            # Blackhole: a read times out (Unavailable), a write's outcome is unknown.
            proxy.blackhole()
            t0 = time.monotonic()
            with pytest.raises(Unavailable):
                await etcd.get(key, timeout=0.5)
            assert time.monotonic() - t0 < 3
            with pytest.raises(OutcomeUnknown):
                await etcd.put(key, b"during", timeout=0.5)
            proxy.heal()  # resets the damaged connection: the client reconnects
            # The write sent into the blackhole never reached etcd (its bytes were swallowed).
            assert await eventually(lambda: value(etcd, key, timeout=1.0)) == big

            # Stall (a partition TCP survives): the read times out, and after heal the very same
            # connection carries on: nothing was lost, nothing is reset.
            accepted = proxy.stats.accepted
            proxy.stall()
            with pytest.raises(Unavailable):
                await etcd.get(key, timeout=0.5)
            assert proxy.heal() == 0
            assert await value(etcd, key, timeout=2.0) == big
            assert proxy.stats.accepted == accepted

            # Reset and refuse. The project's client calls with wait_for_ready (it rides out a
            # reconnect within its deadline), so a unary call sees the deadline, not UNAVAILABLE.
            proxy.reset()
            t0 = time.monotonic()
            with pytest.raises(Unavailable, match="DEADLINE_EXCEEDED"):
                await etcd.get(key, timeout=0.5)
            assert time.monotonic() - t0 < 3
            proxy.heal()
            await eventually(lambda: etcd.put(key, b"v1", timeout=1.0))
            assert await value(etcd, key) == b"v1"

            # What gRPC itself reports, on a raw channel: an open stream the server has answered
            # ends with UNAVAILABLE at once when its connection is reset, and a call without
            # wait_for_ready fails with UNAVAILABLE while connections are refused.
            channel = grpc.aio.insecure_channel(proxy.address)
            try:
                stubs = _pb.Stubs(channel)
                lease = await etcd.lease_grant(30)
                call = stubs.lease.LeaseKeepAlive()
                await call.write(_pb.lease_keepalive_request(lease.id))
                ack = await asyncio.wait_for(call.read(), 5)
                acked: int = ack.ID  # (a protobuf field, not a constant)
                assert acked == lease.id
                t0 = time.monotonic()
                proxy.reset()
                with pytest.raises(grpc.aio.AioRpcError) as stream_err:
                    await asyncio.wait_for(call.read(), 5)
                assert stream_err.value.code() == grpc.StatusCode.UNAVAILABLE
                assert time.monotonic() - t0 < 2
                with pytest.raises(grpc.aio.AioRpcError) as call_err:
                    await stubs.lease.LeaseTimeToLive(_pb.lease_ttl_request(lease.id, False), timeout=3)
                assert call_err.value.code() == grpc.StatusCode.UNAVAILABLE
                proxy.heal()
                # ... and reconnects once the link is back (backoff from 100 ms).
                ttl = await eventually(lambda: etcd.lease_time_to_live(lease.id, timeout=1.0))
                assert ttl.ttl > 0
            finally:
                await channel.close(None)
            assert proxy.stats.accepted >= 2 and proxy.stats.reset >= 1
            print(f"proxy stats: {proxy.stats.to_json()}")
            print(f"proxy events: {[(e.action, e.directions) for e in proxy.events]}")


async def value(etcd: EtcdClient, key: bytes, timeout: float | None = None) -> bytes:
    kv = await etcd.get(key, timeout=timeout)
    assert kv is not None, key
    return kv.value


async def eventually(call: Callable[[], Awaitable[T]], timeout: float = 10.0) -> T:
    """`call()` until it stops raising Unavailable (the client reconnecting after a heal)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()
        except Unavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)
