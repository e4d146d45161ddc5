"""The etcd client's TLS files re-read without a restart (scheduler/store/etcd/connection.py), against a real
etcd with client-certificate auth: etcd takes the certificate's common name as the user, so which user the
client is shows which certificate it presents. A rotated certificate and key (another user, another role)
take effect on the next calls; a bad new set (a key of another certificate, a CA bundle that is not PEM, a
missing file) keeps the current one, logged, and the client keeps working. A rotated CA bundle too."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from chaos.infra.etcd import EtcdFactory, TlsFiles
from scheduler.certs import CLIENT, dev_certs, issue, load_ca, write_leaf
from scheduler.store.etcd import EtcdClient, PermissionDenied

pytestmark = pytest.mark.etcd


def install(src: Path, live: Path, pairs: dict[str, str]) -> None:
    """Each file replaced atomically, one by one, as a secret update or a cert manager does."""
    for source, target in pairs.items():
        tmp = live / f".{target}.tmp"
        shutil.copyfile(src / source, tmp)
        os.replace(tmp, live / target)


def refused(caplog: pytest.LogCaptureFixture) -> int:
    return sum(1 for r in caplog.records if getattr(r, "event", "") == "tls_reload_refused")


async def test_rotated_client_certificates_are_used_and_bad_ones_are_not(
        etcd_factory: EtcdFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    certs, live = tmp_path / "certs", tmp_path / "live"
    dev_certs(certs)
    ca = load_ca(certs)
    for user in ("first", "second"):
        write_leaf(certs, user, *issue(ca, user, [CLIENT]))
    server = etcd_factory(client_cert_auth=True, tls=TlsFiles(
        certs / "ca.crt", certs / "etcd-server.crt", certs / "etcd-server.key", certs / "etcd-root.crt",
        certs / "etcd-root.key"))
    server.etcdctl("user", "add", "root", "--no-password")
    for user in ("first", "second"):
        server.etcdctl("role", "add", user)
        server.etcdctl("role", "grant-permission", user, "readwrite", f"/{user}/", "--prefix=true")
        server.etcdctl("user", "add", user, "--no-password")
        server.etcdctl("user", "grant-role", user, user)
    server.etcdctl("auth", "enable")

    live.mkdir()
    install(certs, live, {"first.crt": "tls.crt", "first.key": "tls.key", "ca.crt": "ca.crt"})
    config = server.config(ca_file=str(live / "ca.crt"), cert_file=str(live / "tls.crt"),
                           key_file=str(live / "tls.key"), tls_reload_interval=0.0, read_retries=0)
    caplog.set_level(logging.INFO)
    async with EtcdClient(config) as etcd:
        conn = etcd._conn

        async def who() -> str:
            """The user etcd sees: the one of the two that may write its own prefix."""
            mine = []
            for user in ("first", "second"):
                try:
                    await etcd.put(f"/{user}/k", b"x", timeout=5)
                    mine.append(user)
                except PermissionDenied:
                    pass
            assert len(mine) == 1, mine
            return mine[0]

        assert await who() == "first"

        # Half a rotation: the new certificate is in place, its key not yet. Not loaded, said once.
        install(certs, live, {"second.crt": "tls.crt"})
        assert await who() == "first"
        assert await who() == "first"
        assert conn.tls_reloads == 0 and refused(caplog) == 1
        install(certs, live, {"second.key": "tls.key"})  # the rest arrives
        assert await who() == "second"
        assert conn.tls_reloads == 1

        # A CA bundle that is not PEM, then a missing key file: the current files stay.
        (live / ".ca.tmp").write_bytes(b"not a certificate")
        os.replace(live / ".ca.tmp", live / "ca.crt")
        assert await who() == "second"
        assert refused(caplog) == 2
        install(certs, live, {"ca.crt": "ca.crt"})
        (live / "tls.key").unlink()
        assert await who() == "second"
        assert refused(caplog) == 3
        install(certs, live, {"first.crt": "tls.crt", "first.key": "tls.key"})
        assert await who() == "first"
        assert conn.tls_reloads == 2
        reloaded = [r for r in caplog.records if getattr(r, "event", "") == "etcd_tls_reloaded"]
        assert len(reloaded) == 2
