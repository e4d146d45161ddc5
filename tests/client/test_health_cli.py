"""`schedctl health` (the image's HEALTHCHECK and compose's probes) against real gRPC health servers in this
process: the worker's (scheduler/worker/health.py) and one whose status the test sets. Exit 0 only for
SERVING; every other answer, and no answer, is 1 with the reason on stderr."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from chaos.infra.ports import unused_port
from scheduler.worker.health import HealthServer
from tests.client.test_cli import schedctl


async def test_a_worker_health_server_is_serving() -> None:
    hs = HealthServer()
    port = await hs.start("127.0.0.1", 0)
    try:
        r = await schedctl("health", f"127.0.0.1:{port}")
        assert (r.rc, r.out.strip()) == (0, f"127.0.0.1:{port}: SERVING"), r.err
        assert (await schedctl("health", "-q", f"127.0.0.1:{port}")).out == ""
        # The image's HEALTHCHECK names no address: the variable moves it.
        r = await schedctl("health", env={"SCHED_HEALTHCHECK_ADDRESS": f"127.0.0.1:{port}"})
        assert r.rc == 0, r.err
        r = await schedctl("health", f"127.0.0.1:{port}", "--service", "scheduler.v1.ScheduleService")
        assert r.rc == 1 and "does not know this service" in r.err, r
    finally:
        await hs.stop()


async def test_not_serving_and_unreachable_exit_1_saying_why() -> None:
    server = grpc.aio.server()
    hs = health.aio.HealthServicer()  # type: ignore[attr-defined]
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        await hs.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        r = await schedctl("health", f"127.0.0.1:{port}")
        assert (r.rc, r.err.strip()) == (1, f"schedctl health: 127.0.0.1:{port}: NOT_SERVING")
    finally:
        await server.stop(grace=None)
    with unused_port() as closed:
        r = await schedctl("health", f"127.0.0.1:{closed}", "--timeout", "2")
    assert r.rc == 1 and "cannot reach it (UNAVAILABLE" in r.err, r
