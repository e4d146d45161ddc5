"""TLS's cost on the worker stream path: message round trips over grpc.aio, plaintext against mutual TLS.

One process, real loopback sockets, a server and a client of each kind (the server's credentials are the
planner's: `ServerTls`, dynamic, client certificate required; the client's the worker's: `Dialer`). Two
measurements, interleaved in rounds so that the machine's load hits both alike:
  unary   one request, one answer, one after the other (an API call's transport cost);
  stream  one bidirectional stream, a message sent and its echo awaited, over and over (a worker stream's
          assignment/ack exchange); the handshake is paid once per stream, so this is the steady cost.
Messages are 512 bytes (an assignment with a small payload). Prints microseconds per round trip, the best
round of each (on a shared 2-core machine other work only ever adds time, so the fastest round is the one
closest to the path's own cost; the median is printed too), and the ratio TLS / plaintext; absolute numbers
vary with the machine, the ratios are what to compare. Handshakes are timed too: a new connection's cost
(a planner restart re-dials every worker).

    python bench/bench_tls.py            # full: 2,000 round trips per round, 15 rounds, 15 x 20 handshakes
    python bench/bench_tls.py --quick    # smoke: 300 round trips, 3 rounds, 3 x 5 handshakes
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from scheduler.certs import dev_certs
from scheduler.tls import ClientTls, Dialer, ServerTls

SERVICE = "bench.Echo"
MESSAGE = b"x" * 512


def _identity(b: bytes) -> bytes:
    return b


async def _unary(request: bytes, context: Any) -> bytes:
    return request


async def _stream(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
    async for r in requests:
        yield r


def _handler() -> grpc.GenericRpcHandler[Any, Any]:
    return grpc.method_handlers_generic_handler(SERVICE, {
        "Unary": grpc.unary_unary_rpc_method_handler(_unary, _identity, _identity),
        "Stream": grpc.stream_stream_rpc_method_handler(_stream, _identity, _identity),
    })


async def _serve(tls: ServerTls | None) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((_handler(),))
    port = server.add_insecure_port("127.0.0.1:0") if tls is None else \
        server.add_secure_port("127.0.0.1:0", tls.credentials())
    await server.start()
    return server, f"127.0.0.1:{port}"


async def _unary_rtt(ch: grpc.aio.Channel, n: int) -> float:
    call = ch.unary_unary(f"/{SERVICE}/Unary", request_serializer=_identity, response_deserializer=_identity)
    await call(MESSAGE)  # warm
    t0 = time.perf_counter()
    for _ in range(n):
        await call(MESSAGE)
    return (time.perf_counter() - t0) / n


async def _stream_rtt(ch: grpc.aio.Channel, n: int) -> float:
    method: Any = ch.stream_stream(f"/{SERVICE}/Stream", request_serializer=_identity,
                                   response_deserializer=_identity)
    call = method()  # no request iterator: written to with call.write()
    await call.write(MESSAGE)
    await call.read()
    t0 = time.perf_counter()
    for _ in range(n):
        await call.write(MESSAGE)
        await call.read()
    elapsed = time.perf_counter() - t0
    await call.done_writing()
    return elapsed / n


async def _handshake(dial: Dialer, address: str, n: int) -> float:
    """A new channel's first call: connect (and TLS handshake) plus one round trip."""
    total = 0.0
    for _ in range(n):
        t0 = time.perf_counter()
        async with dial.aio_channel(address) as ch:
            call = ch.unary_unary(f"/{SERVICE}/Unary", request_serializer=_identity, response_deserializer=_identity)
            await call(MESSAGE)
        total += time.perf_counter() - t0
    return total / n


async def main(n: int, rounds: int, handshakes: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        dev_certs(d)
        f = {k: str(d / k) for k in ("planner.crt", "planner.key", "ca.crt", "worker.crt", "worker.key")}
        plain_server, plain_addr = await _serve(None)
        tls_server, tls_addr = await _serve(ServerTls(f["planner.crt"], f["planner.key"], f["ca.crt"],
                                                      require_client_cert=True))
        plain, secure = Dialer(), Dialer(ClientTls(f["ca.crt"], f["worker.crt"], f["worker.key"]))
        out: dict[str, list[float]] = {}
        try:
            async with plain.aio_channel(plain_addr) as pch, secure.aio_channel(tls_addr) as sch:
                for _ in range(rounds):
                    for name, ch in (("plaintext", pch), ("tls", sch)):
                        out.setdefault(f"unary {name}", []).append(await _unary_rtt(ch, n))
                        out.setdefault(f"stream {name}", []).append(await _stream_rtt(ch, n))
            for _ in range(rounds):
                for name, dial, addr in (("plaintext", plain, plain_addr), ("tls", secure, tls_addr)):
                    out.setdefault(f"connect {name}", []).append(await _handshake(dial, addr, handshakes))
        finally:
            await plain_server.stop(None)
            await tls_server.stop(None)
    best = {k: min(v) for k, v in out.items()}
    med = {k: statistics.median(v) for k, v in out.items()}
    for kind in ("unary", "stream", "connect"):
        p, t = best[f"{kind} plaintext"], best[f"{kind} tls"]
        mp, mt = med[f"{kind} plaintext"], med[f"{kind} tls"]
        print(f"{kind:8s} plaintext {p * 1e6:8.1f} us   mTLS {t * 1e6:8.1f} us   ratio {t / p:5.2f}   "
              f"(medians {mp * 1e6:.1f} / {mt * 1e6:.1f} us, ratio {mt / mp:.2f})")
    return best


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run (ratios only meaningful roughly)")
    a = ap.parse_args()
    if a.quick:
        asyncio.run(main(300, 3, 5))
    else:
        asyncio.run(main(2_000, 15, 20))
