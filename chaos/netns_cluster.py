"""Where a drill's processes run and how the harness reaches them: loopback (the fallback) or one Linux
network namespace per node (chaos/netns.py), chosen by `RunOptions.network` / `drill run --network`.

`LiveCluster` (chaos/live.py) asks its `ClusterNetwork` a handful of questions and is otherwise the same in
both modes: which etcd cluster to start, what argv prefix runs a node's process, what a planner listens
on, how the harness's clients (the watcher's etcd client, the API calls of chaos/ops.py) reach a server,
where the effect sink listens, what run.json says a node's address is, and what to tear down at the end.

Loopback (`LoopbackNetwork`): everything on 127.0.0.1, as before; workers share an address, so an http
effect is attributed to no worker in particular (shell effects name theirs).

Namespaces (`NetnsNetwork`): a namespace per node of the scenario's topology (scheduler/topology.py),
joined by veth pairs to a bridge in a harness namespace (chaos/netns.py says why per node and why nothing
in the host's):
- etcd members, planners and workers run inside their node's namespace (`prefix(node)`); servers listen
  on the node's own address, on fixed ports (etcd 2379/2380, the planner API `PLANNER_API_PORT`): nothing
  else can bind inside our namespaces, so there is no port race and a restarted process comes back on
  the address its peers dial;
- the effect sink listens in the harness namespace (`net.listen()`), at `net.harness_addr`: a worker's
  request arrives with the worker's own address as its peer, so run.json's `nodes` gives each worker
  its address and http effects are attributed to workers (chaos/context.py `worker_name`);
- the harness's gRPC clients go through portals (127.0.0.1 in the host -> a harness-namespace socket ->
  the node), so they are harness traffic, never cut: the etcd watcher, health reads, compaction and the
  API operations;
- at start, `cleanup_stale()` removes what killed runs left behind; at the end (every exit path: the
  runner's `finally` closes the cluster, and netns.py's atexit hook backs it up), every process still in
  one of the run's namespaces is killed by pid and the namespaces are deleted.

Planner <-> etcd links. Chosen: the same per-planner fault proxies as on loopback (chaos/proxy_links.py),
listening in the harness namespace and dialling the etcd members' namespace addresses from there. Why
not iptables on the planner's namespace (`net.cut(planner, etcd nodes, 2379, ...)`) for F3:
- F2 beyond the lease needs a write *held in flight* while the planner is frozen (docs/drills.md, I4c):
  only a proxy can see that a request was caught before it freezes the planner; iptables cannot tell a
  txn from a keepalive;
- the wire witness (chaos/wire.py) reads the planner's gRPC traffic as the proxy forwards it: that is the
  I4c evidence that etcd's fence refused a stale txn (a refused txn leaves no trace in etcd's history,
  and the planner itself usually never hears the answer). With direct links and iptables cuts, I4c would
  have only the sink's 409s and the planner's own `fenced_out` log lines, and a planner that fences
  itself before writing (the usual case, see I4c's note on F3) leaves neither: runs would come out
  invalid where the proxy makes them valid;
- F10's latency and jitter need the proxy anyway (this kernel has no sch_netem);
- the same evidence in both modes means a verdict does not depend on the machine's privileges.
The proxies sit in the harness namespace, outside every iptables cut (a cut to `*` leaves the harness
reachable), so a link fault is exactly what the proxy does. Region-level faults are iptables: see
`partition_region` (for issue 11's F5 multi-region), which cuts the region's namespaces from every other
node's and stalls the proxies of the planner<->etcd links that cross the region's border.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from chaos.infra.etcd import EtcdCluster, Member, find_binary
from chaos.links import DirectLinks, Links
from chaos.netns import HARNESS, Cut, Mode, NetTopology, Portal, available, cleanup_stale
from chaos.proxy import Dialer, FaultProxy
from chaos.proxy_links import ProxyLinks
from chaos.sink import EffectSink
from chaos.wire import FencedTxn
from scheduler.topology import Topology

__all__ = [
    "ETCD_CLIENT_PORT",
    "ETCD_PEER_PORT",
    "PLANNER_API_PORT",
    "ClusterNetwork",
    "LoopbackNetwork",
    "NetnsEtcdCluster",
    "NetnsNetwork",
    "NetworkKind",
    "RegionPartition",
    "choose_network",
    "make_network",
    "partition_region",
]

log = logging.getLogger(__name__)

NetworkKind = Literal["loopback", "netns"]
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
PLANNER_API_PORT = 7443  # inside a planner's own namespace: nothing else can take it


def choose_network(choice: str) -> tuple[NetworkKind, str]:
    """`auto` -> netns when chaos.netns.available(), else loopback; returns the kind and, for a fallback,
    why. `netns` where namespaces cannot be made raises ValueError saying why."""
    if choice == "loopback":
        return "loopback", ""
    ok, why = available()
    if choice == "netns":
        if not ok:
            raise ValueError(f"network namespaces unavailable: {why}")
        return "netns", ""
    if choice != "auto":
        raise ValueError(f"network {choice!r}: auto, loopback or netns")
    return ("netns", "") if ok else ("loopback", why)


class ClusterNetwork(Protocol):
    """What LiveCluster asks of the run's network (see the module docstring)."""

    kind: str

    async def start(self, topology: Topology) -> None: ...

    def etcd_cluster(self, base_dir: Path, size: int) -> EtcdCluster: ...

    def harness_endpoints(self, etcd: EtcdCluster) -> tuple[str, ...]: ...

    async def serve_sink(self, sink: EffectSink) -> str: ...

    def prefix(self, node: str) -> list[str]: ...

    def planner_settings(self, node: str) -> dict[str, str]: ...

    def worker_settings(self, node: str) -> dict[str, str]: ...

    def reach(self, address: str) -> str: ...

    def node_info(self, node: str) -> dict[str, str]: ...

    def links(self, kind: str, on_txn: Callable[[FencedTxn], None], owners_prefix: bytes) -> Links: ...

    async def close(self) -> None: ...


