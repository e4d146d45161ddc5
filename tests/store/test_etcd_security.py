"""Username/password auth (with re-authentication) and TLS / mutual TLS, against real etcd."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from chaos.infra.etcd import EtcdCluster, EtcdFactory, TlsFiles, make_tls_files
from scheduler.store.etcd import EtcdClient, PermissionDenied, Unauthenticated, Unavailable

pytestmark = pytest.mark.etcd


def _enable_auth(server: EtcdCluster) -> None:
    server.etcdctl("user", "add", "root:rootpw")
    server.etcdctl("role", "add", "app")
    server.etcdctl("role", "grant-permission", "app", "readwrite", "/app/", "--prefix=true")
    server.etcdctl("user", "add", "alice:alicepw")
    server.etcdctl("user", "grant-role", "alice", "app")
    server.etcdctl("auth", "enable")


async def test_password_auth_and_reauthentication(etcd_factory: EtcdFactory) -> None:
    # Simple tokens expire after --auth-token-ttl seconds without use: 1 s lets us see a re-auth.
    server = etcd_factory(auth_token_ttl=1)
    _enable_auth(server)

    async with EtcdClient(server.config(username="alice", password="alicepw")) as etcd:
        assert etcd.authentications == 1
        await etcd.put("/app/k", b"1")
        with pytest.raises(PermissionDenied):
            await etcd.put("/other/k", b"1")
        lease = await etcd.lease_grant(5)
        keeper = etcd.keep_alive(lease, safety_margin=1.0)
        async with etcd.watch("/app/", prefix=True, start_revision=1) as watcher:
            first = await asyncio.wait_for(anext(watcher), 5)
            assert first.events[0].kv.key == b"/app/k"
        assert keeper.alive()
        await keeper.stop()

        # (Counted from here: on a slow box the 1 s token may also have expired in the steps above.)
        before = etcd.authentications
        await asyncio.sleep(2.5)  # let the token expire on the server
        kv = await etcd.get("/app/k")  # rejected once as "invalid auth token", then re-authenticated
        assert kv is not None
        assert etcd.authentications == before + 1

    with pytest.raises(Unauthenticated):
        async with EtcdClient(server.config(username="alice", password="wrong")):
            pass
    async with EtcdClient(server.config()) as anonymous:
        with pytest.raises(Unauthenticated):
            await anonymous.put("/app/k", b"2")


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


async def test_tls_server_verified_with_our_ca(etcd_factory: EtcdFactory, tls_files: TlsFiles,
                                               tmp_path: Path) -> None:
    server = etcd_factory(tls=tls_files)
    async with EtcdClient(server.config()) as etcd:
        assert etcd.config.use_tls
        await etcd.put("k", b"over tls")
        assert (await etcd.status()).version.startswith("3.")

    other_ca = make_tls_files(tmp_path / "other")
    unverifiable = {"ca_file": str(other_ca.ca)}  # a server certificate we cannot verify
    plaintext = {"ca_file": None, "tls": False}  # plaintext against a TLS port
    for overrides in (unverifiable, plaintext):
        async with EtcdClient(server.config(read_retries=0, **overrides)) as etcd:
            with pytest.raises(Unavailable):
                await etcd.get("k", timeout=1.0)


async def test_mutual_tls_requires_a_client_certificate(etcd_factory: EtcdFactory, tls_files: TlsFiles) -> None:
    server = etcd_factory(tls=tls_files, client_cert_auth=True)
    async with EtcdClient(server.config()) as etcd:
        assert etcd.config.cert_file is not None
        await etcd.put("k", b"mtls")
        kv = await etcd.get("k")
        assert kv is not None
        assert kv.value == b"mtls"
    async with EtcdClient(server.config(cert_file=None, key_file=None, read_retries=0)) as no_cert:
        with pytest.raises(Unavailable):
            await no_cert.get("k", timeout=1.0)

