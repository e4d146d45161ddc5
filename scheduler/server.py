"""The planner node's gRPC server: WorkerService, ScheduleService and AdminService, plus the
standard health service and server reflection (listing all of them) so generic tools work."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from scheduler._gen.scheduler.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    schedule_service_pb2,
    schedule_service_pb2_grpc,
    worker_service_pb2,
    worker_service_pb2_grpc,
)
from scheduler.api.admin_service import AdminService
from scheduler.api.schedule_service import ScheduleService
from scheduler.dispatch.service import Dispatcher
from scheduler.tls import ServerTls

# Big enough for a batch of assignments carrying 64 KiB payloads each.
_MAX_MESSAGE = 32 * 1024 * 1024

WORKER_SERVICE = worker_service_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name
SCHEDULE_SERVICE = schedule_service_pb2.DESCRIPTOR.services_by_name["ScheduleService"].full_name
ADMIN_SERVICE = admin_service_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name


async def start_server(
    dispatcher: Dispatcher,
    host: str,
    port: int,
    *,
    schedules: ScheduleService | None = None,
    admin: AdminService | None = None,
    tls: ServerTls | None = None,
    interceptors: Sequence[grpc.aio.ServerInterceptor[Any, Any]] = (),
) -> tuple[grpc.aio.Server, int]:
    """Serve on host:port (0: a free port), plaintext or with `tls` (its files re-read on change; with
    `require_client_cert`, every connection must present a certificate the CA bundle verifies, and the
    servicers see it in `context.auth_context()`). `interceptors`: the node's AuthInterceptor
    (scheduler/auth/interceptor.py: every call authenticated and checked against the per-method rules,
    admin and operator actions audited)."""
    server = grpc.aio.server(interceptors=list(interceptors), options=[
        ("grpc.max_receive_message_length", _MAX_MESSAGE),
        ("grpc.max_send_message_length", _MAX_MESSAGE),
        # Workers ping every 10 s so that they notice a frozen planner; let them (docs/workers.md).
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ("grpc.http2.max_ping_strikes", 0),
        # gRPC binds with SO_REUSEPORT by default: a second planner started on a taken port would not
        # fail but silently share it, the kernel splitting connections between the two. Refuse instead.
        ("grpc.so_reuseport", 0),
    ])
    worker_service_pb2_grpc.add_WorkerServiceServicer_to_server(dispatcher, server)
    names = [WORKER_SERVICE]
    if schedules is not None:
        schedule_service_pb2_grpc.add_ScheduleServiceServicer_to_server(schedules, server)
        names.append(SCHEDULE_SERVICE)
    if admin is not None:
        admin_service_pb2_grpc.add_AdminServiceServicer_to_server(admin, server)
        names.append(ADMIN_SERVICE)
    hs = health.aio.HealthServicer()  # type: ignore[attr-defined]  # re-exported at run time; stubs lag
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    reflection.enable_server_reflection((*names, reflection.SERVICE_NAME, health.SERVICE_NAME), server)
    try:
        address = f"{host}:{port}"
        bound = server.add_insecure_port(address) if tls is None else server.add_secure_port(address, tls.credentials())
    except RuntimeError as e:  # grpcio >= 1.5x raises where older versions returned 0
        raise OSError(f"cannot listen on {host}:{port}: {e}") from None
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    await server.start()
    await hs.set("", health_pb2.HealthCheckResponse.SERVING)
    for name in names:  # per-service status, so a client can probe the one it needs
        await hs.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, bound