def make_network(kind: str) -> ClusterNetwork:
    if kind == "netns":
        return NetnsNetwork()
    if kind == "loopback":
        return LoopbackNetwork()
    raise ValueError(f"network {kind!r}: loopback or netns")


def _links(kind: str, on_txn: Callable[[FencedTxn], None], owners: bytes, *,
           listen: Callable[[], socket.socket] | None = None, dial: Dialer | None = None) -> Links:
    """Proxy links unless asked otherwise: every link fault needs them, and their wire witness records the
    stale writes etcd refused (I4c)."""
    if kind == "direct":
        return DirectLinks()
    return ProxyLinks(on_txn, owners, listen=listen, dial=dial)


class LoopbackNetwork:
    """Everything on 127.0.0.1 (the fallback where namespaces are unavailable): today's behaviour."""

    kind = "loopback"

    async def start(self, topology: Topology) -> None:
        return None

    def etcd_cluster(self, base_dir: Path, size: int) -> EtcdCluster:
        return EtcdCluster(base_dir, size=size)

    def harness_endpoints(self, etcd: EtcdCluster) -> tuple[str, ...]:
        return etcd.endpoints

    async def serve_sink(self, sink: EffectSink) -> str:
        return await sink.start()

    def prefix(self, node: str) -> list[str]:
        return []

    def planner_settings(self, node: str) -> dict[str, str]:
        return {}

    def worker_settings(self, node: str) -> dict[str, str]:
        return {}

    def reach(self, address: str) -> str:
        return address

    def node_info(self, node: str) -> dict[str, str]:
        return {}  # workers share 127.0.0.1: no address names one

    def links(self, kind: str, on_txn: Callable[[FencedTxn], None], owners_prefix: bytes) -> Links:
        return _links(kind, on_txn, owners_prefix)

    async def close(self) -> None:
        return None


# ---- etcd inside the nodes' namespaces ----------------------------------------------------------------


