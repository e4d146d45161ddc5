"""`schedctl health [ADDRESS]`: ask a planner's or a worker's gRPC health service whether it serves.

Built for container health checks (the image's HEALTHCHECK, compose) and for people: exit 0 and
`ADDRESS: SERVING`, or exit 1 and why not, on one line. Only 0 and 1: Docker reserves every other exit
code of a health check, so an unreachable address or a timeout is 1 too, with its reason. A planner
serves health on its API port (with its TLS: `--tls-*`) and, as a worker does, on the plaintext
`health_address` (scheduler/worker/health.py).

The gRPC imports are made inside `check`: this module is imported by every schedctl command for its flags.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, NamedTuple

from scheduler.cli.output import Exit

if TYPE_CHECKING:
    from scheduler.tls import ClientTls

DEFAULT_ADDRESS = "127.0.0.1:7000"  # `schedctl dev`'s API (the image sets SCHED_HEALTHCHECK_ADDRESS: 7001)
# Where the image's HEALTHCHECK (which names no address) looks when a deployment moved the port.
ADDRESS_ENV = "SCHED_HEALTHCHECK_ADDRESS"


class Answer(NamedTuple):
    healthy: bool
    message: str


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "health", help="check a planner's or worker's gRPC health service (exit 0 serving, 1 not)",
        description="Ask the standard gRPC health service at ADDRESS (a planner's API address or a worker's "
                    "health_address) whether it serves. Exit 0 when it answers SERVING, else 1 with the reason "
                    "(NOT_SERVING, unknown service, unreachable, no answer within --timeout). For container "
                    "health checks and probes.")
    p.add_argument("address", nargs="?", default=None, metavar="ADDRESS",
                   help=f"host:port (default: ${ADDRESS_ENV}, else {DEFAULT_ADDRESS})")
    p.add_argument("--service", default="", metavar="NAME",
                   help="a service name to ask about, e.g. scheduler.v1.ScheduleService (default: the server "
                        "as a whole)")
    p.add_argument("--timeout", type=float, default=3.0, metavar="SECONDS",
                   help="how long to wait for the answer (default %(default)s)")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing when healthy")
    # A planner with TLS answers health on its (mutual) TLS API port too; the image's HEALTHCHECK asks the
    # plaintext health_address instead, which needs no certificate.
    from scheduler.cli.common import add_tls_flags

    add_tls_flags(p.add_argument_group("TLS (a planner's API port with TLS on)"))
    p.set_defaults(func=run)


def check(address: str, service: str = "", timeout: float = 3.0, tls: ClientTls | None = None) -> Answer:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from scheduler.tls import Dialer

    what = f"{address}{' ' + service if service else ''}"
    try:
        with Dialer(tls).channel(address) as ch:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service),
                                                     timeout=timeout, wait_for_ready=False)
    except grpc.RpcError as e:
        code = e.code() if isinstance(e, grpc.Call) else None
        if code is grpc.StatusCode.NOT_FOUND:
            return Answer(False, f"{what}: the server does not know this service")
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return Answer(False, f"{what}: no answer within {timeout:g}s")
        if code is grpc.StatusCode.UNIMPLEMENTED:
            return Answer(False, f"{what}: no gRPC health service there")
        detail = e.details() if isinstance(e, grpc.Call) else str(e)
        return Answer(False, f"{what}: cannot reach it ({code.name if code else 'error'}: {detail})")
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
    return Answer(r.status == health_pb2.HealthCheckResponse.SERVING, f"{what}: {name}")


def run(args: argparse.Namespace) -> int:
    from scheduler.tls import client_tls

    address = args.address or os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS
    files = {k: getattr(args, k) or os.environ.get(f"SCHED_{k.upper()}") or None
             for k in ("tls_ca_file", "tls_cert_file", "tls_key_file", "tls_server_name")}
    try:
        tls = client_tls(files["tls_ca_file"], files["tls_cert_file"], files["tls_key_file"], files["tls_server_name"])
        answer = check(address, args.service, args.timeout, tls)
    except (ValueError, OSError) as e:  # Docker reserves every exit code but 0 and 1
        answer = Answer(False, f"{address}: TLS files: {e}")
    if answer.healthy:
        if not args.quiet:
            print(answer.message)
        return Exit.OK
    print(f"schedctl health: {answer.message}", file=sys.stderr)
    return Exit.FAILURE
