"""chaos/netns.py with real namespaces, a real etcd inside one and clients in another or in the harness.

What these show: a request across the run's network works, a cut makes it time out (or fail at once in
reset mode) and heal brings it back; one-way cuts do what the module docstring says to TCP (inbound:
the request lands, the answer is lost; outbound: nothing lands); teardown leaves no namespace, host
interface, host rule or lock file; two runs at once neither collide nor reach each other; leftovers of a
killed run are found and removed without touching a live run.

Ports inside our namespaces are private to them (no other process on the machine can bind there), so
etcd listens on fixed ports 2379/2380 at its node's address: nothing can take them between pick and bind.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos import netns
from chaos.infra.etcd import find_binary
from chaos.infra.procs import forget, spawn
from chaos.netns import HARNESS, NetTopology, available, cleanup_stale, list_namespaces
from scheduler.store.etcd import EtcdClient, EtcdConfig
from scheduler.topology import Topology

OK, WHY = available()
needs_netns = pytest.mark.skipif(not OK, reason=f"network namespaces unavailable: {WHY}")

CLIENT_PORT = 2379
TIMEOUT_S = 1.0  # a cut request counts as timed out after this


def small() -> Topology:
    # a-e1 (etcd), a-p1, b-e1, b-p1: etcd in region a, a client node in region b.
    return Topology.from_counts(["a", "b"], etcd_per_region=1, planners_per_region=1, workers_per_region=0)


# ---- helpers: etcd in a namespace, HTTP over a namespace socket ------------------------------------------


def start_etcd(net: NetTopology, node: str, binary: str, base: Path) -> subprocess.Popen[bytes]:
    a = net.addr(node)
    argv = [*net.prefix(node), binary, f"--name={node}", f"--data-dir={base / node}.etcd",
            f"--listen-client-urls=http://{a}:{CLIENT_PORT}", f"--advertise-client-urls=http://{a}:{CLIENT_PORT}",
            f"--listen-peer-urls=http://{a}:2380", f"--initial-advertise-peer-urls=http://{a}:2380",
            f"--initial-cluster={node}=http://{a}:2380", "--log-level=warn", "--unsafe-no-fsync"]
    proc = spawn(argv, base / f"{node}.log")
    deadline = time.monotonic() + 20
    while True:
        assert proc.poll() is None, (base / f"{node}.log").read_text()
        try:
            with Http(net, HARNESS, a) as h:
                if h.get("/health").get("health") == "true":
                    return proc
        except OSError:
            pass
        assert time.monotonic() < deadline, "etcd in the namespace never became healthy"
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    forget(proc.pid)


class Http:
    """HTTP/1.1 keep-alive over one TCP connection made in a node's namespace (etcd's JSON gateway), so a
    test can cut an ESTABLISHED connection and see what reaches the server."""

    def __init__(self, net: NetTopology, node: str, host: str, port: int = CLIENT_PORT) -> None:
        self.sock = net.open_socket(node)
        self.sock.settimeout(TIMEOUT_S)
        self.host = host
        try:
            self.sock.connect((host, port))
        except BaseException:
            self.sock.close()
            raise
        self.buf = b""

    def __enter__(self) -> Http:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def request(self, method: str, path: str, body: dict[str, str] | None = None) -> dict[str, object]:
        data = json.dumps(body).encode() if body is not None else b""
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n")
        self.sock.sendall(head.encode() + data)
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        header, self.buf = self.buf.split(b"\r\n\r\n", 1)
        length = next(int(line.split(b":")[1]) for line in header.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        while len(self.buf) < length:
            self._fill()
        out, self.buf = self.buf[:length], self.buf[length:]
        return dict(json.loads(out))

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        self.buf += chunk

    def get(self, path: str) -> dict[str, object]:
        return self.request("GET", path)

    def put(self, key: str, value: str) -> dict[str, object]:
        return self.request("POST", "/v3/kv/put", {"key": b64(key), "value": b64(value)})

    def value(self, key: str) -> str | None:
        kvs = self.request("POST", "/v3/kv/range", {"key": b64(key)}).get("kvs")
        return base64.b64decode(kvs[0]["value"]).decode() if isinstance(kvs, list) and kvs else None


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def etcdctl(net: NetTopology, node: str, *args: str) -> subprocess.CompletedProcess[str]:
    binary = find_binary("etcdctl")
    assert binary is not None
    argv = [*net.prefix(node), binary, f"--endpoints=http://{net.addr('a-e1')}:{CLIENT_PORT}",
            f"--dial-timeout={TIMEOUT_S}s", f"--command-timeout={TIMEOUT_S}s", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, env={**os.environ, "ETCDCTL_API": "3"})


def host_state() -> tuple[list[str], str, str]:
    """What a run must never change in the host namespace: its interfaces and its netfilter rules."""
    links = sorted(line.split(":")[1].strip().split("@")[0]
                   for line in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True,
                                              check=True).stdout.splitlines())
    rules = subprocess.run(["iptables", "-S"], capture_output=True, text=True, check=True).stdout
    nat = subprocess.run(["iptables", "-t", "nat", "-S"], capture_output=True, text=True, check=True).stdout
    return links, rules, nat


# ---- fixtures -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def net() -> Iterator[NetTopology]:
    if not OK:
        pytest.skip(f"network namespaces unavailable: {WHY}")
    with NetTopology(small()) as n:
        yield n


@pytest.fixture(scope="module")
def etcd_in_a(net: NetTopology, etcd_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc = start_etcd(net, "a-e1", etcd_binary, tmp_path_factory.mktemp("netns-etcd"))
    try:
        yield net.addr("a-e1")
    finally:
        stop(proc)


@pytest.fixture
def healed(net: NetTopology) -> Iterator[NetTopology]:
    try:
        yield net
    finally:
        net.heal_all()


# ---- cut and heal ---------------------------------------------------------------------------------------------


@pytest.mark.etcd
def test_cut_makes_requests_time_out_and_heal_brings_them_back(healed: NetTopology, etcd_in_a: str) -> None:
    net = healed
    assert etcdctl(net, "b-p1", "put", "/netns/k", "1").returncode == 0

    cut = net.cut("b-p1", "a-e1", CLIENT_PORT)
    assert len(net.rules("b-p1")) == 2 and net.rules("a-e1") == []  # rules live in the source's namespace
    t0 = time.monotonic()
    r = etcdctl(net, "b-p1", "put", "/netns/k", "2")
    assert r.returncode != 0 and "deadline" in r.stderr.lower() + r.stdout.lower(), r.stderr
    assert time.monotonic() - t0 >= TIMEOUT_S * 0.9  # a timeout, not a refusal
    # The harness is outside every fault, and a cut of b-p1 is not a cut of anyone else.
    assert etcdctl(net, HARNESS, "get", "/netns/k", "--print-value-only").stdout.strip() == "1"
    assert etcdctl(net, "a-p1", "put", "/netns/other", "x").returncode == 0

    net.heal(cut)
    assert net.rules("b-p1") == []
    assert etcdctl(net, "b-p1", "put", "/netns/k", "3").returncode == 0
    assert etcdctl(net, HARNESS, "get", "/netns/k", "--print-value-only").stdout.strip() == "3"


@pytest.mark.etcd
def test_reset_mode_fails_at_once(healed: NetTopology, etcd_in_a: str) -> None:
    net = healed
    net.cut("b", "a", mode="reset")  # regions: every node of b from every node of a, all traffic
    t0 = time.monotonic()
    with pytest.raises(ConnectionRefusedError):
        Http(net, "b-p1", etcd_in_a)
    assert time.monotonic() - t0 < TIMEOUT_S / 2
    net.heal_all()
    with Http(net, "b-p1", etcd_in_a) as h:
        assert h.get("/health")["health"] == "true"


@pytest.mark.etcd
def test_inbound_cut_lets_requests_land_and_loses_the_answers(healed: NetTopology, etcd_in_a: str) -> None:
    net = healed
    with Http(net, "b-p1", etcd_in_a) as client, Http(net, HARNESS, etcd_in_a) as harness:
        client.put("/netns/in", "before")
        net.cut("b-p1", "a-e1", CLIENT_PORT, direction="inbound")
        with pytest.raises(TimeoutError):
            client.put("/netns/in", "during")  # the client never hears back...
        deadline = time.monotonic() + 5
        while harness.value("/netns/in") != "during":  # ...but etcd applied it: outcome unknown
            assert time.monotonic() < deadline, "the request sent under an inbound cut never landed"
            time.sleep(0.05)
        # A second of unacknowledged data later the sender is in retransmission (cwnd 1, resending only
        # the oldest segment): a new request no longer leaves it.
        with pytest.raises(TimeoutError):
            client.put("/netns/in", "later")
        time.sleep(0.3)
        assert harness.value("/netns/in") == "during"
    with pytest.raises(TimeoutError):  # a new connection fails: the SYN-ACK is lost
        Http(net, "b-p1", etcd_in_a)


@pytest.mark.etcd
def test_outbound_cut_lands_nothing(healed: NetTopology, etcd_in_a: str) -> None:
    net = healed
    with Http(net, "b-p1", etcd_in_a) as client, Http(net, HARNESS, etcd_in_a) as harness:
        client.put("/netns/out", "before")
        net.cut("b-p1", "a-e1", CLIENT_PORT, direction="outbound")
        with pytest.raises(TimeoutError):
            client.put("/netns/out", "during")
        time.sleep(0.3)
        assert harness.value("/netns/out") == "before"
        net.heal_all()
        # The stalled request was only delayed: TCP retransmits it after the heal, so it may still land
        # (what a planner's "outcome unknown" must allow for): it is not lost, only late.
    with Http(net, "b-p1", etcd_in_a) as client:
        client.put("/netns/out", "after")


@pytest.mark.etcd
async def test_portal_reaches_etcd_from_the_host_with_the_product_client(healed: NetTopology, etcd_in_a: str) -> None:
    net = healed
    net.cut("a", "*")  # region a cut from every other node: the harness is not one of them
    async with net.portal("a-e1", CLIENT_PORT) as p:
        assert p.host == "127.0.0.1"
        async with EtcdClient(EtcdConfig(endpoints=(p.endpoint,), timeout=5.0)) as client:
            await client.put(b"/netns/portal", b"v")
            got = await client.get(b"/netns/portal")
            assert got is not None and got.value == b"v"


def test_a_lossy_cut_drops_about_its_share_and_heals_exactly(healed: NetTopology) -> None:
    net = healed
    rx = net.open_socket(HARNESS, socket.AF_INET, socket.SOCK_DGRAM)
    tx = net.open_socket("a-p1", socket.AF_INET, socket.SOCK_DGRAM)
    with rx, tx:
        rx.bind((net.harness_addr, 0))
        rx.settimeout(0.3)
        cut = net.cut("a-p1", HARNESS, direction="outbound", probability=0.5)
        assert all("--probability 0.5" in r for r in net.rules("a-p1"))
        refused = 0
        for i in range(200):
            try:
                tx.sendto(b"%d" % i, rx.getsockname())
            except PermissionError:  # a datagram dropped in OUTPUT is reported to its local sender
                refused += 1
        got = 0
        with contextlib.suppress(TimeoutError):
            while rx.recv(64):
                got += 1
        assert 40 <= got <= 160, got  # binomial(200, 0.5): outside this is > 8 standard deviations
        assert got + refused == 200
        net.heal(cut)
        assert net.rules("a-p1") == []


def test_listen_sees_each_node_by_its_own_address(net: NetTopology) -> None:
    srv = net.listen()
    srv.setblocking(True)
    srv.settimeout(TIMEOUT_S)
    port = srv.getsockname()[1]
    with srv:
        for node in ("a-p1", "b-p1"):
            with net.open_socket(node) as c:
                c.connect((net.harness_addr, port))
                conn, peer = srv.accept()
                conn.close()
                assert peer[0] == net.addr(node)  # the sink can tell workers apart


# ---- teardown, concurrency, leftovers -----------------------------------------------------------------------


@needs_netns
def test_teardown_leaves_nothing_behind_even_on_an_exception() -> None:
    before = host_state()
    net = NetTopology(small())
    mine = set(net.namespaces)

    def run_that_fails() -> None:
        with net:
            assert mine <= set(list_namespaces())
            net.cut("a", "b")
            net.cut("b-p1", HARNESS, 80, direction="outbound", mode="reset")
            assert net.rules("a-e1") and net.rules("b-p1")
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_that_fails()
    assert mine.isdisjoint(list_namespaces())
    assert not list(netns.STATE_DIR.glob(f"{net.run_name}*"))
    assert not [f for f in netns.STATE_DIR.glob("subnet-*") if f.read_text() == net.run_name]
    assert host_state() == before  # no interface, bridge, veth or rule ever appeared on the host
    net.teardown()  # idempotent


@needs_netns
def test_two_runs_at_once_neither_collide_nor_reach_each_other() -> None:
    with NetTopology(small()) as one, NetTopology(small()) as two:
        assert one.subnet != two.subnet and set(one.namespaces).isdisjoint(two.namespaces)
        servers = {id(n): n.listen() for n in (one, two)}
        try:
            one.cut("b-p1", HARNESS)
            port_two = servers[id(two)].getsockname()[1]
            with two.open_socket("b-p1") as c:  # the cut in run one does not touch run two
                c.settimeout(TIMEOUT_S)
                c.connect((two.harness_addr, port_two))
            with one.open_socket("a-p1") as c:  # no route from one run to another: refused on the spot
                c.settimeout(TIMEOUT_S)
                with pytest.raises(OSError, match="unreachable"):
                    c.connect((two.harness_addr, port_two))
        finally:
            for s in servers.values():
                s.close()


CHILD = """
import os, sys
from chaos.netns import NetTopology
from scheduler.topology import Topology
net = NetTopology(Topology.from_counts(1, planners_per_region=1, workers_per_region=0)).create()
print(net.run_name, flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), 9)
"""


def _child(how: str) -> str:
    r = subprocess.run([sys.executable, "-c", CHILD, how], capture_output=True, text=True, timeout=60)
    return r.stdout.strip()


@needs_netns
def test_atexit_cleans_a_run_that_forgot_teardown_and_cleanup_stale_one_that_was_killed() -> None:
    run = _child("exit")
    assert run and not [n for n in list_namespaces() if n.startswith(f"{run}-")]

    with NetTopology(small()) as live:  # a live run of this process must survive cleanup_stale
        killed = _child("kill")
        left = [n for n in list_namespaces() if n.startswith(f"{killed}-")]
        assert left, "a SIGKILLed run leaves its namespaces"
        removed = cleanup_stale()
        assert set(left) <= set(removed)
        assert not [n for n in list_namespaces() if n.startswith(f"{killed}-")]
        assert not list(netns.STATE_DIR.glob(f"{killed}*"))
        assert set(live.namespaces) <= set(list_namespaces())
        assert not any(n.startswith(live.run_name) for n in removed)


def test_cut_names_what_it_cannot_resolve(net: NetTopology) -> None:
    with pytest.raises(KeyError, match="nodes: a-e1"):
        net.cut("c-p1", "a")
    with pytest.raises(ValueError, match="outside this run's subnet"):
        net.cut("a-p1", "127.0.0.1")
    with pytest.raises(ValueError, match="harness is outside every fault"):
        net.cut(HARNESS, "a")
    assert net.cuts == ()


def test_rule_specs_per_direction_and_mode() -> None:
    out = netns._rule_specs("x:1", ["10.0.0.2"], 2379, "outbound", "drop")
    assert out == ['OUTPUT -d 10.0.0.2/32 -p tcp --dport 2379 -m comment --comment "x:1" -j DROP']
    out = netns._rule_specs("x:1", ["10.0.0.2"], 2379, "inbound", "reset")
    assert out == ['INPUT -s 10.0.0.2/32 -p tcp --sport 2379 ! --tcp-flags RST RST -m comment --comment "x:1" '
                   "-j REJECT --reject-with tcp-reset"]
    assert len(netns._rule_specs("x:1", ["10.0.0.2", "10.0.0.3"], None, "both", "reset")) == 8


def test_run_ids_are_checked() -> None:
    with pytest.raises(ValueError, match="run_id"):
        NetTopology(small(), run_id="Bad-Id")
