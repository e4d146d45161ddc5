"""Linux network namespaces for a drill run, and link faults between them (F3, F5 multi-region, F10 later).

Layout. One namespace per NODE of the run's topology (scheduler/topology.py: `r1-e1`, `r1-p1`, `r1-w1`,
...), not one per region, plus one harness namespace holding the bridge:

    harness ns  `schd-<run>-harness`: bridge br0 = 10.A.B.1/24 (the harness address)
                  |- v0 (veth) ==== eth0 in `schd-<run>-r1-e1`  10.A.B.2
                  |- v1 (veth) ==== eth0 in `schd-<run>-r1-p1`  10.A.B.3
                  ...                        (topology order: node i gets .i+2)

Why per node: F3 cuts ONE planner from etcd, F10 makes one planner's link flaky, and the effect sink tells
http workers apart by their peer address. Two planners sharing a region namespace would share its
netfilter tables and its address, so a per-planner fault would hit the region. A region is the set of its
nodes' namespaces: `cut("r1", ...)` installs rules in each.

Why a harness namespace, and nothing in the host's. The bridge, both ends of every veth pair, every
address and every rule live in namespaces this run created: the host gains no interface, no address, no
route and no netfilter rule, and host firewall state (Docker's FORWARD DROP with br_netfilter, other
agents' rules) cannot touch the run's traffic. Teardown is deleting the namespaces: the kernel destroys
the veths and the bridge with them, so a half-built run cannot leave a stray interface on the host. The
harness, that is the runner process in the host namespace (its etcd watcher, its effect sink, its API
calls), is outside every fault and reaches the run in two ways, neither of which listens on anything but
127.0.0.1 or an address inside our own namespaces:
- `open_socket(HARNESS)` / `listen()`: a socket created in the harness namespace (setns on a short-lived
  thread; a socket keeps the namespace it was made in). The effect sink serves on `listen()` (aiohttp:
  `web.SockSite(runner, net.listen())`), so workers' requests arrive with their own addresses as peers;
- `portal(node, port)`: a TCP forwarder on 127.0.0.1 (host) whose outgoing legs are harness-namespace
  sockets, for clients that make their own sockets (grpcio: the watcher's EtcdClient, schedctl calls).
  Processes run with `prefix(HARNESS)` (etcdctl for health, compaction, membership) are never faulted
  either. Harness traffic comes from 10.A.B.1, which no cut matches unless it names it explicitly.

Addresses: a private 10.A.B.0/24 per run (A in 200..249), claimed with an O_EXCL lock file under
/run/sched-netns, so concurrent runs on one machine never share a subnet (they could not reach each
other anyway: nothing is routed between namespaces of different runs; the distinct subnets keep
addresses in logs unambiguous). Interface names are v<i> and eth0 inside our own namespaces, so
IFNAMSIZ (15) and host interface names never matter; namespace names carry the short run id.

Faults are iptables rules (filter table, INPUT/OUTPUT) inside the SOURCE node's namespace, applied with
one `iptables-restore --noflush` per namespace (atomic there; namespaces in parallel), each rule tagged
with a comment naming its cut so `heal` deletes exactly its own rules. Rules match every packet, not only
new connections, so established connections are hit at once. What each direction really does to TCP:
- `outbound` (src -> dst dropped): src's segments, data and ACKs alike, never arrive. New connections
  from src fail (SYN lost: connect timeout). On an established connection NOTHING src sends arrives (no
  request lands at dst) and dst's data goes unacknowledged, so dst retransmits and stalls too: a one-way
  drop is a two-way outage for any TCP conversation. The lease is not renewed; dst notices only by its
  own timeouts (etcd: the lease TTL; gRPC keepalive). What src sent stays in its send queue: after the
  heal TCP delivers it, so a request whose RPC timed out during the cut can still be applied LATE
  (unless its connection was closed or reset first); fencing, not the cut, must make that harmless.
- `inbound` (dst -> src dropped): src's segments DO arrive, dst's answers and ACKs do not. New
  connections fail (the SYN-ACK is lost). On an established connection, what src sends before its first
  retransmission timeout (Linux: 200 ms at least) reaches dst and is APPLIED while src sees a timeout:
  outcome unknown (DESIGN.md: re-read before deciding). After that, src only resends its oldest
  unacknowledged segment (congestion window 1) and nothing new leaves it. Measured here: of puts sent
  0, 100, 150, 400, 800 ms after the cut, the first three landed; the product's LeaseKeeper (TTL 3 s,
  renew 0.5 s) lost its lease one TTL after the cut, renewed at most once more. So a txn sent right after
  the cut may commit unseen, and the lease is not kept alive by an inbound cut.
- `both`: neither; in-flight requests may or may not have landed before the cut.
- A packet dropped in OUTPUT is dropped before it leaves src, and the kernel tells the sender: a UDP
  sendto() fails with EPERM; TCP treats it as a lost segment and retransmits (connect and requests time
  out, as over a real partition: no error shows at once).
- `probability` < 1: each packet is refused independently with that chance (F10's lossy link; this
  kernel has no sch_netem, so latency and jitter need the TCP fault proxy instead).
- mode `reset` instead of `drop`: the refused packet is answered with a TCP RST (REJECT tcp-reset; other
  protocols: ICMP port unreachable). The RST goes to the refused packet's sender: outbound-reset fails
  src's own sockets at once (ECONNREFUSED / ECONNRESET) and tells dst nothing; inbound-reset resets dst's
  side and leaves src waiting. A port (`dst_port`) is dst's service port and restricts the cut to TCP:
  outbound matches `--dport`, inbound `--sport`.

Processes run inside a node with `prefix(node) + argv` (`ip netns exec NS`, which execs: the pid is the
process's own, so signals by pid work). A node's servers listen on `addr(node)` (or 0.0.0.0 inside its
namespace); other nodes reach them at that address.

Cleanup. `teardown()` (also on leaving the context manager, on an exception, and from an atexit hook)
deletes every namespace of the run and its lock files. A SIGKILLed runner leaves them behind:
`cleanup_stale()` removes namespaces of runs whose owner process is gone (the lock file records its pid
and start time, so a live run of another process is never touched). Processes still inside a deleted
namespace keep running, cut off from everything: stop them first (`pids()` lists them).

Needs root, iproute2 and iptables (scripts/setup.sh installs them); `available()` says why not.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import functools
import ipaddress
import json
import logging
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

from scheduler.topology import Topology

__all__ = [
    "HARNESS",
    "RUN_PREFIX",
    "Cut",
    "Direction",
    "Mode",
    "NetError",
    "NetTopology",
    "Portal",
    "available",
    "cleanup_stale",
    "list_namespaces",
]

log = logging.getLogger(__name__)

RUN_PREFIX = "schd"  # namespace names: schd-<run id>-<node> | schd-<run id>-harness
HARNESS = "harness"  # the name of the harness namespace in prefix()/open_socket()/netns()/addr()
STATE_DIR = Path("/run/sched-netns")  # tmpfs: lock files vanish with the namespaces on reboot
BRIDGE = "br0"
_CLONE_NEWNET = 0x40000000
_SECOND_OCTETS = range(200, 250)  # 10.200.0.0/16 .. 10.249.0.0/16: 12,800 /24s to hand out
_RUN_ID = re.compile(r"^[0-9a-z]{1,8}$")
_CMD_TIMEOUT_S = 30.0

Direction = Literal["both", "inbound", "outbound"]
Mode = Literal["drop", "reset"]


class NetError(RuntimeError):
    """A namespace, link or rule could not be made or removed; says which command and why."""


# ---- commands ---------------------------------------------------------------------------------------


def _run(argv: Sequence[str], stdin: str | None = None) -> str:
    try:
        done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=_CMD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetError(f"{' '.join(argv)}: {e}") from None
    if done.returncode != 0:
        raise NetError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}"
                       + (f"\ninput:\n{stdin}" if stdin else ""))
    return done.stdout


def _run_parallel(jobs: Sequence[tuple[Sequence[str], str]]) -> None:
    """Run (argv, stdin) jobs at once and wait for all: a region-wide cut lands in every namespace
    within one command's time (a few ms) instead of one after another."""
    procs = []
    try:
        for argv, stdin in jobs:
            procs.append((argv, subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                                 stderr=subprocess.PIPE, text=True), stdin))
        errors = []
        for argv, p, stdin in procs:
            _, err = p.communicate(stdin, timeout=_CMD_TIMEOUT_S)
            if p.returncode != 0:
                errors.append(f"{' '.join(argv)} exited {p.returncode}: {err.strip()}\ninput:\n{stdin}")
        if errors:
            raise NetError("\n".join(errors))
    finally:
        for _, p, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def list_namespaces(prefix: str = RUN_PREFIX) -> list[str]:
    """Named network namespaces whose name starts with `<prefix>-` (`ip netns list`)."""
    out = _run(["ip", "netns", "list"])
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return sorted(n for n in names if n.startswith(f"{prefix}-"))


