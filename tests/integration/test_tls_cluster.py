"""A cluster secured end to end, on real processes and sockets: etcd with TLS, `--client-cert-auth` and auth
enabled (the planners' certificate CN `sched` is the etcd user, whose only role is the cluster's prefix),
two planners serving mutual TLS, a worker with its client certificate running a shell schedule. Then the
ways in that must fail: no certificate, a certificate from another CA, an expired one, plaintext, a worker
without a certificate, an etcd user without the role. Certificates come from `schedctl certs dev`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chaos.infra.etcd import EtcdCluster, TlsFiles
from chaos.infra.planners import API, PlannerSet
from chaos.infra.procs import forget, spawn
from scheduler.certs import CLIENT, issue, load_ca, write_leaf
from scheduler.client import ClientError, SchedulerClient
from scheduler.store.etcd import EtcdClient, EtcdConfig, PermissionDenied, Unavailable
from scheduler.tls import ClientTls

pytestmark = pytest.mark.etcd

SCHEDCTL = str(Path(sys.executable).parent / "schedctl")
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("SCHED_")} | {"XDG_CONFIG_HOME": "/nonexistent"}
PREFIX = f"/tls-{uuid.uuid4().hex[:8]}"


def wait(what: str, pred: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@dataclass
class Secured:
    certs: Path
    other: Path  # another CA's certificates
    etcd: EtcdCluster
    planners: PlannerSet
    addresses: dict[str, str]
    base: Path

    def f(self, name: str) -> str:
        return str(self.certs / name)

    def admin(self) -> ClientTls:
        return ClientTls(self.f("ca.crt"), self.f("admin.crt"), self.f("admin.key"))

    def cli(self, *args: str, tls: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        env = CLEAN_ENV | (tls if tls is not None else {
            "SCHED_TLS_CA_FILE": self.f("ca.crt"), "SCHED_TLS_CERT_FILE": self.f("admin.crt"),
            "SCHED_TLS_KEY_FILE": self.f("admin.key")})
        return subprocess.run([SCHEDCTL, *args, "--server", self.addresses["p1"], "--timeout", "20"], env=env,
                              capture_output=True, text=True, timeout=60, check=False)


def _etcd_auth(etcd: EtcdCluster) -> None:
    """What docs/operations.md ("etcd: TLS and authentication") tells an operator to run, as root's certificate."""
    etcd.etcdctl("user", "add", "root", "--no-password")
    etcd.etcdctl("role", "add", "sched-cluster")
    etcd.etcdctl("role", "grant-permission", "sched-cluster", "readwrite", f"{PREFIX}/", "--prefix=true")
    etcd.etcdctl("user", "add", "sched", "--no-password")
    etcd.etcdctl("user", "grant-role", "sched", "sched-cluster")
    etcd.etcdctl("user", "add", "norole", "--no-password")
    etcd.etcdctl("auth", "enable")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    base = tmp_path_factory.mktemp("secured")
    certs, other = base / "certs", base / "other"
    for d in (certs, other):
        r = subprocess.run([SCHEDCTL, "certs", "dev", str(d)], env=CLEAN_ENV, capture_output=True, text=True,
                           check=False)
        assert r.returncode == 0, r.stderr
    ca = load_ca(certs)
    yesterday = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    write_leaf(certs, "expired", *issue(ca, "admin", [CLIENT], not_before=yesterday - dt.timedelta(days=1),
                                        not_after=yesterday))
    write_leaf(certs, "norole", *issue(ca, "norole", [CLIENT]))
    etcd = EtcdCluster(base / "etcd", size=1, client_cert_auth=True,
                       tls=TlsFiles(certs / "ca.crt", certs / "etcd-server.crt", certs / "etcd-server.key",
                                    certs / "etcd-root.crt", certs / "etcd-root.key"))
    planners = None
    try:
        etcd.start()
        _etcd_auth(etcd)
        tls = {"tls_cert_file": str(certs / "planner.crt"), "tls_key_file": str(certs / "planner.key"),
               "tls_ca_file": str(certs / "ca.crt"), "etcd_ca_file": str(certs / "ca.crt"),
               "etcd_cert_file": str(certs / "etcd-client.crt"), "etcd_key_file": str(certs / "etcd-client.key")}
        planners = PlannerSet(base / "planners", etcd.endpoints, PREFIX, partitions=4, settings={**API, **tls})
        addresses = {}
        for node in ("p1", "p2"):
            _, addresses[node] = planners.start_serving(node, env=CLEAN_ENV)
        yield Secured(certs, other, etcd, planners, addresses, base)
    finally:
        if planners is not None:
            planners.close()
        etcd.close()