@dataclass
class NetnsEtcdCluster(EtcdCluster):
    """EtcdCluster whose members run in their nodes' namespaces, on the nodes' addresses and fixed ports.
    `endpoints` are those addresses (what planners' proxies dial from the harness namespace); the harness's
    own client goes through portals (NetnsNetwork.harness_endpoints). Health and etcdctl run from the
    harness namespace, never faulted."""

    net: NetTopology | None = None
    nodes: Sequence[str] = ()
    # The loop (on the main thread) that members are spawned on; see _spawn.
    loop: asyncio.AbstractEventLoop | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.net is None or len(self.nodes) != self.size:
            raise ValueError(f"NetnsEtcdCluster needs the network and one node per member ({self.size})")
        if self.tls is not None:
            raise ValueError("NetnsEtcdCluster: TLS is not supported")
        self.members = [Member(n, ETCD_CLIENT_PORT, ETCD_PEER_PORT, self.base_dir / f"{n}.etcd",
                               self.base_dir / f"{n}.log", slot=n) for n in self.nodes]

    def _addr(self, m: Member) -> str:
        """The member's node's address: a replacement (F12) has a new etcd name but runs in its slot's node."""
        assert self.net is not None
        return self.net.addr(m.slot or m.name)

    def _peer_url(self, m: Member) -> str:
        return f"http://{self._addr(m)}:{m.peer_port}"

    def _replacement_ports(self, old: Member) -> tuple[int, int]:
        """The fixed ports, in the slot's own namespace (nothing else binds there, and its predecessor is
        gone): so the new member is on the very address the planners' proxies and the harness's portal
        dial, as a replaced machine keeping its DNS name would be."""
        return ETCD_CLIENT_PORT, ETCD_PEER_PORT

    @property
    def _ports_movable(self) -> bool:
        return False

    @property
    def endpoints(self) -> tuple[str, ...]:
        return tuple(f"{self._addr(m)}:{m.client_port}" for m in self.members)

    def _client_url(self, m: Member) -> str:
        return f"http://{self._addr(m)}:{m.client_port}"

    def _launcher(self, m: Member) -> list[str]:
        assert self.net is not None
        return self.net.prefix(m.slot or m.name)

    def _cluster_token(self) -> str:
        assert self.net is not None
        return f"sched-netns-{self.net.run_id}"

    def _spawn(self, m: Member) -> None:
        """Spawn on the event loop's thread when called from another (LiveCluster starts and restarts
        members with asyncio.to_thread): chaos/infra/procs.py gives a process its parent-death signal only
        when the main thread forks it, and an etcd without one outlives a SIGKILLed runner, running on in
        a namespace that cleanup_stale() then deletes around it."""
        loop = self.loop
        if loop is None or threading.current_thread() is threading.main_thread() or not loop.is_running():
            super()._spawn(m)
            return
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def run() -> None:
            try:
                EtcdCluster._spawn(self, m)
                done.set_result(None)
            except BaseException as e:
                done.set_exception(e)

        loop.call_soon_threadsafe(run)
        done.result(timeout=30)

    def _start_over(self) -> None:
        # Fixed ports in our own namespaces: nobody else can hold them, so there is nothing to move to.
        self.close()
        self.bind_retries += 1
        for m in self.members:
            shutil.rmtree(m.data_dir, ignore_errors=True)

    def healthy(self, i: int) -> bool:
        """etcd's /health over a socket made in the harness namespace (HTTP/1.0: one answer, then EOF)."""
        assert self.net is not None
        m = self.members[i]
        try:
            with self.net.open_socket(HARNESS) as s:
                s.settimeout(1.0)
                s.connect((self._addr(m), m.client_port))
                s.sendall(b"GET /health HTTP/1.0\r\nHost: etcd\r\n\r\n")
                data = b""
                while chunk := s.recv(4096):
                    data += chunk
            body = data.split(b"\r\n\r\n", 1)[1]
            return bool(json.loads(body).get("health") == "true")
        except (OSError, ValueError, IndexError):
            return False

    def etcdctl(self, *args: str, user: str | None = None, member: int | None = None) -> str:
        """etcdctl from the harness namespace (never faulted) against the members' addresses."""
        assert self.net is not None
        binary = find_binary("etcdctl")
        if binary is None:
            raise RuntimeError("etcdctl not found next to etcd")
        chosen = [self.members[member]] if member is not None else self._reachable()
        argv = [*self.net.prefix(HARNESS), binary,
                "--endpoints=" + ",".join(f"http://{self._addr(m)}:{m.client_port}" for m in chosen)]
        if user:
            argv.append(f"--user={user}")
        done = subprocess.run([*argv, *args], capture_output=True, text=True, timeout=30,
                              env={**os.environ, "ETCDCTL_API": "3"})
        if done.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout


# ---- the namespace network -----------------------------------------------------------------------------


@dataclass
class NetnsNetwork:
    """One namespace per node (chaos/netns.py), the harness reaching them through portals and harness
    sockets. `start()` builds it (after removing stale runs' leftovers), `close()` tears it down."""

    kind: str = "netns"
    run_id: str | None = None
    net: NetTopology | None = None
    topology: Topology | None = None
    portals: dict[tuple[str, int], Portal] = field(default_factory=dict)  # (node, port) -> portal
    addresses: dict[str, str] = field(default_factory=dict)  # node -> its address (kept after teardown)
    _proxy_links: ProxyLinks | None = None

    def _net(self) -> NetTopology:
        if self.net is None:
            raise RuntimeError("NetnsNetwork: start() first")
        return self.net

    async def start(self, topology: Topology) -> None:
        ok, why = available()
        if not ok:
            raise RuntimeError(f"network namespaces unavailable: {why}")
        gone = await asyncio.to_thread(cleanup_stale)
        if gone:
            log.warning("removed %d namespaces left by killed runs: %s", len(gone), gone)
        self.topology = topology
        self.net = net = NetTopology(topology, run_id=self.run_id)
        await asyncio.to_thread(net.create)
        self.addresses = {n.name: net.addr(n.name) for n in topology.nodes}
        for n in topology.etcd_members:
            await self._portal(n.name, ETCD_CLIENT_PORT)
        for n in topology.planners:
            await self._portal(n.name, PLANNER_API_PORT)

    async def _portal(self, node: str, port: int) -> Portal:
        p = self.portals.get((node, port))
        if p is None:
            p = self.portals[(node, port)] = await self._net().portal(node, port).start()
        return p

    def etcd_cluster(self, base_dir: Path, size: int) -> EtcdCluster:
        assert self.topology is not None
        nodes = [n.name for n in self.topology.etcd_members]
        return NetnsEtcdCluster(base_dir, size=len(nodes), net=self._net(), nodes=nodes,
                                loop=asyncio.get_running_loop())

    def harness_endpoints(self, etcd: EtcdCluster) -> tuple[str, ...]:
        return tuple(self.portals[(m.name, m.client_port)].endpoint for m in etcd.members)

    async def serve_sink(self, sink: EffectSink) -> str:
        net = self._net()
        assert self.topology is not None
        sink.peer_names = {net.addr(n.name): n.name for n in self.topology.workers}
        return await sink.start(sock=net.listen())

    def prefix(self, node: str) -> list[str]:
        return self._net().prefix(node)

    def planner_settings(self, node: str) -> dict[str, str]:
        # Plaintext on the namespaces' 10.x addresses: said explicitly, as the planner requires off loopback (the
        # drills fault the network, not TLS; docs/operations.md, "Security").
        return {"api_host": self._net().addr(node), "api_port": str(PLANNER_API_PORT), "insecure": "true"}

    def worker_settings(self, node: str) -> dict[str, str]:
        return {"insecure": "true"}  # dials the planners' 10.x addresses in plaintext, as above

    def reach(self, address: str) -> str:
        """The harness-side endpoint (a portal) for a node's `addr:port`; other addresses as they are."""
        net = self._net()
        host, _, port = address.rpartition(":")
        for (node, p), portal in self.portals.items():
            if net.addr(node) == host and str(p) == port:
                return portal.endpoint
        return address

    def node_info(self, node: str) -> dict[str, str]:
        """run.json's address of a node: its namespace address (asked after close(), so remembered)."""
        return {"address": self.addresses[node]} if node in self.addresses else {}

    def links(self, kind: str, on_txn: Callable[[FencedTxn], None], owners_prefix: bytes) -> Links:
        """Per-planner fault proxies listening in the harness namespace and dialling etcd from there (the
        module docstring says why proxies); `direct`: planners dial the members' addresses themselves."""
        links = _links(kind, on_txn, owners_prefix, listen=lambda: self._net().listen(), dial=self.dial)
        if isinstance(links, ProxyLinks):
            self._proxy_links = links
        return links

    async def dial(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A TCP connection from the harness namespace (a proxy's upstream leg: never faulted itself)."""
        s = await asyncio.to_thread(self._net().open_socket, HARNESS)
        s.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(s, (host, port))
        except BaseException:
            s.close()
            raise
        return await asyncio.open_connection(sock=s)

    async def cut(self, src: str, dst: Sequence[str], mode: Mode = "drop") -> Cut:
        """Cut node `src` from nodes `dst`, both ways (F13: a worker from all planners but one)."""
        return await self._net().acut(src, list(dst), direction="both", mode=mode)

    async def heal(self, cut: Cut) -> None:
        await self._net().aheal(cut)

    async def partition(self, region: str, mode: Mode = "drop") -> RegionPartition:
        """Cut `region` off from every other node and region (see `partition_region`)."""
        assert self.topology is not None
        return await partition_region(self._net(), region, self._proxy_links,
                                      [n.name for n in self.topology.etcd_members], mode=mode)

    async def close(self) -> None:
        """Portals closed, every process left in the run's namespaces killed by pid (shell jobs that
        outlived their worker, a process a failed start left behind), the namespaces deleted."""
        for p in list(self.portals.values()):
            with contextlib.suppress(Exception):
                await p.close()
        self.portals.clear()
        net = self.net
        if net is None:
            return
        try:
            with contextlib.suppress(Exception):
                left = net.pids()
                for ns, pids in left.items():
                    log.warning("killing processes left in %s: %s", ns, pids)
                    for pid in pids:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
        finally:
            net.teardown()  # not in a thread: a cancelled close must still finish deleting


# ---- region-level faults ------------------------------------------------------------------------------


@dataclass
class RegionPartition:
    """A region cut off from the rest of the run: iptables cuts in its nodes' namespaces, and the proxies
    of the planner<->etcd links crossing its border stalled (or reset). `heal()` undoes exactly that."""

    net: NetTopology
    region: str
    cuts: list[Cut]
    proxies: list[FaultProxy]

    async def heal(self) -> str:
        for c in self.cuts:
            await self.net.aheal(c)
        reset = sum(p.heal() for p in self.proxies)
        return f"region {self.region} rejoined" + (f" ({reset} damaged connection(s) reset)" if reset else "")

    def describe(self) -> str:
        return (f"region {self.region} cut from {sum(len(c.dst) for c in self.cuts)} address(es), "
                f"{len(self.proxies)} etcd link(s) across its border stalled")


async def partition_region(net: NetTopology, region: str, links: ProxyLinks | None, etcd_nodes: Sequence[str],
                           *, mode: Mode = "drop") -> RegionPartition:
    """Cut `region` from everything but the harness: every packet between its nodes' namespaces and any
    other node's is refused (iptables in the region's namespaces, both directions; `mode` drop or reset),
    and the proxied planner<->etcd links that cross the border (its planners to other regions' members,
    other planners to its members; `etcd_nodes` in the links' member order) stall, or are reset in reset
    mode. Inside the region everything still works (its planners reach its own etcd member); the harness
    (sink, watcher, API portals) reaches both sides. For F5 multi-region (issue 11)."""
    topo = net.topology
    if region not in topo.region_names:
        raise KeyError(f"no region {region!r}; regions: {', '.join(topo.region_names)}")
    inside = {n.name for n in topo.region(region).nodes}
    others = [n.name for n in topo.nodes if n.name not in inside]
    if not others:
        raise ValueError(f"region {region!r} is the whole run: there is nothing to partition it from")
    cuts = [await net.acut(region, others, direction="both", mode=mode)]
    crossing: list[FaultProxy] = []
    if links is not None:
        for planner, proxies in links.proxies.items():
            for member, proxy in zip(etcd_nodes, proxies, strict=True):
                if (planner in inside) != (member in inside):
                    crossing.append(proxy)
    for p in crossing:
        if mode == "reset":
            p.reset(refuse=True)
        else:
            p.stall("both")
    return RegionPartition(net, region, cuts, crossing)