def _delete_namespaces(names: Iterable[str]) -> None:
    todo = list(names)
    if not todo:
        return
    # -force: go on past a name already gone, so one missing namespace does not keep the rest alive; what
    # is left afterwards is the verdict.
    with contextlib.suppress(NetError):
        _run(["ip", "-force", "-batch", "-"], "".join(f"netns delete {n}\n" for n in todo))
    present = {line.split()[0] for line in _run(["ip", "netns", "list"]).splitlines() if line.strip()}
    left = set(todo) & present
    if left:
        raise NetError(f"namespaces not deleted: {sorted(left)}")


# ---- entering a namespace from this process -----------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


def _in_netns(netns: str, family: int, kind: int) -> socket.socket:
    """A socket created inside `netns`. setns(CLONE_NEWNET) changes only the calling thread, so a fresh
    thread enters the namespace, makes the socket and ends: no pooled thread is ever left inside, and
    the rest of the process (grpc's threads, the event loop) stays in the host namespace."""
    result: list[socket.socket | BaseException] = []

    def enter() -> None:
        try:
            fd = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({netns}): {os.strerror(err)}")
            finally:
                os.close(fd)
            result.append(socket.socket(family, kind))
        except BaseException as e:
            result.append(e)

    t = threading.Thread(target=enter, name=f"netns-{netns}", daemon=True)
    t.start()
    t.join()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