def _health(address: str, creds: grpc.ChannelCredentials | None) -> str:
    try:
        ch = grpc.secure_channel(address, creds) if creds is not None else grpc.insecure_channel(address)
        with ch:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(r.status))
    except grpc.RpcError as e:
        return str(e.code().name)


def _creds(certs: Path, ca: str = "ca.crt", cert: str | None = None) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=(certs / ca).read_bytes(),
        private_key=(certs / f"{cert}.key").read_bytes() if cert else None,
        certificate_chain=(certs / f"{cert}.crt").read_bytes() if cert else None)


def test_the_api_port_lets_in_only_certificates_of_its_ca(secured: Secured) -> None:
    s = secured
    for address in s.addresses.values():
        assert _health(address, _creds(s.certs, cert="admin")) == "SERVING"
        assert _health(address, _creds(s.certs, cert="worker")) == "SERVING"  # the worker port is the API port
        refused = {
            "plaintext": _health(address, None),
            "no client certificate": _health(address, _creds(s.certs)),
            "another CA's certificate": _health(address, grpc.ssl_channel_credentials(
                root_certificates=(s.certs / "ca.crt").read_bytes(),
                private_key=(s.other / "admin.key").read_bytes(),
                certificate_chain=(s.other / "admin.crt").read_bytes())),
            "an expired certificate": _health(address, _creds(s.certs, cert="expired")),
            "a server we cannot verify": _health(address, _creds(s.other, cert="admin")),
        }
        assert refused == dict.fromkeys(refused, "UNAVAILABLE"), refused


async def test_the_client_and_schedctl_over_mutual_tls(secured: Secured) -> None:
    s = secured
    async with SchedulerClient(s.addresses["p1"], tls=s.admin(), timeout=20) as c:
        status = await c.cluster_status()
        assert {p.planner.node_id for p in status.planners} == {"p1", "p2"}
    # schedctl with the files in SCHED_TLS_*, with flags, and refused without them (exit 5, UNAVAILABLE).
    assert s.cli("cluster", "status").returncode == 0
    r = s.cli("cluster", "status", "--tls-ca-file", s.f("ca.crt"), "--tls-cert-file", s.f("admin.crt"),
              "--tls-key-file", s.f("admin.key"), tls={})
    assert r.returncode == 0, r.stderr
    r = s.cli("cluster", "status", tls={"SCHED_TLS_CA_FILE": s.f("ca.crt")})
    assert r.returncode == 5, r.stderr
    r = s.cli("cluster", "status", tls={})
    assert r.returncode == 5, r.stderr
    async with SchedulerClient(s.addresses["p1"], timeout=3) as plain:
        with pytest.raises(ClientError) as e:
            await plain.cluster_status()
        assert e.value.code is grpc.StatusCode.UNAVAILABLE


