"""chaos/netns_cluster.py without etcd or planners: the region partition (issue 11's F5 multi-region will use
it) and the harness-namespace proxies that carry planner<->etcd links in a namespace run.

Every node gets an echo server on its own address, served by this process from a socket made in the
node's namespace (so the node's iptables rules apply to it); clients are sockets made in another node's
namespace. A region partition must cut every path between the region and the other nodes, both ways, and
the proxied etcd links crossing the border, while the region keeps its own links and everyone keeps the
harness; heal must bring everything back, and a connection open across the cut survives it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from chaos import cli, netns_cluster
from chaos.netns import HARNESS, NetTopology, available
from chaos.netns_cluster import NetnsNetwork, choose_network, partition_region
from chaos.proxy_links import ProxyLinks
from scheduler.topology import Topology

OK, WHY = available()
needs_netns = pytest.mark.skipif(not OK, reason=f"network namespaces unavailable: {WHY}")

PORT = 9000
T = 0.5  # a cut path counts as cut when nothing answers within this


@dataclass
class World:
    net: NetTopology
    links: ProxyLinks
    etcd_nodes: list[str]


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(4096):
            writer.write(data)
            await writer.drain()
    writer.close()


@pytest.fixture
async def world() -> AsyncIterator[World]:
    topo = Topology.from_counts(["a", "b"], etcd_per_region=1, planners_per_region=1, workers_per_region=1)
    net = NetTopology(topo)
    await asyncio.to_thread(net.create)
    servers = []
    links: ProxyLinks | None = None
    try:
        for n in [HARNESS, *(x.name for x in topo.nodes)]:
            servers.append(await asyncio.start_server(_echo, sock=net.listen(PORT, node=n)))
        network = NetnsNetwork(net=net)
        etcd_nodes = [x.name for x in topo.etcd_members]
        links = ProxyLinks(lambda _t: None, b"/t/owners/", listen=net.listen, dial=network.dial)
        await links.start([f"{net.addr(e)}:{PORT}" for e in etcd_nodes], [x.name for x in topo.planners])
        yield World(net, links, etcd_nodes)
    finally:
        if links is not None:
            await links.close()
        for s in servers:
            s.close()
        net.teardown()


def _talk(net: NetTopology, src: str, host: str, port: int) -> bool:
    s = net.open_socket(src)
    try:
        s.settimeout(T)
        s.connect((host, port))
        s.sendall(b"ping")
        return s.recv(4) == b"ping"
    except OSError:
        return False
    finally:
        s.close()


async def reach(net: NetTopology, src: str, dst: str) -> bool:
    return await asyncio.to_thread(_talk, net, src, net.addr(dst), PORT)


async def via_proxy(w: World, planner: str, member: str) -> bool:
    proxy = w.links.proxies[planner][w.etcd_nodes.index(member)]
    return await asyncio.to_thread(_talk, w.net, planner, proxy.listen_host, proxy.port)


@needs_netns
async def test_a_region_partition_cuts_the_region_off_from_everything_but_the_harness(world: World) -> None:
    w, net = world, world.net
    assert await reach(net, "a-w1", "b-p1") and await via_proxy(w, "a-p1", "b-e1")
    # A connection open across the border before the cut (through a proxy): it must survive the cut.
    proxy = w.links.proxies["b-p1"][w.etcd_nodes.index("a-e1")]
    held = await asyncio.to_thread(net.open_socket, "b-p1")
    held.settimeout(3.0)
    await asyncio.to_thread(held.connect, (proxy.listen_host, proxy.port))

    part = await partition_region(net, "a", w.links, w.etcd_nodes)
    try:
        assert "region a cut" in part.describe()
        # Across the border, both ways, node to node: cut.
        for src, dst in (("a-w1", "b-p1"), ("b-p1", "a-e1"), ("a-e1", "b-e1"), ("b-w1", "a-p1")):
            assert not await reach(net, src, dst), f"{src} -> {dst} should be cut"
        # The proxied etcd links across the border: stalled (accepted, nothing answered).
        assert not await via_proxy(w, "a-p1", "b-e1")
        assert not await via_proxy(w, "b-p1", "a-e1")
        await asyncio.to_thread(held.sendall, b"late")  # waits in the stalled proxy
        # Inside each side, and to the harness: untouched.
        assert await reach(net, "a-w1", "a-p1") and await reach(net, "b-w1", "b-e1")
        assert await via_proxy(w, "a-p1", "a-e1") and await via_proxy(w, "b-p1", "b-e1")
        assert await reach(net, "a-w1", HARNESS) and await reach(net, "b-p1", HARNESS)
        assert await asyncio.to_thread(_talk, net, HARNESS, net.addr("a-e1"), PORT)
    finally:
        note = await part.heal()
    assert "rejoined" in note
    assert not net.cuts
    for src, dst in (("a-w1", "b-p1"), ("b-p1", "a-e1"), ("a-e1", "b-e1")):
        assert await reach(net, src, dst), f"{src} -> {dst} should be healed"
    assert await via_proxy(w, "a-p1", "b-e1") and await via_proxy(w, "b-p1", "a-e1")
    # What was sent during the cut arrives after the heal, on the same connection (TCP across a healed partition).
    assert await asyncio.to_thread(held.recv, 4) == b"late"
    held.close()


@needs_netns
async def test_reset_mode_refuses_at_once_and_a_partition_of_the_whole_run_is_refused(world: World) -> None:
    w, net = world, world.net
    part = await partition_region(net, "b", w.links, w.etcd_nodes, mode="reset")
    try:
        s = await asyncio.to_thread(net.open_socket, "b-w1")
        s.settimeout(T)
        with pytest.raises(ConnectionRefusedError):
            await asyncio.to_thread(s.connect, (net.addr("a-p1"), PORT))
        s.close()
        assert not await via_proxy(w, "a-p1", "b-e1")  # the proxy refuses (RST) new connections
    finally:
        await part.heal()
    assert await via_proxy(w, "a-p1", "b-e1")
    one = NetTopology(Topology.from_counts(["solo"], planners_per_region=1, workers_per_region=0))
    await asyncio.to_thread(one.create)
    try:
        with pytest.raises(ValueError, match="nothing to partition"):
            await partition_region(one, "solo", None, ["solo-e1"])
        with pytest.raises(KeyError):
            await partition_region(one, "nowhere", None, ["solo-e1"])
    finally:
        one.teardown()


def test_auto_falls_back_to_loopback_and_netns_says_why_it_cannot(monkeypatch: pytest.MonkeyPatch) -> None:
    assert choose_network("auto") == (("netns", "") if OK else ("loopback", WHY))
    assert choose_network("loopback") == ("loopback", "")
    with pytest.raises(ValueError, match="auto, loopback or netns"):
        choose_network("bridge")
    monkeypatch.setattr(netns_cluster, "available", lambda: (False, "network namespaces and iptables need root"))
    assert choose_network("auto") == ("loopback", "network namespaces and iptables need root")
    with pytest.raises(ValueError, match="unavailable: network namespaces and iptables need root"):
        choose_network("netns")


def test_drill_run_network_netns_where_it_cannot_be_made_is_bad_input(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.setattr(netns_cluster, "available", lambda: (False, "no root here"))
    args = argparse.Namespace(scenario="smoke", seed=None, duration=None, report=str(tmp_path / "run"),
                              links="proxy", network="netns")
    assert cli.run(args) == 2
    assert "network: network namespaces unavailable: no root here" in capsys.readouterr().err
    assert not (tmp_path / "run" / "run.json").exists()


@needs_netns
def test_proxy_listens_in_the_harness_namespace(world: World) -> None:
    for proxies in world.links.proxies.values():
        for p in proxies:
            assert p.listen_host == world.net.harness_addr
    assert all(isinstance(p.port, int) and p.port > 0 for ps in world.links.proxies.values() for p in ps)
    assert socket.inet_aton(world.net.harness_addr)
