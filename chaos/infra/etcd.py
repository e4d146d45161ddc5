"""Real etcd processes for tests: one member or an N-member cluster on free loopback ports.

etcd cannot listen on port 0 and report the port (its peer and client URLs are part of the cluster's
membership), so members get ports from chaos/infra/ports.py's `pick_port()` (outside the kernel's
ephemeral range), and a member that exits because a port was taken meanwhile is started again: a
new cluster on new ports, or a restarted member on its own ports (they are in its stored
membership) after a pause, a bounded number of times.

Everything started here is stopped by pid (never by name): by `EtcdCluster.close()` from fixture
finalizers, by an atexit hook as a backstop, and on Linux by a parent-death signal (setpriv
--pdeathsig) so that even a SIGKILLed pytest leaves no etcd behind.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.infra.ports import is_bind_error, pick_port
from chaos.infra.procs import forget, freeze, spawn
from scheduler.store.etcd import EtcdConfig

log = logging.getLogger(__name__)

ETCD_MISSING = (
    "etcd binary not found: set SCHED_ETCD_BIN to an etcd 3.5 binary, or run scripts/setup.sh "
    "(it installs .venv/bin/etcd). Tests marked `etcd` need a real server."
)

EtcdFactory = Callable[..., "EtcdCluster"]  # the `etcd_factory` fixture: options -> started cluster

# Start-ups lost to a taken port before giving up: each loss needs another process to bind the very
# port picked in the second or so before etcd binds it, so more than one in a row means a real problem.
BIND_ATTEMPTS = 5

# etcd's strict reconfiguration check refuses a member remove or add ("unhealthy cluster") until every
# remaining voter has been connected to its peers for 5 s (etcdserver's HealthInterval): right after a
# start or a restart that is a wait, not an error.
RECONFIG_WAIT_S = 15.0
_RECONFIG_TRANSIENT = ("unhealthy cluster", "not enough started members", "timed out", "leader changed",
                       "no leader", "too many requests", "deadline exceeded")


class PortInUse(RuntimeError):
    """An etcd member exited because one of its listen addresses was taken."""


def find_binary(name: str = "etcd") -> str | None:
    """$SCHED_ETCD_BIN (etcdctl: its sibling), then next to sys.executable (.venv/bin), then PATH."""
    env = os.environ.get("SCHED_ETCD_BIN")
    if env:
        path = Path(env) if name == "etcd" else Path(env).with_name(name)
        return str(path) if os.access(path, os.X_OK) else None
    beside = Path(sys.executable).parent / name
    if os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


def free_port() -> int:
    """A port to tell a server to listen on (chaos/infra/ports.py); a server that can bind port 0 and report
    it should do that instead, and "nothing listens here" is `unused_port()`."""
    return pick_port()


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_tls_files(directory: Path) -> TlsFiles:
    """A throw-away CA, a server certificate for 127.0.0.1/localhost and a client certificate
    (openssl CLI: the `cryptography` package is not a dependency of this project)."""
    directory.mkdir(parents=True, exist_ok=True)
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("openssl CLI not found; TLS tests need it to make certificates")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=directory, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=sched-test-ca",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ):
        (directory / f"{name}.ext").write_text(ext)
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=sched-test-{name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")
    d = directory
    return TlsFiles(d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key")


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    log_start: int = 0  # where this process's lines begin in log_path (a restart appends)
    # The node this member stands for: a member that replaced another (F12) has a new etcd name but
    # the same slot (in a namespace run, the same node's namespace and address).
    slot: str = ""
    # `new` for the members the cluster was bootstrapped with; `existing` for one added later with
    # `member add` (it joins the running cluster instead of bootstrapping one).
    cluster_state: str = "new"
    generation: int = 0  # how many members this slot had before this one (F12 replacements)
    removed: bool = False  # removed from the membership (F12); not restarted, not waited for

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} is not running"
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass(frozen=True)
class MemberInfo:
    """One entry of `etcdctl member list`: a member without a name has been added but never started."""

    id: int
    name: str
    peer_urls: tuple[str, ...]
    client_urls: tuple[str, ...]
    is_learner: bool

    @property
    def hex_id(self) -> str:
        return format(self.id, "x")  # etcdctl takes member ids in hex and prints them in decimal in JSON

    @staticmethod
    def from_json(d: dict[str, Any]) -> MemberInfo:
        return MemberInfo(int(d["ID"]), str(d.get("name", "")), tuple(d.get("peerURLs", ())),
                          tuple(d.get("clientURLs", ())), bool(d.get("isLearner", False)))


@dataclass
class EtcdCluster:
    """An etcd cluster of `size` members under `base_dir`. Call start(); always close()."""

    base_dir: Path
    size: int = 1
    binary: str | None = None
    auto_compaction_mode: str | None = None  # "periodic" | "revision"
    auto_compaction_retention: str | None = None  # e.g. "1h", "1000"
    progress_notify_interval: str | None = None  # --experimental-watch-progress-notify-interval, e.g. "500ms"
    quota_backend_bytes: int | None = None
    auth_token_ttl: int | None = None  # seconds a simple auth token lives without use
    tls: TlsFiles | None = None
    client_cert_auth: bool = False  # mTLS: require client certificates signed by tls.ca
    unsafe_no_fsync: bool = False
    extra_args: Sequence[str] = ()
    members: list[Member] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.binary = self.binary or find_binary("etcd")
        if self.binary is None:
            raise RuntimeError(ETCD_MISSING)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.members = [
            Member(f"m{i}", pick_port(), pick_port(), self.base_dir / f"m{i}.etcd", self.base_dir / f"m{i}.log",
                   slot=f"m{i}")
            for i in range(self.size)
        ]
        self.bind_retries = 0  # start-ups lost to a taken port (for the record: logs keep each attempt)

    # ---- addresses and clients ------------------------------------------------------------------

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def endpoints(self) -> tuple[str, ...]:
        return tuple(m.endpoint for m in self.members)

    def config(self, **overrides: Any) -> EtcdConfig:
        """Client settings for this cluster (TLS files included when the cluster uses TLS)."""
        settings: dict[str, Any] = {"endpoints": self.endpoints}
        if self.tls:
            settings["ca_file"] = str(self.tls.ca)
            if self.client_cert_auth:
                settings["cert_file"] = str(self.tls.client_cert)
                settings["key_file"] = str(self.tls.client_key)
        settings.update(overrides)
        return EtcdConfig(**settings)

    # ---- lifecycle ------------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> EtcdCluster:
        """Start every member and wait until all are healthy. A member that lost a port to another
        process makes the whole cluster start over on new ports (each member's peer URL is in every
        member's --initial-cluster), with fresh data dirs."""
        try:
            for attempt in range(1, BIND_ATTEMPTS + 1):
                for m in self.members:
                    self._spawn(m)
                try:
                    self.wait_healthy(timeout=timeout)
                    return self
                except PortInUse:
                    if attempt == BIND_ATTEMPTS:
                        raise
                    self._start_over()
        except BaseException:
            self.close()
            raise
        return self

    def _start_over(self) -> None:
        self.close()
        self.bind_retries += 1
        for m in self.members:
            shutil.rmtree(m.data_dir, ignore_errors=True)
            if m.log_path.exists():  # kept for diagnosis, next to the new one
                m.log_path.rename(m.log_path.with_suffix(f".bind{self.bind_retries}.log"))
            m.client_port, m.peer_port = pick_port(), pick_port()

    def _client_url(self, m: Member) -> str:
        return f"{self.scheme}://127.0.0.1:{m.client_port}"

    def _launcher(self, m: Member) -> list[str]:
        """What the etcd command line is run under (a subclass: `ip netns exec NS`)."""
        return []

    def _cluster_token(self) -> str:
        return f"sched-test-{id(self):x}"

    def _args(self, m: Member) -> list[str]:
        """One member's command line: the addresses from the hooks above, every setting of this cluster
        after them (the same for every subclass: one list of flags, not one per place etcd runs)."""
        assert self.binary is not None
        initial = ",".join(f"{x.name}={self._peer_url(x)}" for x in self.members if not x.removed)
        client_url = self._client_url(m)
        args = [
            *self._launcher(m), self.binary,
            f"--name={m.name}",
            f"--data-dir={m.data_dir}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={self._peer_url(m)}",
            f"--initial-advertise-peer-urls={self._peer_url(m)}",
            f"--initial-cluster={initial}",
            f"--initial-cluster-state={m.cluster_state}",
            f"--initial-cluster-token={self._cluster_token()}",
            "--log-level=warn",
        ]
        if self.auto_compaction_mode:
            args.append(f"--auto-compaction-mode={self.auto_compaction_mode}")
        if self.auto_compaction_retention:
            args.append(f"--auto-compaction-retention={self.auto_compaction_retention}")
        if self.progress_notify_interval:
            args.append(f"--experimental-watch-progress-notify-interval={self.progress_notify_interval}")
        if self.quota_backend_bytes:
            args.append(f"--quota-backend-bytes={self.quota_backend_bytes}")
        if self.auth_token_ttl:
            args.append(f"--auth-token-ttl={self.auth_token_ttl}")
        if self.tls:
            args += [f"--cert-file={self.tls.server_cert}", f"--key-file={self.tls.server_key}"]
            if self.client_cert_auth:
                args += ["--client-cert-auth", f"--trusted-ca-file={self.tls.ca}"]
        if self.unsafe_no_fsync:
            args.append("--unsafe-no-fsync")
        return [*args, *self.extra_args]

    def _spawn(self, m: Member) -> None:
        if m.running:
            raise RuntimeError(f"{m.name} is already running (pid {m.pid})")
        m.log_start = m.log_path.stat().st_size if m.log_path.exists() else 0
        m.process = spawn(self._args(m), m.log_path)
        m.paused = False

    def kill(self, i: int) -> None:
        """SIGKILL member i (no graceful shutdown; its data dir stays for restart())."""
        self._signal_and_reap(self.members[i], signal.SIGKILL)

    def stop(self, i: int, timeout: float = 10.0) -> None:
        """SIGTERM member i and wait; SIGKILL if it does not exit in time."""
        m = self.members[i]
        if not m.running:
            return
        os.kill(m.pid, signal.SIGTERM)
        if m.paused:
            os.kill(m.pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        try:
            assert m.process is not None
            m.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal_and_reap(m, signal.SIGKILL)
        forget(m.pid)

    def restart(self, i: int, timeout: float = 30.0) -> None:
        """Start member i again with the same name, ports and data dir (kills it first if running)."""
        m = self.members[i]
        if m.removed:
            raise RuntimeError(f"{m.name} was removed from the membership: add_member({i}) refills its slot")
        if m.running:
            self.kill(i)
        for attempt in range(1, BIND_ATTEMPTS + 1):
            self._spawn(m)
            try:
                self.wait_healthy([i], timeout=timeout)
                return
            except PortInUse:
                # Its ports are in its stored membership and in clients' endpoint lists: wait for
                # whoever holds one to let go, rather than move.
                if attempt == BIND_ATTEMPTS:
                    raise
                self.bind_retries += 1
                time.sleep(0.5 * attempt)

    def pause(self, i: int) -> None:
        m = self.members[i]
        freeze(m.pid)
        m.paused = True

    def resume(self, i: int) -> None:
        m = self.members[i]
        os.kill(m.pid, signal.SIGCONT)
        m.paused = False

    def close(self) -> None:
        for m in self.members:
            if m.running:
                self._signal_and_reap(m, signal.SIGKILL)

    def _signal_and_reap(self, m: Member, sig: signal.Signals) -> None:
        if m.process is None:
            return
        if m.process.poll() is None:
            os.kill(m.pid, sig)
            m.process.wait()
        forget(m.pid)
        m.paused = False

    # ---- health ---------------------------------------------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        ctx = ssl.create_default_context(cafile=str(self.tls.ca))
        if self.client_cert_auth:
            ctx.load_cert_chain(str(self.tls.client_cert), str(self.tls.client_key))
        return ctx

    def healthy(self, i: int) -> bool:
        """etcd's own /health: true once the member has a leader and serves requests."""
        m = self.members[i]
        url = f"{self.scheme}://127.0.0.1:{m.client_port}/health"
        try:
            with urllib.request.urlopen(url, timeout=1.0, context=self._ssl_context()) as resp:
                return bool(json.load(resp).get("health") == "true")
        except (OSError, ValueError):
            return False

    def wait_healthy(self, indexes: Sequence[int] | None = None, timeout: float = 30.0) -> None:
        # A member removed from the membership (F12) has no process to wait for until its slot is refilled.
        wanted = [i for i in range(self.size) if not self.members[i].removed] if indexes is None else list(indexes)
        deadline = time.monotonic() + timeout
        while True:
            for i in wanted:
                m = self.members[i]
                if m.process is not None and m.process.poll() is not None:
                    tail = _tail(m.log_path, start=m.log_start)
                    kind = PortInUse if is_bind_error(tail) else RuntimeError
                    raise kind(f"etcd {m.name} exited with {m.process.returncode}; see {m.log_path}:\n{tail}")
            if all(self.healthy(i) for i in wanted):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"etcd members {wanted} not healthy after {timeout}s; logs in {self.base_dir}")
            time.sleep(0.05)

    # ---- etcdctl --------------------------------------------------------------------------------

    def etcdctl(self, *args: str, user: str | None = None, member: int | None = None) -> str:
        """Run etcdctl against the cluster (or one member) and return its stdout."""
        binary = find_binary("etcdctl")
        if binary is None:
            raise RuntimeError("etcdctl not found next to etcd")
        endpoints = [self.members[member]] if member is not None else self._reachable()
        argv = [binary, "--endpoints=" + ",".join(f"{self.scheme}://{m.endpoint}" for m in endpoints)]
        if self.tls:
            argv.append(f"--cacert={self.tls.ca}")
            if self.client_cert_auth:
                argv += [f"--cert={self.tls.client_cert}", f"--key={self.tls.client_key}"]
        if user:
            argv.append(f"--user={user}")
        done = subprocess.run([*argv, *args], capture_output=True, text=True, timeout=30,
                              env={**os.environ, "ETCDCTL_API": "3"})
        if done.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout


    def _reachable(self) -> list[Member]:
        """The members etcdctl may dial: not those removed from the membership (their endpoints are gone,
        and etcdctl would spend its dial timeout on one)."""
        return [m for m in self.members if not m.removed] or list(self.members)

    # ---- membership (F12: etcd's MemberReplace, Jepsen's `member` nemesis) ------------------------

    def _peer_url(self, m: Member) -> str:
        return f"http://127.0.0.1:{m.peer_port}"

    def _replacement_ports(self, old: Member) -> tuple[int, int]:
        """Client and peer ports for the member that refills `old`'s slot. On loopback: new ones. The old
        ones are free only as long as nobody else took them, and a member added with a new peer URL is what
        a real replacement (a new machine) looks like; clients reach it through whatever re-resolves the
        slot's address (the drills' per-planner proxies are re-pointed: chaos/proxy_links.py)."""
        return pick_port(), pick_port()

    @property
    def _ports_movable(self) -> bool:
        """Whether a member that lost its port to another process may move to another (loopback: yes)."""
        return True

    def member_list(self) -> list[MemberInfo]:
        out = json.loads(self.etcdctl("member", "list", "-w", "json"))
        return [MemberInfo.from_json(d) for d in out.get("members", [])]

    def member_index(self, name: str) -> int | None:
        """The slot of the member called `name` now (a replacement keeps its predecessor's slot)."""
        return next((i for i, m in enumerate(self.members) if m.name == name), None)

    def _reconfig(self, *args: str, timeout: float = RECONFIG_WAIT_S) -> str:
        """A membership change through etcdctl, retried while etcd calls it premature (the strict
        reconfiguration check, an election under way): see RECONFIG_WAIT_S."""
        deadline = time.monotonic() + timeout
        pause = 0.25
        while True:
            try:
                return self.etcdctl(*args)
            except RuntimeError as e:
                transient = any(t in str(e).lower() for t in _RECONFIG_TRANSIENT)
                if not transient or time.monotonic() + pause > deadline:
                    raise
                log.info("etcd reconfiguration %s refused for now, retrying: %s", args[:2], str(e)[-200:])
                time.sleep(pause)
                pause = min(pause * 2, 2.0)

    def leader_id(self) -> int:
        """The leader's member id as the reachable members see it (0: none agreed on yet)."""
        leaders = {int(st.get("leader", 0)) for st in self.endpoint_status().values()}
        return leaders.pop() if len(leaders) == 1 else 0

    def move_leader(self, away_from: int, to: MemberInfo, timeout: float = RECONFIG_WAIT_S) -> None:
        """`etcdctl move-leader`: leadership handed to `to` (etcd's own graceful stop does this), then wait
        until the members agree it leads."""
        self._reconfig("move-leader", to.hex_id, timeout=timeout)
        deadline = time.monotonic() + timeout
        while self.leader_id() in (0, away_from):
            if time.monotonic() > deadline:
                raise TimeoutError(f"leadership did not move from {away_from:x} to {to.hex_id}")
            time.sleep(0.1)

    def remove_member(self, i: int, timeout: float = RECONFIG_WAIT_S, *, move_leader: bool = True) -> MemberInfo:
        """`etcdctl member remove` of member i, then its process gone (by pid) and its data dir wiped: the
        first half of a replacement. Refused (ValueError) when the members left would not hold a quorum of
        the smaller cluster among them healthy: that would be an outage (F4 with 2 members), not a
        membership change.

        If member i leads, leadership is first moved to a healthy member (`move_leader`, as an operator's
        runbook and etcd's graceful stop do); otherwise the survivors sit out an election timeout and more
        after the removal (measured on a loaded 2-core machine: ~5 s of refused or stalled requests, the
        next reconfiguration timing out). `move_leader=False` removes the leader as it is."""
        m = self.members[i]
        if m.removed:
            raise ValueError(f"{m.name} is already removed")
        infos = self.member_list()
        me = next((x for x in infos if x.name == m.name), None)
        if me is None:
            raise RuntimeError(f"{m.name} is not in the membership: {[x.name for x in infos]}")
        healthy = {x.name for j, x in enumerate(self.members)
                   if j != i and not x.removed and x.running and not x.paused and self.healthy(j)}
        left = [x for x in infos if x.id != me.id and not x.is_learner]
        quorum = len(left) // 2 + 1
        alive = sum(1 for x in left if x.name in healthy)
        if alive < quorum:
            raise ValueError(f"removing {m.name} would leave {alive} healthy voter(s) of {len(left)}, below the "
                             f"quorum of {quorum}")
        if move_leader and self.leader_id() == me.id:
            self.move_leader(me.id, next(x for x in left if x.name in healthy), timeout=timeout)
        try:
            self._reconfig("member", "remove", me.hex_id, timeout=timeout)
        except RuntimeError:
            # A remove that timed out may still have been applied; the retry then finds no such member.
            if any(x.id == me.id for x in self.member_list()):
                raise
        m.removed = True
        # A removed member stops itself once it applies its own removal (exit 0, measured: < 0.1 s); one
        # that never hears of it (cut off, stopped) is killed, so that it cannot come back as a rogue voter.
        deadline = time.monotonic() + 3.0
        while m.running and time.monotonic() < deadline:
            time.sleep(0.05)
        self._signal_and_reap(m, signal.SIGKILL)
        shutil.rmtree(m.data_dir, ignore_errors=True)
        return me

    def add_member(self, i: int, *, name: str | None = None,
                   timeout: float = 60.0) -> tuple[MemberInfo, dict[str, Any]]:
        """Refill slot i (its member removed) with a fresh member: `etcdctl member add` (a voter, not a
        learner), a new etcd name (`<slot>-new<n>` unless `name`), an empty data dir, started with
        --initial-cluster-state=existing; returns once it is healthy and has caught up (`wait_caught_up`),
        with its membership entry and what the catch-up check saw."""
        old = self.members[i]
        if not old.removed:
            raise ValueError(f"{old.name} is still a member: remove_member({i}) first")
        gen = old.generation + 1
        slot = old.slot or old.name
        new = name or f"{slot}-new{gen}"
        client, peer = self._replacement_ports(old)
        m = Member(new, client, peer, self.base_dir / f"{new}.etcd", self.base_dir / f"{new}.log", slot=slot,
                   cluster_state="existing", generation=gen)
        shutil.rmtree(m.data_dir, ignore_errors=True)
        info = self._member_add(m)
        self.members[i] = m
        for attempt in range(1, BIND_ATTEMPTS + 1):
            self._spawn(m)
            try:
                self.wait_healthy([i], timeout=timeout)
                break
            except PortInUse:
                if attempt == BIND_ATTEMPTS:
                    raise
                self.bind_retries += 1
                shutil.rmtree(m.data_dir, ignore_errors=True)  # it never joined: nothing in it to keep
                if self._ports_movable:
                    # Its peer URL is in the membership already: move it there too before starting again.
                    m.client_port, m.peer_port = pick_port(), pick_port()
                    self._reconfig("member", "update", info.hex_id, f"--peer-urls={self._peer_url(m)}")
                else:
                    time.sleep(0.5 * attempt)
        seen = self.wait_caught_up(i, timeout=timeout)
        final = next((x for x in self.member_list() if x.id == info.id), info)
        return final, seen

    def _member_add(self, m: Member) -> MemberInfo:
        url = self._peer_url(m)
        try:
            out = json.loads(self._reconfig("member", "add", m.name, f"--peer-urls={url}", "-w", "json"))
            return MemberInfo.from_json(out["member"])
        except RuntimeError:
            # An add that timed out may still have been applied: its retry then finds the peer URL taken.
            for x in self.member_list():
                if url in x.peer_urls:
                    return x
            raise

    def endpoint_status(self) -> dict[int, dict[str, Any]]:
        """`etcdctl endpoint status` of each reachable member (asked one at a time: one member down must not
        hide the others' answers), by member id."""
        out: dict[int, dict[str, Any]] = {}
        for j, m in enumerate(self.members):
            if m.removed or not m.running:
                continue
            try:
                rows = json.loads(self.etcdctl("endpoint", "status", "-w", "json", member=j))
            except (RuntimeError, ValueError):
                continue
            for row in rows:
                st = row.get("Status", {})
                out[int(st.get("header", {}).get("member_id", 0))] = st
        return out

    def wait_caught_up(self, i: int, timeout: float = 60.0) -> dict[str, Any]:
        """Until member i is a started voter (named in the membership, not a learner) that has applied
        everything the leader had in its log when the wait began (`raftAppliedIndex` against the leader's
        `raftIndex`, from `endpoint status`), agreeing with the others on who leads. Returns what it saw."""
        m = self.members[i]
        deadline = time.monotonic() + timeout
        target: int | None = None
        last = "no status yet"
        while True:
            try:
                me = next((x for x in self.member_list() if x.name == m.name), None)
                status = self.endpoint_status()
            except (RuntimeError, ValueError) as e:
                me, status, last = None, {}, str(e)
            mine = status.get(me.id) if me is not None else None
            if me is not None and mine is not None:
                leader = int(mine.get("leader", 0))
                lead = status.get(leader)
                if lead is not None and target is None:
                    target = int(lead.get("raftIndex", 0))
                applied = int(mine.get("raftAppliedIndex", 0))
                agree = all(int(st.get("leader", 0)) == leader for st in status.values())
                learner = me.is_learner or bool(mine.get("isLearner", False))
                if target is not None and not learner and agree and leader != 0 and applied >= target:
                    return {"id": me.id, "name": me.name, "voting": True, "applied_index": applied,
                            "leader_index": target, "leader": format(leader, "x")}
                last = (f"learner={learner} leader={leader:x} agreed={agree} applied={applied} "
                        f"target={target}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"etcd {m.name} did not catch up within {timeout}s: {last}")
            time.sleep(0.2)


def _tail(path: Path, lines: int = 20, start: int = 0) -> str:
    try:
        with path.open("rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])
    except OSError:
        return "(no log)"