# ---- run ownership: lock files ------------------------------------------------------------------------


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22): with the pid, it
    names one process for ever, so a recycled pid is not mistaken for a run's owner."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()[19]


def _owner_alive(state: Path) -> bool:
    try:
        d = json.loads(state.read_text())
        return bool(_start_time(int(d["pid"])) == d["start_time"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _claim(path: Path, content: str) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(content)
    return True


def cleanup_stale(prefix: str = RUN_PREFIX) -> list[str]:
    """Delete the namespaces and lock files of runs whose owner process is gone (a SIGKILLed runner or
    pytest); return the namespaces deleted. Runs of live processes, this one's included, are left alone.
    Processes still inside a deleted namespace are not killed (they keep running, cut off): a runner
    that wants them gone lists them first with `ip netns pids NAME`."""
    runs: dict[str, list[str]] = {}
    for name in list_namespaces(prefix):
        run = name[len(prefix) + 1:].split("-", 1)[0]
        runs.setdefault(run, []).append(name)
    if STATE_DIR.is_dir():
        for f in STATE_DIR.glob(f"{prefix}-*.json"):
            runs.setdefault(f.stem[len(prefix) + 1:], [])
    deleted: list[str] = []
    for run, names in sorted(runs.items()):
        state = STATE_DIR / f"{prefix}-{run}.json"
        if _owner_alive(state):
            continue
        for name in names:
            with contextlib.suppress(NetError, subprocess.SubprocessError):
                pids = _run(["ip", "netns", "pids", name]).split()
                if pids:
                    log.warning("stale namespace %s still holds processes %s (left running, cut off)", name, pids)
        _delete_namespaces(names)
        deleted += names
        _release_files(prefix, run)
    return deleted


def _release_files(prefix: str, run: str) -> None:
    if not STATE_DIR.is_dir():
        return
    for f in STATE_DIR.glob("subnet-*"):
        with contextlib.suppress(OSError):
            if f.read_text().strip() == f"{prefix}-{run}":
                f.unlink()
    # The run's own file goes last: while it exists, cleanup_stale of other processes asks its owner.
    with contextlib.suppress(FileNotFoundError):
        (STATE_DIR / f"{prefix}-{run}.json").unlink()


# ---- availability ---------------------------------------------------------------------------------------


@functools.cache
def available() -> tuple[bool, str]:
    """Whether this machine can build a run's network: Linux, root, `ip` and `iptables-restore`, and a
    probe that really makes a namespace, a bridge, a veth pair and a REJECT rule with a comment (modules
    a container may lack). (True, "") or (False, why)."""
    if sys.platform != "linux":
        return False, f"network namespaces need Linux, not {sys.platform}"
    if os.geteuid() != 0:
        return False, "network namespaces and iptables need root (run as root, or use the TCP fault proxy)"
    for tool, pkg in (("ip", "iproute2"), ("iptables-restore", "iptables"), ("iptables", "iptables")):
        if shutil.which(tool) is None:
            return False, f"{tool} not found: install {pkg} (scripts/setup.sh does)"
    try:
        with NetTopology(Topology.from_counts(["probe"], etcd_per_region=1, planners_per_region=0,
                                              workers_per_region=0)) as net:
            net.heal(net.cut("probe-e1", HARNESS, 1, mode="reset"))
    except (NetError, OSError) as e:
        return False, f"cannot build a namespace network here: {e}"
    return True, ""


# ---- the run's network ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cut:
    """A link fault in place: `rules` are (namespace, rule spec) pairs, each tagged with this cut's id."""

    id: str
    src: tuple[str, ...]  # nodes whose namespaces hold the rules
    dst: tuple[str, ...]  # addresses cut off from them
    port: int | None
    direction: Direction
    mode: Mode
    probability: float  # 1.0: every packet
    rules: tuple[tuple[str, str], ...]


_LIVE: set[NetTopology] = set()  # for the atexit backstop
_LIVE_LOCK = threading.Lock()


def _teardown_live() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for net in live:
        if net._owner_pid != os.getpid():  # a forked child exiting must not take its parent's run down
            continue
        try:
            net.teardown()
        except Exception as e:  # atexit: report and go on with the others
            log.warning("netns teardown at exit of run %s failed: %s", net.run_id, e)


atexit.register(_teardown_live)


class NetTopology:
    """One run's namespaces, addresses and cuts. Use as a (async) context manager, or create() and
    teardown() yourself (teardown is idempotent and safe after a failed create)."""

    def __init__(self, topology: Topology, *, run_id: str | None = None, name_prefix: str = RUN_PREFIX) -> None:
        run_id = run_id or secrets.token_hex(3)
        if not _RUN_ID.match(run_id):
            raise ValueError(f"run_id {run_id!r}: 1-8 lower-case letters or digits")
        if len(topology.nodes) > 253:  # .1 is the harness, .2-.254 the nodes of one /24
            raise ValueError(f"{len(topology.nodes)} nodes do not fit one /24 (at most 253)")
        self.topology = topology
        self.run_id = run_id
        self.name_prefix = name_prefix
        self.subnet: ipaddress.IPv4Network | None = None
        self._index = {n.name: i for i, n in enumerate(topology.nodes)}
        self._cuts: dict[str, Cut] = {}
        self._next_cut = 0
        self._lock = threading.Lock()
        self._created = False
        self._owner_pid = os.getpid()

    # ---- names and addresses ----------------------------------------------------------------------

    @property
    def run_name(self) -> str:
        return f"{self.name_prefix}-{self.run_id}"

    def netns(self, node: str) -> str:
        """The namespace name of a node, or of the harness (`HARNESS`)."""
        if node != HARNESS:
            self.topology.node(node)  # KeyError naming the known nodes
        return f"{self.run_name}-{node}"

    @property
    def namespaces(self) -> list[str]:
        return [self.netns(HARNESS), *(self.netns(n.name) for n in self.topology.nodes)]

    def _net(self) -> ipaddress.IPv4Network:
        if self.subnet is None:
            raise NetError(f"run {self.run_id}: create() first")
        return self.subnet

    @property
    def harness_addr(self) -> str:
        """The bridge's address in the harness namespace: where nodes reach the sink (and any harness
        server made with listen())."""
        return str(self._net()[1])

    def addr(self, node: str) -> str:
        """A node's address (or the harness's): what its servers listen on and others dial."""
        if node == HARNESS:
            return self.harness_addr
        self.topology.node(node)
        return str(self._net()[self._index[node] + 2])

    def addrs(self, target: str) -> tuple[str, ...]:
        """A node's address, a region's nodes' addresses, `HARNESS`, or an address in the run's subnet."""
        if target == HARNESS or target in self._index:
            return (self.addr(target),)
        if target in self.topology.region_names:
            return tuple(self.addr(n.name) for n in self.topology.region(target).nodes)
        try:
            a = ipaddress.IPv4Address(target)
        except ValueError:
            raise KeyError(f"{target!r} is neither a node, a region, {HARNESS!r} nor an address; nodes: "
                           f"{', '.join(self._index)}") from None
        if a not in self._net():
            raise ValueError(f"{target} is outside this run's subnet {self._net()}: a cut there means nothing")
        return (str(a),)

    def prefix(self, node: str) -> list[str]:
        """argv prefix that runs a command inside a node's (or the harness's) namespace: `ip netns exec
        NS`. It execs, so the pid Popen reports is the command's own."""
        return ["ip", "netns", "exec", self.netns(node)]

    # ---- lifecycle ----------------------------------------------------------------------------------

    def create(self) -> Self:
        if self._created:
            return self
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        state = STATE_DIR / f"{self.run_name}.json"
        me = self._owner_pid = os.getpid()
        # The ownership record first: from here on a concurrent cleanup_stale asks whether we are alive.
        if not _claim(state, json.dumps({"pid": me, "start_time": _start_time(me), "run": self.run_name})):
            raise NetError(f"run id {self.run_id} is taken ({state} exists): pick another")
        with _LIVE_LOCK:
            _LIVE.add(self)
        self._created = True
        try:
            self.subnet = self._claim_subnet()
            self._build()
        except BaseException:
            self.teardown()
            raise
        return self

    def _claim_subnet(self) -> ipaddress.IPv4Network:
        count = len(_SECOND_OCTETS) * 256
        start = zlib.crc32(self.run_name.encode()) % count
        for k in range(count):
            i = (start + k) % count
            a, b = _SECOND_OCTETS[i // 256], i % 256
            if _claim(STATE_DIR / f"subnet-10.{a}.{b}", self.run_name):
                return ipaddress.IPv4Network(f"10.{a}.{b}.0/24")
        raise NetError(f"no free subnet left under {STATE_DIR} (stale runs? cleanup_stale())")

    def _build(self) -> None:
        hub = self.netns(HARNESS)
        plen = self._net().prefixlen
        _run(["ip", "-batch", "-"], "".join(f"netns add {n}\n" for n in self.namespaces))
        lines = ["link set lo up", f"link add {BRIDGE} type bridge",
                 f"addr add {self.harness_addr}/{plen} dev {BRIDGE}", f"link set {BRIDGE} up"]
        for i, n in enumerate(self.topology.nodes):
            # Both ends are made inside our namespaces (peer ... netns): no interface ever shows in the host's.
            lines += [f"link add v{i} type veth peer name eth0 netns {self.netns(n.name)}",
                      f"link set v{i} master {BRIDGE}", f"link set v{i} up"]
        _run(["ip", "-n", hub, "-batch", "-"], "".join(f"{x}\n" for x in lines))
        _run_parallel([(["ip", "-n", self.netns(n.name), "-batch", "-"],
                        f"link set lo up\naddr add {self.addr(n.name)}/{plen} dev eth0\nlink set eth0 up\n")
                       for n in self.topology.nodes])

    def teardown(self) -> None:
        """Delete every namespace of this run (with them its veths, bridge and rules) and its lock
        files. Idempotent. Processes still inside keep running, cut off: stop them first (`pids()`)."""
        if not self._created:
            return
        try:
            mine = set(self.namespaces)
            present = [n for n in list_namespaces(self.name_prefix) if n in mine]
            _delete_namespaces(present)
        finally:
            with self._lock:
                self._cuts.clear()
            _release_files(self.name_prefix, self.run_id)
            self.subnet = None
            self._created = False
            with _LIVE_LOCK:
                _LIVE.discard(self)

    def __enter__(self) -> Self:
        return self.create()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.teardown()

    async def __aenter__(self) -> Self:
        return await asyncio.to_thread(self.create)

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        # Not to_thread: a cancelled exit must still finish deleting (shield would leave it running alone).
        self.teardown()

    def pids(self) -> dict[str, list[int]]:
        """Processes inside each of this run's namespaces (`ip netns pids`), only those that hold any."""
        out: dict[str, list[int]] = {}
        for name in self.namespaces:
            pids = [int(p) for p in _run(["ip", "netns", "pids", name]).split()]
            if pids:
                out[name] = pids
        return out

    # ---- reaching the run from the harness (this process) ---------------------------------------------

    def open_socket(self, node: str = HARNESS, family: int = socket.AF_INET,
               kind: int = socket.SOCK_STREAM) -> socket.socket:
        """A socket made inside a node's (default: the harness's) namespace; bind/connect it as usual."""
        self._net()
        return _in_netns(self.netns(node), family, kind)

    def listen(self, port: int = 0, node: str = HARNESS, backlog: int = 128) -> socket.socket:
        """A listening TCP socket on addr(node):port inside that namespace (port 0: the kernel picks;
        read it back with getsockname). For the effect sink: `web.SockSite(app_runner, net.listen())`."""
        s = self.open_socket(node)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((self.addr(node), port))
            s.listen(backlog)
        except BaseException:
            s.close()
            raise
        s.setblocking(False)
        return s

    def portal(self, node: str, port: int, *, connect_timeout_s: float = 5.0) -> Portal:
        """A forwarder 127.0.0.1:<free port> (host namespace) -> addr(node):port, dialled from the harness
        namespace: `async with net.portal("r1-e1", 2379) as p: EtcdConfig(endpoints=(p.endpoint,))`."""
        return Portal(self, node, port, connect_timeout_s)

    # ---- link faults --------------------------------------------------------------------------------

    def _sources(self, src: str) -> tuple[str, ...]:
        if src in self._index:
            return (src,)
        if src in self.topology.region_names:
            return tuple(n.name for n in self.topology.region(src).nodes)
        if src == HARNESS:
            raise ValueError("the harness is outside every fault: cut from the nodes' side instead")
        raise KeyError(f"{src!r} is neither a node nor a region; nodes: {', '.join(self._index)}")

    def _targets(self, dst: str | Sequence[str], sources: tuple[str, ...]) -> tuple[str, ...]:
        if dst == "*":  # every other node of the run; the harness stays reachable
            return tuple(self.addr(n) for n in self._index if n not in sources)
        names = [dst] if isinstance(dst, str) else list(dst)
        out: list[str] = []
        for d in names:
            out += [a for a in self.addrs(d) if a not in out]
        return tuple(out)

    def cut(self, src: str, dst: str | Sequence[str], dst_port: int | None = None, *,
            direction: Direction = "both", mode: Mode = "drop", probability: float = 1.0) -> Cut:
        """Cut `src` (a node, or a region: each of its nodes) off from `dst` (node, region, `HARNESS`,
        address, a list of those, or `*`: every other node). `dst_port` is dst's service port (TCP only);
        None: all traffic. `direction` is seen from src: outbound = src->dst packets refused, inbound =
        dst->src refused (see the module docstring for what that does to TCP). `probability` < 1 refuses
        each packet independently with that chance (F10's lossy link; TCP retransmits, so it shows as
        latency spikes and, at high rates, timeouts). In force when this returns."""
        if direction not in ("both", "inbound", "outbound"):
            raise ValueError(f"direction {direction!r}: both, inbound or outbound")
        if mode not in ("drop", "reset"):
            raise ValueError(f"mode {mode!r}: drop or reset")
        if dst_port is not None and not 0 < dst_port < 65536:
            raise ValueError(f"dst_port {dst_port}: 1-65535")
        if not 0.0 < probability <= 1.0:
            raise ValueError(f"probability {probability}: in (0, 1]")
        sources = self._sources(src)
        targets = self._targets(dst, sources)
        if not targets:
            raise ValueError(f"cut {src} -> {dst}: no address to cut")
        with self._lock:
            self._next_cut += 1
            cut_id = f"{self.run_name}:{self._next_cut}"
        specs = _rule_specs(cut_id, targets, dst_port, direction, mode, probability)
        rules = tuple((self.netns(s), spec) for s in sources for spec in specs)
        cut = Cut(cut_id, sources, targets, dst_port, direction, mode, probability, rules)
        self._apply(rules, "-A")
        with self._lock:
            self._cuts[cut_id] = cut
        return cut

    def heal(self, cut: Cut) -> None:
        """Remove exactly this cut's rules (others stay). Healed when this returns; a second heal is a no-op."""
        with self._lock:
            if self._cuts.pop(cut.id, None) is None:
                return
        self._apply(cut.rules, "-D")

    def heal_all(self) -> None:
        with self._lock:
            cuts = list(self._cuts.values())
        for c in cuts:
            self.heal(c)

    @property
    def cuts(self) -> tuple[Cut, ...]:
        with self._lock:
            return tuple(self._cuts.values())

    async def acut(self, src: str, dst: str | Sequence[str], dst_port: int | None = None, *,
                   direction: Direction = "both", mode: Mode = "drop", probability: float = 1.0) -> Cut:
        """cut() off the event loop (it runs one iptables-restore per namespace, a few ms each)."""
        return await asyncio.to_thread(self.cut, src, dst, dst_port, direction=direction, mode=mode,
                                       probability=probability)

    async def aheal(self, cut: Cut) -> None:
        await asyncio.to_thread(self.heal, cut)

    async def aheal_all(self) -> None:
        await asyncio.to_thread(self.heal_all)

    def _apply(self, rules: Sequence[tuple[str, str]], op: str) -> None:
        per_ns: dict[str, list[str]] = {}
        for ns, spec in rules:
            per_ns.setdefault(ns, []).append(f"{op} {spec}")
        _run_parallel([(["ip", "netns", "exec", ns, "iptables-restore", "--noflush"],
                        "*filter\n" + "".join(f"{x}\n" for x in lines) + "COMMIT\n")
                       for ns, lines in per_ns.items()])

    def rules(self, node: str) -> list[str]:
        """The filter rules now in a node's namespace (`iptables -S`, rules only): for tests and reports."""
        out = _run([*self.prefix(node), "iptables", "-S"])
        return [line for line in out.splitlines() if line.startswith("-A ")]


def _rule_specs(cut_id: str, targets: Sequence[str], port: int | None, direction: Direction,
                mode: Mode, probability: float = 1.0) -> list[str]:
    # iptables prints the probability back rounded (0.3 -> 0.29999999981); deletion matches by value,
    # so the text we add and the text we delete are the same string either way.
    chance = f"-m statistic --mode random --probability {probability:.6f} " if probability < 1.0 else ""
    tag = f'{chance}-m comment --comment "{cut_id}"'
    specs: list[str] = []
    for chain, peer, port_opt in (("OUTPUT", "-d", "--dport"), ("INPUT", "-s", "--sport")):
        if direction == ("inbound" if chain == "OUTPUT" else "outbound"):
            continue
        # An OUTPUT REJECT's RST reaches the local socket through INPUT, source = the cut peer: an INPUT
        # reset rule must let RSTs by, or under "both" it eats the very reset that fails the socket fast.
        no_rst = " ! --tcp-flags RST RST" if chain == "INPUT" else ""
        for a in targets:
            base = f"{chain} {peer} {a}/32"
            if port is not None:
                tcp = f"{base} -p tcp {port_opt} {port}{no_rst if mode == 'reset' else ''} {tag}"
                specs.append(f"{tcp} -j DROP" if mode == "drop" else f"{tcp} -j REJECT --reject-with tcp-reset")
            elif mode == "drop":
                specs.append(f"{base} {tag} -j DROP")
            else:
                specs += [f"{base} -p tcp{no_rst} {tag} -j REJECT --reject-with tcp-reset",
                          f"{base} ! -p tcp {tag} -j REJECT"]
    return specs


# ---- the portal: host loopback -> a node, through the harness namespace ------------------------------------


class Portal:
    """Listens on 127.0.0.1 in the host namespace; each connection is forwarded to addr(node):port over a
    socket made in the harness namespace, so it is harness traffic (never faulted)."""

    def __init__(self, net: NetTopology, node: str, port: int, connect_timeout_s: float) -> None:
        self.net = net
        self.node = node
        self.target = (net.addr(node), port)
        self.connect_timeout_s = connect_timeout_s
        self.host = "127.0.0.1"
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def close(self) -> None:
        """Stop listening and end every forwarded connection. The connections are closed, not their
        tasks cancelled: a cancelled stream-server callback is logged by asyncio as an error (I8)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._writers):
            w.close()
        if self._pumps:
            await asyncio.wait(list(self._pumps), timeout=5.0)

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._pumps.add(task)
        self._writers.add(writer)
        try:
            s = await asyncio.to_thread(self.net.open_socket, HARNESS)
            s.setblocking(False)
            loop = asyncio.get_running_loop()
            try:
                await asyncio.wait_for(loop.sock_connect(s, self.target), self.connect_timeout_s)
            except (OSError, TimeoutError):
                s.close()  # the caller sees its connection closed: as good as a refusal
                return
            up_r, up_w = await asyncio.open_connection(sock=s)
            self._writers.add(up_w)
            try:
                await _pump_both(reader, writer, up_r, up_w)
            finally:
                up_w.close()
                self._writers.discard(up_w)
        finally:
            writer.close()
            self._writers.discard(writer)
            self._pumps.discard(task)


async def _pump_both(r1: asyncio.StreamReader, w1: asyncio.StreamWriter, r2: asyncio.StreamReader,
                     w2: asyncio.StreamWriter) -> None:
    async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, RuntimeError):  # RuntimeError: write to a closed transport
            while data := await r.read(65536):
                w.write(data)
                await w.drain()

    # Either side ending ends the conversation (gRPC and HTTP never half-close in practice).
    tasks = [asyncio.ensure_future(pump(r1, w2)), asyncio.ensure_future(pump(r2, w1))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
