"""The planner's gRPC server refuses a taken port instead of sharing it."""

from __future__ import annotations

from typing import cast

import grpc
import pytest

from scheduler._gen.scheduler.v1 import worker_service_pb2_grpc as wgrpc
from scheduler.dispatch.service import Dispatcher
from scheduler.server import start_server


async def test_a_second_server_on_a_taken_port_fails_instead_of_sharing_it() -> None:
    # gRPC's default SO_REUSEPORT would let both bind, and the kernel would split connections
    # between two planners (or a planner and a test's server) without an error anywhere.
    servicer = cast(Dispatcher, wgrpc.WorkerServiceServicer())  # nothing is called: only binding matters
    started: list[grpc.aio.Server] = []

    async def serve(port: int) -> int:
        server, bound = await start_server(servicer, "127.0.0.1", port)
        started.append(server)  # stopped below even if the bug is back and the second one binds
        return bound

    try:
        port = await serve(0)
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            await serve(port)
    finally:
        for s in started:
            await s.stop(None)
