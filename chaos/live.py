"""A drill's cluster as real processes: etcd members, `schedctl planner`s, `schedctl worker`s, and the
harness's own parts that no fault touches (the effect sink, the etcd watcher, an etcd client).

`LiveCluster` starts and stops everything (by pid), knows each node's current process and address,
and answers the health questions the runner asks between faults (`health()`): etcd healthy, every
partition owned by a planner that is running and not frozen, every checkpoint fresh, the workers
connected. Health gates the faults; it is not the verdict: the checker judges the recorded files only.

Links (planner <-> etcd) go through `links` (chaos/links.py): on loopback each planner dials etcd
through its own fault proxy, so that a partition, a flaky link or a held txn affects that planner alone.

Where processes run and how the harness reaches them is `network` (chaos/netns_cluster.py): loopback
(the default), or a network namespace per node with the harness's parts outside them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from chaos.infra.etcd import EtcdCluster
from chaos.infra.planners import PlannerProcess, PlannerSet
from chaos.infra.workers import WorkerProcess
from chaos.links import Links
from chaos.netns_cluster import ClusterNetwork, LoopbackNetwork
from chaos.record import RunWriter, WatchProgress, record_watch
from chaos.scenario import Scenario
from chaos.sink import EffectSink
from scheduler.clock import SYSTEM_CLOCK
from scheduler.region import policy as rp
from scheduler.region import store as rstore
from scheduler.store.etcd import EtcdClient, EtcdError
from scheduler.store.keyspace import Keyspace

__all__ = ["Health", "LiveCluster", "PlannerClocks", "planner_settings"]


class PlannerClocks(Protocol):
    """Per-node wall-clock offsets (libfaketime, chaos/clock.py): the environment a planner or worker
    starts with, and the offset changed while it runs (F6). Monotonic time is never faked."""

    def env_for(self, node: str) -> dict[str, str]: ...

    def set_offset(self, node: str, seconds: float) -> None: ...

PREFIX = "/drill"


def planner_settings(s: Scenario) -> dict[str, str]:
    """The planners' timing flags from the scenario's TTL: the drills' FAST ratios (renew 1/4, rpc 1/5,
    margin 3/20 of the TTL), so renew + 2 x rpc_timeout <= TTL - margin holds at any TTL."""
    ttl = s.cluster.lease_ttl_s
    out = {
        "lease_ttl": f"{ttl:g}",
        "renew_interval": f"{s.cluster.renew_interval_s:g}",
        "rpc_timeout": f"{ttl / 5:g}",
        "safety_margin": f"{ttl * 0.15:g}",
        "loop_interval": "0.05",
        "api_port": "0",
        "metrics_address": "127.0.0.1:0",
    }
    out.update({k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in s.cluster.planner.items()})
    return out


def _member_node(value: bytes) -> str:
    """The node of a member record (`MemberInfo`, planner/ownership.py)."""
    try:
        return str(json.loads(value)["node_id"])
    except (ValueError, KeyError, TypeError):
        return ""


def _owner_node(value: bytes) -> str:
    """The node named by an owner key's value (`{"node": ..., "lease": ...}`, planner/ownership.py)."""
    try:
        return str(json.loads(value)["node"])
    except (ValueError, KeyError, TypeError):
        return value.decode(errors="replace")


@dataclass
class Health:
    ok: bool
    problems: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return "healthy" if self.ok else "; ".join(self.problems)


