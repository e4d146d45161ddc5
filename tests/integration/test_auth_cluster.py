"""Two planners with authorization on and mutual TLS, on real processes and sockets: etcd with TLS,
client-certificate auth and a role limited to the cluster's prefix, planners whose certificates are
principals (`[certs]`: `planner` -> system:planner, `admin` -> system:admin). Their peer probes and the
status fan-out pass each other's authorization; a certificate of the same CA without the planner role is
refused the peer call (PERMISSION_DENIED); and a third planner whose API certificate comes from another
CA is refused by its peers at the handshake, in both directions, while the first two go on answering.
Certificates come from `schedctl certs dev`.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from chaos.infra.etcd import EtcdCluster, TlsFiles
from chaos.infra.planners import API, PlannerSet
from scheduler._gen.scheduler.v1 import admin_service_pb2 as apb
from scheduler._gen.scheduler.v1 import admin_service_pb2_grpc as agrpc
from scheduler.certs import CLIENT, SERVER, issue, load_ca, write_leaf
from tests.integration.test_tls_cluster import CLEAN_ENV, SCHEDCTL, wait

pytestmark = pytest.mark.etcd

PREFIX = f"/auth-{uuid.uuid4().hex[:8]}"
AUTH = """\
[certs]
"planner" = ["system:planner"]
"admin" = ["system:admin"]
"worker" = ["default:worker"]
"""


@dataclass
class Authed:
    certs: Path
    other: Path  # another CA's certificates
    etcd: EtcdCluster
    planners: PlannerSet
    addresses: dict[str, str]
    settings: dict[str, str]

    def status(self, node: str, certs: Path | None = None) -> dict[str, dict[str, object]] | None:
        """`schedctl cluster status --json` asked of `node` as the admin of `certs`: planner id -> entry."""
        d = certs or self.certs
        env = CLEAN_ENV | {"SCHED_TLS_CA_FILE": str(d / "ca.crt"), "SCHED_TLS_CERT_FILE": str(d / "admin.crt"),
                           "SCHED_TLS_KEY_FILE": str(d / "admin.key")}
        r = subprocess.run([SCHEDCTL, "cluster", "status", "--json", "--server", self.addresses[node],
                            "--timeout", "20"], env=env, capture_output=True, text=True, timeout=60, check=False)
        if r.returncode != 0:
            return None
        return {p["planner"]["node_id"]: p for p in json.loads(r.stdout)["planners"]}


def _etcd_auth(etcd: EtcdCluster) -> None:
    """docs/security.md, "etcd": the planners' CN `sched` limited to the cluster's prefix."""
    etcd.etcdctl("user", "add", "root", "--no-password")
    etcd.etcdctl("role", "add", "sched-cluster")
    etcd.etcdctl("role", "grant-permission", "sched-cluster", "readwrite", f"{PREFIX}/", "--prefix=true")
    etcd.etcdctl("user", "add", "sched", "--no-password")
    etcd.etcdctl("user", "grant-role", "sched", "sched-cluster")
    etcd.etcdctl("auth", "enable")


@pytest.fixture(scope="module")
def authed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Authed]:
    base = tmp_path_factory.mktemp("authed")
    certs, other = base / "certs", base / "other"
    for d in (certs, other):
        r = subprocess.run([SCHEDCTL, "certs", "dev", str(d)], env=CLEAN_ENV, capture_output=True, text=True,
                           check=False)
        assert r.returncode == 0, r.stderr
    # Same CA, a planner's usages and names, but a common name [certs] does not list: a principal without roles.
    write_leaf(certs, "stranger", *issue(load_ca(certs), "stranger", [SERVER, CLIENT], sans=["127.0.0.1"]))
    (base / "auth.toml").write_text(AUTH)
    etcd = EtcdCluster(base / "etcd", size=1, client_cert_auth=True,
                       tls=TlsFiles(certs / "ca.crt", certs / "etcd-server.crt", certs / "etcd-server.key",
                                    certs / "etcd-root.crt", certs / "etcd-root.key"))
    planners = None
    try:
        etcd.start()
        _etcd_auth(etcd)
        settings = {**API, "clock_probe_interval": "0.5", "auth_file": str(base / "auth.toml"),
                    "tls_cert_file": str(certs / "planner.crt"), "tls_key_file": str(certs / "planner.key"),
                    "tls_ca_file": str(certs / "ca.crt"), "etcd_ca_file": str(certs / "ca.crt"),
                    "etcd_cert_file": str(certs / "etcd-client.crt"),
                    "etcd_key_file": str(certs / "etcd-client.key")}
        planners = PlannerSet(base / "planners", etcd.endpoints, PREFIX, partitions=4, settings=settings)
        addresses = {}
        for node in ("p1", "p2"):
            _, addresses[node] = planners.start_serving(node, env=CLEAN_ENV)
        yield Authed(certs, other, etcd, planners, addresses, settings)
    finally:
        if planners is not None:
            planners.close()
        etcd.close()


def _peer_call(address: str, certs: Path, name: str) -> str:
    """GetClusterStatus as a peer asks it (local part only), with certificate `name` of `certs`."""
    creds = grpc.ssl_channel_credentials(root_certificates=(certs / "ca.crt").read_bytes(),
                                         private_key=(certs / f"{name}.key").read_bytes(),
                                         certificate_chain=(certs / f"{name}.crt").read_bytes())
    try:
        with grpc.secure_channel(address, creds) as ch:
            agrpc.AdminServiceStub(ch).GetClusterStatus(apb.GetClusterStatusRequest(), timeout=10,
                                                        metadata=(("x-sched-local-only", "1"),))
        return "OK"
    except grpc.RpcError as e:
        return str(e.code().name)


def test_planners_with_auth_on_probe_each_other_and_fan_out_their_status(authed: Authed) -> None:
    """p1's answer holds p2's own numbers and a measured clock offset only if p1's peer call passed p2's
    mTLS handshake *and* its authorization (GetClusterStatus needs system:planner or system:admin)."""
    def both_answered() -> bool:
        st = authed.status("p1")
        return st is not None and "clock_offset" in st.get("p2", {}) and \
            sum(int(str(p.get("partitions_owned", 0))) for p in st.values()) == 4 and \
            all(int(str(p.get("partitions_owned", 0))) > 0 for p in st.values())

    wait("p1 to report p2's partitions and clock offset, fetched over mTLS with auth on", both_answered)
    for node in ("p1", "p2"):
        assert _peer_call(authed.addresses[node], authed.certs, "planner") == "OK"
        # The same CA, so the handshake passes; no role in [certs], so the call does not.
        assert _peer_call(authed.addresses[node], authed.certs, "stranger") == "PERMISSION_DENIED"
    # p2's clock guard (started second, so p1 was there for its first round) had its GetTime probe answered.
    probes = [r for r in authed.planners.planners["p2"].log_records(since_start=True)
              if r.get("event") == "clock_probe"]
    assert probes and probes[0].get("answered", 0) >= 1 and "p1" in probes[0].get("peer_offsets_ms", {}), probes


def test_a_planner_with_another_cas_certificate_is_refused_by_its_peers(authed: Authed) -> None:
    """p3 reaches etcd (its etcd client certificate is the cluster's) but serves and dials with another CA's
    planner certificate: p1 cannot verify it and p3 cannot verify p1, so neither side's status holds the
    other's numbers, and p1 logs the refused peer call, while p1 and p2 still answer each other."""
    o = authed.other
    settings = {"tls_cert_file": str(o / "planner.crt"), "tls_key_file": str(o / "planner.key"),
                "tls_ca_file": str(o / "ca.crt")}
    p3, authed.addresses["p3"] = authed.planners.start_serving("p3", settings=settings, env=CLEAN_ENV)
    try:
        assert _peer_call(authed.addresses["p1"], o, "planner") == "UNAVAILABLE"  # p3's certificate, at p1
        wait("p1 to list p3 as a member", lambda: "p3" in (authed.status("p1") or {}))
        time.sleep(2)  # a few probe rounds
        st = authed.status("p1")
        assert st is not None and "clock_offset" not in st["p3"] and "clock_offset" in st["p2"], st
        # p3 asked as an admin of its own CA: it cannot get p1's or p2's numbers either.
        theirs = authed.status("p3", certs=o)
        assert theirs is not None and not [n for n in ("p1", "p2") if "clock_offset" in theirs.get(n, {})], theirs
        logged = [r for r in authed.planners.planners["p1"].log_records(since_start=True)
                  if "peer p3 did not report its status" in str(r.get("msg", ""))]
        assert logged, "p1 says why p3 is missing from its answer"
    finally:
        p3.kill()
