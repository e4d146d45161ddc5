"""Certificate rotation without a restart, under grpc.aio on real sockets: the server's dynamic credentials
pick up new files at the next handshake, established streams keep their session, a client that trusts only
the new CA gets in, a half-swapped pair is not served, and a worker re-dials with its new files.

Shown to fail with the protections removed: without the key/certificate pair check in ServerTls._fetch the
half-swapped pair is loaded (reloads 2, not 1); without PlannerStream._fresh_channel the worker keeps its
old channel and is not let in after the planner restarts."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from scheduler.certs import dev_certs
from scheduler.tls import ClientTls, Dialer, ServerTls
from tests.worker.conftest import WorkerFactory
from tests.worker.fake_planner import FakePlanner


@pytest.fixture(scope="module")
def cas(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    base = tmp_path_factory.mktemp("cas")
    dirs = (base / "old", base / "new", base / "third")
    for d in dirs:
        dev_certs(d)
    return dirs


def install(src: Path, live: Path, pairs: dict[str, str]) -> None:
    """Copy certificate files into place the way a secret update does: each file replaced atomically."""
    live.mkdir(exist_ok=True)
    for source, target in pairs.items():
        tmp = live / f".{target}.tmp"
        shutil.copyfile(src / source, tmp)
        os.replace(tmp, live / target)


SERVER_FILES = {"planner.crt": "tls.crt", "planner.key": "tls.key", "ca.crt": "ca.crt"}
WORKER_FILES = {"worker.crt": "tls.crt", "worker.key": "tls.key", "ca.crt": "ca.crt"}


class HealthServer:
    def __init__(self, tls: ServerTls) -> None:
        self.tls = tls
        self.server = grpc.aio.server()
        self.hs = health.aio.HealthServicer()  # type: ignore[attr-defined]
        health_pb2_grpc.add_HealthServicer_to_server(self.hs, self.server)
        self.port = self.server.add_secure_port("127.0.0.1:0", tls.credentials())
        self.address = f"127.0.0.1:{self.port}"


@pytest.fixture
async def served(tmp_path: Path, cas: tuple[Path, Path, Path]) -> AsyncIterator[HealthServer]:
    old, _, _ = cas
    live = tmp_path / "server"
    install(old, live, SERVER_FILES)
    s = HealthServer(ServerTls(str(live / "tls.crt"), str(live / "tls.key"), str(live / "ca.crt"),
                               require_client_cert=True))
    await s.server.start()
    await s.hs.set("", health_pb2.HealthCheckResponse.SERVING)
    yield s
    await s.server.stop(None)


async def check(address: str, d: Path) -> str:
    tls = ClientTls(str(d / "ca.crt"), str(d / "admin.crt"), str(d / "admin.key"))
    try:
        async with Dialer(tls).aio_channel(address) as ch:
            r = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(r.status))
    except grpc.aio.AioRpcError as e:
        return str(e.code().name)


async def test_server_rotation_takes_new_connections_and_keeps_streams(served: HealthServer, tmp_path: Path,
                                                                       cas: tuple[Path, Path, Path]) -> None:
    old, new, third = cas
    live = tmp_path / "server"
    assert await check(served.address, old) == "SERVING"
    assert await check(served.address, new) == "UNAVAILABLE"  # trusts only the new CA: not yet

    # A long-lived stream opened before the rotation (Watch: the server streams status changes).
    tls = ClientTls(str(old / "ca.crt"), str(old / "admin.crt"), str(old / "admin.key"))
    ch = Dialer(tls).aio_channel(served.address)
    watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest())
    first = await asyncio.wait_for(watch.read(), 5)
    assert first.status == health_pb2.HealthCheckResponse.SERVING

    install(new, live, SERVER_FILES)  # the new CA's certificate, key and client CA bundle: no restart
    assert await check(served.address, new) == "SERVING"
    assert await check(served.address, old) == "UNAVAILABLE"  # the old CA no longer verifies the server
    assert served.tls.reloads == 1

    # The stream from before still works: it sees a status change made after the rotation.
    await served.hs.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    changed = await asyncio.wait_for(watch.read(), 5)
    assert changed.status == health_pb2.HealthCheckResponse.NOT_SERVING
    watch.cancel()
    await ch.close(None)
    await served.hs.set("", health_pb2.HealthCheckResponse.SERVING)

    # Half a rotation (a new certificate, the key not yet swapped) is not served: the last good pair stays.
    install(third, live, {"planner.crt": "tls.crt"})
    assert await check(served.address, new) == "SERVING"
    assert served.tls.reloads == 1
    install(third, live, {"planner.key": "tls.key", "ca.crt": "ca.crt"})  # the rest arrives
    assert await check(served.address, third) == "SERVING"
    assert served.tls.reloads == 2


async def test_a_worker_redials_with_rotated_files(tmp_path: Path, cas: tuple[Path, Path, Path],
                                                   make_worker: WorkerFactory) -> None:
    old, new, _ = cas
    server_live, worker_live = tmp_path / "server", tmp_path / "worker"
    install(old, server_live, SERVER_FILES)
    install(old, worker_live, WORKER_FILES)
    tls = ServerTls(str(server_live / "tls.crt"), str(server_live / "tls.key"), str(server_live / "ca.crt"),
                    require_client_cert=True)
    planner = await FakePlanner(tls=tls).start()
    try:
        w = make_worker([planner.address], tls_ca_file=str(worker_live / "ca.crt"),
                        tls_cert_file=str(worker_live / "tls.crt"), tls_key_file=str(worker_live / "tls.key"))
        await w.start()
        conn = await planner.conn(1)
        # The servicer sees the verified client certificate (what authorization maps to a principal).
        assert planner.identities[0]["x509_common_name"] == ["worker"]
        assert planner.identities[0]["transport_security_type"] == ["ssl"]

        install(new, server_live, SERVER_FILES)  # both sides rotate to the new CA
        install(new, worker_live, WORKER_FILES)
        await asyncio.sleep(0.3)
        assert not conn.closed  # the stream opened before the rotation goes on
        # Then the planner restarts (the connection is gone, not just the stream): the worker's next dial is a
        # new TLS handshake, which it passes only with the new files (the old CA does not verify the server).
        port = planner.port
        await planner.stop()
        planner = await FakePlanner(tls=tls, port=port).start()
        await planner.conn(1, timeout=10)
        stream = next(iter(w.streams.values()))
        assert stream.channels_made == 2
        assert planner.identities[0]["x509_common_name"] == ["worker"]
    finally:
        await planner.stop()
