"""The worker process's gRPC health service: what container and Kubernetes probes ask (`schedctl health`,
a `grpc:` probe), on `health_address`.

A worker serves nothing else: it dials planners, nobody dials it. The health service answers SERVING for as
long as the process's event loop does, because the loop is what a hung worker loses. It is a liveness
answer only: a worker with no planner reachable is still healthy (restarting it would not bring a planner
back, and during a planner outage every worker would be restarted at once).
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


class HealthServer:
    def __init__(self) -> None:
        self._server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0: a free port); returns the bound port. OSError if it cannot listen."""
        # No SO_REUSEPORT (server.py says why): a second process on the same port must fail, not share it.
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        hs = health.aio.HealthServicer()  # type: ignore[attr-defined]  # re-exported at run time; stubs lag
        health_pb2_grpc.add_HealthServicer_to_server(hs, server)
        try:
            bound = server.add_insecure_port(f"{host}:{port}")
        except RuntimeError as e:  # grpcio >= 1.5x raises where older versions returned 0
            raise OSError(f"cannot listen on {host}:{port}: {e}") from None
        if bound == 0:
            raise OSError(f"cannot listen on {host}:{port}")
        await server.start()
        await hs.set("", health_pb2.HealthCheckResponse.SERVING)
        self._server, self.port = server, bound
        return bound

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=0.5)
            self._server = None
