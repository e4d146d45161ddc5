"""What authentication and authorization cost on the API and on the worker stream, over real gRPC on
loopback, against the same server without the interceptor in the same run.

- API: sequential `GetSchedule` round trips (in-memory store) with no interceptor (the baseline), the
  interceptor with auth off, a static token, a JWT (ES256) with the verified-token cache off (verified on
  every call) and on (verified once: scheduler/auth/jwt_cache.py).
- Stream: a bidirectional stream that echoes N messages (the shape of the worker stream: the interceptor
  admits the call once, then each message passes one extra async-generator hop).

Prints the ratio of each against the baseline (median of rounds), then `JwtVerifier.verify` alone, cache off
against cache on, in the same run. `--quick`: a smoke run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import jwt
from cryptography.hazmat.primitives.asymmetric import ec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler._gen.scheduler.v1 import schedule_service_pb2 as spb
from scheduler._gen.scheduler.v1 import schedule_service_pb2_grpc as sgrpc
from scheduler.api.operations import Operations
from scheduler.api.schedule_service import ScheduleService
from scheduler.auth.access import Authz
from scheduler.auth.authn import Authenticator
from scheduler.auth.config import AuthConfig
from scheduler.auth.interceptor import AuthInterceptor
from scheduler.auth.jwt_cache import VerifiedCache
from scheduler.auth.principal import Grant, Principal, Role
from scheduler.auth.tokens import JwtSettings, JwtVerifier, StaticToken, StaticTokens, new_static_token
from scheduler.clock import SYSTEM_CLOCK
from scheduler.store.keyspace import Keyspace
from scheduler.store.ledger import Ledger
from scheduler.store.memory import MemoryKV
from scheduler.store.schedules import ScheduleStore


class NoCache(VerifiedCache):
    """Remembers nothing: every call verifies the signature (what the API did before the cache)."""

    def put(self, digest: bytes, principal: Principal, until: float) -> None:
        return None


# The echo stream is served under the worker stream's name, so it gets the worker stream's rule.
STREAM = "/scheduler.v1.WorkerService/Connect"


def _echo() -> grpc.GenericRpcHandler[bytes, bytes]:
    async def chat(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for r in requests:
            yield r
    return grpc.method_handlers_generic_handler("scheduler.v1.WorkerService",
                                                {"Connect": grpc.stream_stream_rpc_method_handler(chat)})


async def _server(kv: MemoryKV, interceptor: AuthInterceptor | None, enabled: bool) -> tuple[grpc.aio.Server, str]:
    ks = Keyspace("/b")
    store, ledger = ScheduleStore(kv, ks, 4), Ledger(ks, 4)
    ops = Operations(kv, ks, 4, store, ledger, SYSTEM_CLOCK, rpc_timeout=1.0)
    svc = ScheduleService(kv=kv, ks=ks, store=store, ledger=ledger, clock=SYSTEM_CLOCK, ops=ops, rpc_timeout=1.0,
                          authz=Authz(enabled=enabled))
    server = grpc.aio.server(interceptors=[interceptor] if interceptor else [])
    sgrpc.add_ScheduleServiceServicer_to_server(svc, server)
    server.add_generic_rpc_handlers((_echo(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def _unary(address: str, md: tuple[tuple[str, str], ...], n: int) -> float:
    async with grpc.aio.insecure_channel(address) as ch:
        stub = sgrpc.ScheduleServiceStub(ch)
        await stub.GetSchedule(spb.GetScheduleRequest(id="s1"), metadata=md)
        t0 = time.perf_counter()
        for _ in range(n):
            await stub.GetSchedule(spb.GetScheduleRequest(id="s1"), metadata=md)
        return (time.perf_counter() - t0) / n


async def _stream(address: str, md: tuple[tuple[str, str], ...], n: int) -> float:
    async with grpc.aio.insecure_channel(address) as ch:
        call = ch.stream_stream(STREAM, None, None)(metadata=md)  # type: ignore[call-arg]
        msg = b"x" * 200
        t0 = time.perf_counter()
        for _ in range(n):
            await call.write(msg)
            await call.read()
        await call.done_writing()
        return (time.perf_counter() - t0) / n


async def main(quick: bool) -> int:
    rounds, n = (2, 200) if quick else (7, 2000)
    key = ec.generate_private_key(ec.SECP256R1())
    token = new_static_token()
    import hashlib

    principal = Principal("token:bench", frozenset({Grant("t", Role.READER), Grant("*", Role.WORKER)}))
    tokens = StaticTokens([StaticToken("bench", hashlib.sha256(token.encode()).digest(), principal)])

    def verifier(cache: VerifiedCache) -> JwtVerifier:
        return JwtVerifier(JwtSettings(issuer="i", audience="a"), [(None, key.public_key())], cache=cache)
    cfg = AuthConfig(jwt=verifier(NoCache()), tokens=tokens)
    cached_cfg = AuthConfig(jwt=verifier(VerifiedCache()), tokens=tokens)
    bearer = jwt.encode({"iss": "i", "aud": "a", "sub": "b", "exp": int(time.time()) + 3600,
                         "permissions": ["t:reader", "*:worker"]}, key, algorithm="ES256")
    kv = MemoryKV()
    await ScheduleStore(kv, Keyspace("/b"), 4).create(
        _schedule(), SYSTEM_CLOCK.wall_ms())
    cases: list[tuple[str, AuthInterceptor | None, bool, tuple[tuple[str, str], ...]]] = [
        ("no interceptor (baseline)", None, False, ()),
        ("interceptor, auth off", AuthInterceptor(None), False, ()),
        ("static token", AuthInterceptor(Authenticator(cfg)), True, (("authorization", f"Bearer {token}"),)),
        ("JWT ES256, cache off", AuthInterceptor(Authenticator(cfg)), True, (("authorization", f"Bearer {bearer}"),)),
        ("JWT ES256, cached", AuthInterceptor(Authenticator(cached_cfg)), True,
         (("authorization", f"Bearer {bearer}"),)),
    ]
    servers = [(name, *(await _server(kv, ic, enabled)), md) for name, ic, enabled, md in cases]
    unary: dict[str, list[float]] = {c[0]: [] for c in cases}
    stream: dict[str, list[float]] = {c[0]: [] for c in cases}
    for _ in range(rounds):  # interleaved, so drift of the machine's load hits every case alike
        for name, _, address, md in servers:
            unary[name].append(await _unary(address, md, n))
            stream[name].append(await _stream(address, md, n))
    base_u, base_s = statistics.median(unary[cases[0][0]]), statistics.median(stream[cases[0][0]])
    print(f"{'case':28} {'GetSchedule µs':>15} {'ratio':>6} {'stream msg µs':>14} {'ratio':>6}")
    for name, *_ in cases:
        u, s = statistics.median(unary[name]), statistics.median(stream[name])
        print(f"{name:28} {u * 1e6:15.1f} {u / base_u:6.2f} {s * 1e6:14.1f} {s / base_s:6.2f}")
    off, on = verifier(NoCache()), verifier(VerifiedCache())
    direct: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(rounds):
        for name, v in (("off", off), ("on", on)):
            t0 = time.perf_counter()
            for _ in range(n):
                v.verify(bearer)
            direct[name].append((time.perf_counter() - t0) / n)
    d_off, d_on = statistics.median(direct["off"]), statistics.median(direct["on"])
    u_off, u_on = statistics.median(unary["JWT ES256, cache off"]), statistics.median(unary["JWT ES256, cached"])
    print(f"JwtVerifier.verify: cache off {d_off * 1e6:.1f} µs, cached {d_on * 1e6:.2f} µs: "
          f"{d_off / d_on:.0f}x; GetSchedule with a JWT: cache off / cached = {u_off / u_on:.2f}")
    for _, server, _, _ in servers:
        await server.stop(None)
    await kv.close()
    return 0


def _schedule() -> Any:
    from scheduler.model import Schedule

    return Schedule(id="s1", tenant="t", spec="0 0 1 1 *", worker_pool="p", task_type="x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    raise SystemExit(asyncio.run(main(ap.parse_args().quick)))