def test_schedctl_health_on_the_mutual_tls_port(secured: Secured) -> None:
    """With the planner's own files in SCHED_TLS_* (its certificate is a client one too), and without."""
    s = secured
    r = subprocess.run([SCHEDCTL, "health", s.addresses["p2"]], env=CLEAN_ENV | {
        "SCHED_TLS_CA_FILE": s.f("ca.crt"), "SCHED_TLS_CERT_FILE": s.f("planner.crt"),
        "SCHED_TLS_KEY_FILE": s.f("planner.key")}, capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 0 and "SERVING" in r.stdout, r.stderr
    r = subprocess.run([SCHEDCTL, "health", s.addresses["p2"], "--timeout", "2"], env=CLEAN_ENV,
                       capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 1, r.stdout


def test_planners_probe_each_other_over_mutual_tls(secured: Secured) -> None:
    """The status fan-out and the clock guard dial peers with the planner's certificate: p2's own numbers and
    a measured clock offset reach p1's answer only if p1 -> p2 passed p2's client-certificate check."""
    s = secured

    def peer_answered() -> bool:
        r = s.cli("cluster", "status", "--json")
        if r.returncode != 0:
            return False
        st = json.loads(r.stdout)
        p2 = [p for p in st["planners"] if p["planner"]["node_id"] == "p2"]
        owners = {p.get("owner") for p in st.get("partitions", [])}
        return bool(p2) and "clock_offset" in p2[0] and owners == {"p1", "p2"}

    wait("p1 to report p2's status and clock offset, fetched over mTLS", peer_answered)


def test_a_worker_with_its_certificate_runs_work_and_one_without_is_refused(secured: Secured) -> None:
    s = secured
    out = s.base / "runs.txt"
    planners = ",".join(s.addresses.values())
    good = spawn([SCHEDCTL, "worker", "--planners", planners, "--worker-id", "w-good", "--drain-grace", "1",
                  "--allow-shell", "true", "--tls-ca-file", s.f("ca.crt"), "--tls-cert-file", s.f("worker.crt"),
                  "--tls-key-file", s.f("worker.key")], s.base / "w-good.log", env=CLEAN_ENV)
    nocert = spawn([SCHEDCTL, "worker", "--planners", planners, "--worker-id", "w-nocert", "--drain-grace", "1",
                    "--tls-ca-file", s.f("ca.crt")], s.base / "w-nocert.log", env=CLEAN_ENV)
    plain = spawn([SCHEDCTL, "worker", "--planners", planners, "--worker-id", "w-plain", "--drain-grace", "1"],
                  s.base / "w-plain.log", env=CLEAN_ENV)
    try:
        r = s.cli("schedule", "create", "--id", "tick", "--cron", "*/2 * * * * *", "--command", f"echo ok >> {out}")
        assert r.returncode == 0, r.stderr

        def runs() -> int:
            r = s.cli("exec", "list", "--schedule", "tick", "--state", "succeeded", "--limit", "0", "--json")
            return len(json.loads(r.stdout)["executions"]) if r.returncode == 0 else 0

        wait("two runs on the worker with a certificate", lambda: runs() >= 2, 90)
        st = json.loads(s.cli("cluster", "status", "--json").stdout)
        connected = {w for pool in st.get("worker_pools", []) for w in pool.get("worker_ids", [])}
        assert connected == {"w-good"}, connected
        for proc, log in ((nocert, "w-nocert.log"), (plain, "w-plain.log")):
            assert proc.poll() is None  # it keeps trying, and keeps being refused
            text = (s.base / log).read_text()
            assert "planner stream broke" in text and "planner stream open" not in text, text[-2000:]
    finally:
        for p in (good, nocert, plain):
            if p.poll() is None:
                p.kill()
                p.wait()
            forget(p.pid)
        s.cli("schedule", "delete", "tick")


async def test_etcd_refuses_other_certificates_and_users_without_the_role(secured: Secured) -> None:
    s = secured
    endpoints = s.etcd.endpoints

    def config(ca: Path = s.certs, cert: str | None = "etcd-client", cert_dir: Path | None = None) -> EtcdConfig:
        d = cert_dir or s.certs
        return EtcdConfig(endpoints=endpoints, ca_file=str(ca / "ca.crt"), read_retries=0,
                          cert_file=str(d / f"{cert}.crt") if cert else None,
                          key_file=str(d / f"{cert}.key") if cert else None)

    async with EtcdClient(config()) as sched:  # CN sched: its prefix only
        await sched.put(f"{PREFIX}/probe", b"1")
        with pytest.raises(PermissionDenied):
            await sched.put("/elsewhere/k", b"1")
    async with EtcdClient(config(cert="norole")) as norole:
        with pytest.raises(PermissionDenied):
            await norole.get(f"{PREFIX}/probe")
    for cfg in (config(cert=None), config(cert_dir=s.other, cert="etcd-client")):
        async with EtcdClient(cfg) as refused:
            with pytest.raises(Unavailable):
                await refused.get(f"{PREFIX}/probe", timeout=2.0)
    await asyncio.sleep(0)