@dataclass
class LiveCluster:
    scenario: Scenario
    directory: Path
    rec: RunWriter
    links: Links
    unsafe_fencing_off: bool = False  # meta-tests only (SCHED_TEST_MODE=1): planners write without fence
    env: dict[str, str] = field(default_factory=dict)  # extra environment for planners
    clock: PlannerClocks | None = None  # F6: None when libfaketime is not available
    network: ClusterNetwork = field(default_factory=LoopbackNetwork)  # loopback | netns
    # F9: each planner's duplicate-delivery control file lives here (test mode); None: no planner gets the switch.
    duplicate_dir: Path | None = None
    unsafe_dedupe_off: bool = False  # meta-tests only (SCHED_TEST_MODE=1): workers run repeated assignments
    etcd: EtcdCluster | None = None
    planners: PlannerSet | None = None
    workers: dict[str, WorkerProcess] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)  # planner -> API address (last bound)
    sink: EffectSink | None = None
    sink_url: str = ""
    kv: EtcdClient | None = None
    ks: Keyspace = field(default_factory=lambda: Keyspace(PREFIX))
    _watch_stop: asyncio.Event = field(default_factory=asyncio.Event)
    _watcher: asyncio.Task[int] | None = None
    watch_progress: WatchProgress = field(default_factory=WatchProgress)

    # ---- start --------------------------------------------------------------------------------

    async def start(self) -> None:
        c = self.scenario.cluster
        members = max(1, len(c.etcd_members()))
        await self.network.start(c.topology())
        self.etcd = await asyncio.to_thread(self.network.etcd_cluster(self.directory / "etcd", members).start)
        self.sink = EffectSink(self.rec.effects_path)
        self.sink_url = await self.network.serve_sink(self.sink)
        self.kv = EtcdClient(self.etcd.config(endpoints=self.network.harness_endpoints(self.etcd), timeout=3.0))
        await self.kv.__aenter__()
        # The watcher reads every event from revision 1, through no proxy: it is outside every fault.
        self._watcher = asyncio.create_task(record_watch(self.kv, PREFIX, self.rec.watch, self._watch_stop,
                                                         progress=self.watch_progress))
        if c.primary is not None:
            await self.write_region_policy()
        await self.links.start(self.etcd.endpoints, c.planners())
        self.planners = PlannerSet(self.directory / "planner-logs", self.etcd.endpoints, PREFIX,
                                   partitions=c.partitions, settings=planner_settings(self.scenario),
                                   prefix_for=self.network.prefix)
        await asyncio.gather(*(self.start_planner(p) for p in c.planners()))
        for w in c.workers():
            self.start_worker(w)

    async def write_region_policy(self) -> None:
        """The scenario's region policy, written (CAS on an absent record) before any planner starts, so
        that standby planners never plan and the watch records the policy from the run's first revisions."""
        c = self.scenario.cluster
        assert self.kv is not None and c.primary is not None
        first = rp.initial(c.primary, c.regions, by="drill", now_ms=SYSTEM_CLOCK.wall_ms(),
                           reason="the scenario's region policy")
        # The scenario's standby order (initial() orders by name) and grace.
        policy = dataclasses.replace(first, standby=c.standby(), failover_grace_ms=c.failover_grace_ms())
        await rstore.cas(self.kv, self.ks, 0, policy, timeout=3.0)

    def region_of(self, node: str) -> str:
        return node.split("-", 1)[0]

    async def start_planner(self, node: str) -> str:
        assert self.planners is not None
        env = {**self.env, **(self.clock.env_for(node) if self.clock is not None else {})}
        settings = {"etcd_endpoints": ",".join(self.links.endpoints_for(node)), "region": self.region_of(node),
                    **self.network.planner_settings(node)}
        if self.unsafe_fencing_off:
            env["SCHED_TEST_MODE"] = "1"
            settings["unsafe_disable_fencing"] = "true"
        if self.duplicate_dir is not None:  # the switch is refused outside test mode, as it should be
            self.duplicate_dir.mkdir(parents=True, exist_ok=True)
            env["SCHED_TEST_MODE"] = "1"
            settings["unsafe_duplicate_delivery_file"] = str(self.duplicate_control(node))
        old = self.addresses.get(node)
        if old:  # back on the address its workers dial (the start retries a port taken meanwhile)
            settings["api_port"] = old.rpartition(":")[2]
        _, address = await self.planners.serve(node, settings=settings, env=env)
        self.addresses[node] = address
        return address

    def duplicate_control(self, node: str) -> Path:
        """F9: the file whose presence makes planner `node` send some assignments twice (dispatch/duplicate.py)."""
        assert self.duplicate_dir is not None
        return self.duplicate_dir / f"{node}.json"

    def start_worker(self, name: str) -> WorkerProcess:
        w = self.workers.get(name)
        if w is None:
            env = dict(self.clock.env_for(name)) if self.clock is not None else {}
            settings = {"concurrency": "64", **self.network.worker_settings(name)}
            if self.unsafe_dedupe_off:
                env["SCHED_TEST_MODE"] = "1"
                settings["unsafe_disable_dedupe"] = "true"
            w = WorkerProcess(name, self.region_of(name), list(self.addresses.values()),
                              self.rec.logs / f"{name}.log", settings=settings, env=env,
                              prefix=self.network.prefix(name))
            self.workers[name] = w
        else:
            w.planners = list(self.addresses.values())
        return w.start()

    def planner(self, node: str) -> PlannerProcess:
        assert self.planners is not None
        return self.planners[node]

    def live_planners(self) -> list[str]:
        assert self.planners is not None
        return sorted(self.planners.running_ids())

    def api_address(self, rng: random.Random | None = None) -> str:
        """A running, unfrozen planner's API address (any answers for any schedule)."""
        live = [self.network.reach(self.addresses[p]) for p in self.live_planners() if p in self.addresses]
        if not live:
            raise RuntimeError("no planner is running")
        return (rng or random).choice(live)

    # ---- health -------------------------------------------------------------------------------

    async def health(self, *, fresh_s: float = 3.0) -> Health:
        """Etcd healthy, every partition owned by a running unfrozen planner, every checkpoint within
        `fresh_s` of now (planning is moving), every worker process running."""
        assert self.etcd is not None and self.kv is not None
        problems: list[str] = []
        for i, m in enumerate(self.etcd.members):
            if not m.running or m.paused or not await asyncio.to_thread(self.etcd.healthy, i):
                problems.append(f"etcd member {m.name} not healthy")
        try:
            owners = await self.kv.range(self.ks.owners, prefix=True, timeout=2.0)
            marks = await self.kv.range(self.ks.checkpoints, prefix=True, timeout=2.0)
        except EtcdError as e:
            return Health(False, [*problems, f"etcd unreadable: {e}"])
        live = set(self.live_planners())
        owned = {self.ks.partition_of(x.key): _owner_node(x.value) for x in owners.kvs}
        parts = self.scenario.cluster.partitions
        missing = [p for p in range(parts) if p not in owned]
        if missing:
            problems.append(f"partitions without an owner: {missing[:8]}")
        stale_owner = sorted({n for n in owned.values() if n not in live})
        if stale_owner:
            problems.append(f"partitions owned by planners that are down or frozen: {stale_owner}")
        now = SYSTEM_CLOCK.wall_ms()
        old = [self.ks.partition_of(x.key) for x in marks.kvs
               if int(json.loads(x.value)["watermark_ms"]) < now - fresh_s * 1000]
        if old or len(marks.kvs) < parts:
            problems.append(f"checkpoints not fresh: {sorted(old)[:8]} ({len(marks.kvs)}/{parts} written)")
        down = [n for n, w in self.workers.items() if not w.running or w.paused]
        if down:
            problems.append(f"workers down: {down}")
        return Health(not problems, problems)

    async def wait_healthy(self, timeout: float) -> tuple[int | None, Health]:
        """Poll health until it holds (returns the wall ms it first held) or `timeout` passes (None)."""
        deadline = time.monotonic() + timeout
        h = Health(False, ["not checked"])
        while time.monotonic() < deadline:
            h = await self.health()
            if h.ok:
                return SYSTEM_CLOCK.wall_ms(), h
            await asyncio.sleep(0.25)
        return None, h

    async def drain(self, planner: str, reason: str) -> None:
        """As `schedctl planner drain`: the planner's drain key; it hands every partition over and stays up."""
        assert self.kv is not None
        value = json.dumps({"reason": reason, "requested_ms": SYSTEM_CLOCK.wall_ms(), "by": "drill"},
                           separators=(",", ":")).encode()
        await self.kv.put(self.ks.drain(planner), value, timeout=3.0)

    async def undrain(self, planner: str) -> None:
        assert self.kv is not None
        await self.kv.delete(self.ks.drain(planner), timeout=3.0)

    async def owners(self) -> dict[int, str]:
        """Partition -> the planner its owner key names now (empty if etcd does not answer)."""
        assert self.kv is not None
        try:
            r = await self.kv.range(self.ks.owners, prefix=True, timeout=2.0)
        except EtcdError:
            return {}
        return {self.ks.partition_of(x.key): _owner_node(x.value) for x in r.kvs}

    async def owning_planners(self) -> set[str]:
        """The planners that own at least one partition now, by etcd, under their current session: an owner
        key of a session that died (a planner just killed and restarted) stays until its lease lapses, and
        a fault aimed at that planner because of it exercised nothing (a game day's F1 #18). Empty if etcd
        does not answer."""
        return set(await self._owning_sessions())

    async def _owning_sessions(self) -> dict[str, int]:
        """Planner -> the lease of its current session, for the planners owning a partition under it."""
        assert self.kv is not None
        try:
            owners = await self.kv.range(self.ks.owners, prefix=True, timeout=2.0)
            members = await self.kv.range(self.ks.members, prefix=True, timeout=2.0)
        except EtcdError:
            return {}
        session = {_member_node(m.value): m.lease for m in members.kvs}
        return {n: x.lease for x in owners.kvs if session.get(n := _owner_node(x.value)) == x.lease}

    async def _session_lasts(self, lease: int) -> bool:
        assert self.kv is not None
        return await session_lasts(self.kv, lease)

    async def wait_owning(self, planner: str, timeout: float) -> bool:
        """Poll until `planner` owns at least one partition under its current session (True) or `timeout`
        passes (False). A planner fault aimed at one that owns nothing exercises nothing (validity says so):
        a planner restarted by an earlier fault gets partitions back only as rebalancing hands them over, a
        few seconds later."""
        deadline = time.monotonic() + timeout
        while True:
            lease = (await self._owning_sessions()).get(planner)
            if lease is not None and await self._session_lasts(lease):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.25)

    # ---- stop ---------------------------------------------------------------------------------

    async def watch_complete(self, timeout: float = 20.0) -> str | None:
        """None once the harness's watch has recorded everything etcd holds now; else why not. The checker
        judges from that history alone, so a history that stopped short makes the run invalid."""
        if self.kv is None:
            return "no etcd client"
        try:
            rev = (await self.kv.range(self.ks.owners, prefix=True, keys_only=True, timeout=5.0)).revision
        except Exception as e:
            return f"the etcd watch could not be checked: {e!r}"
        if self._watcher is not None and self._watcher.done():
            return (f"the etcd watch ended early ({self._watcher.exception()!r}) at revision "
                    f"{self.watch_progress.written}")
        if await self.watch_progress.caught_up(rev, timeout):
            return None
        return (f"the etcd watch recorded events up to revision {self.watch_progress.written} of {rev} "
                f"{timeout:g} s after the window: the history is incomplete")

    async def close(self) -> None:
        """Workers first (they report their last results to planners that still serve), then planners
        (SIGTERM: each drains), then the harness parts, then etcd. Everything by pid. The network last,
        whatever failed before it (namespaces deleted)."""
        try:
            await self._close()
        finally:
            await self.network.close()

    async def _close(self) -> None:
        await asyncio.gather(*(w.stop() for w in self.workers.values()), return_exceptions=True)
        if self.planners is not None:
            for p in self.planners.running():
                if p.paused:
                    p.resume()
            await asyncio.gather(*(p.stop() for p in self.planners.running()), return_exceptions=True)
            self.planners.close()
        await self.links.close()
        self._watch_stop.set()
        if self._watcher is not None:
            with contextlib.suppress(Exception):
                await self._watcher
        if self.kv is not None:
            await self.kv.__aexit__(None, None, None)
        if self.sink is not None:
            await self.sink.close()
        if self.etcd is not None:
            await asyncio.to_thread(self.etcd.close)
        self._collect_logs()

    def _collect_logs(self) -> None:
        """logs/<planner>.log: every process of that node, in start order (I8 reads logs/)."""
        if self.planners is None:
            return
        for node in self.planners.planners:
            parts = sorted(self.planners.base_dir.glob(f"{node}.*.log"),
                           key=lambda p: int(p.suffixes[-2][1:]) if len(p.suffixes) > 1 else 0)
            with (self.rec.logs / f"{node}.log").open("w") as out:
                for part in parts:
                    out.write(part.read_text(errors="replace"))

    def nodes(self) -> dict[str, dict[str, str]]:
        """run.json's `nodes`: role and region of each. On loopback workers share 127.0.0.1, so no address is
        given (an http effect is then any worker's; shell effects name theirs); in namespaces each worker's
        address names it (the sink logs the peer address of an http effect)."""
        out: dict[str, dict[str, str]] = {}
        for p in self.scenario.cluster.planners():
            out[p] = {"role": "planner", "region": self.region_of(p), "address": self.addresses.get(p, "")}
        for w in self.scenario.cluster.workers():
            out[w] = {"role": "worker", "region": self.region_of(w), **self.network.node_info(w)}
        return out


async def session_lasts(kv: EtcdClient, lease: int) -> bool:
    """The session's lease has at least a second left (etcd reports whole seconds, rounded down). A planner
    whose keep-alives a fault just cut still owns until etcd expires its lease, and a fault injected in that
    last moment finds it owning nothing: a full game day's F1 #182 killed a planner 5 revisions after its
    only claim ended, right after an F3 on it, and the run was invalid for it."""
    try:
        return (await kv.lease_time_to_live(lease, timeout=2.0)).ttl >= 1
    except EtcdError:
        return False
