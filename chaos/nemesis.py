"""The nemeses: each fault type of the catalogue (chaos/faults.py) made real on a `LiveCluster`.

`inject(window)` starts a fault and returns an `Active` whose `heal()` ends it. Both are quick: the
runner sleeps the window's duration in between and records the window as it really happened (start
when the fault took hold, end when the heal did). `supported()` says up front which fault types this
cluster can make, so a scenario that needs a missing one is refused before anything starts, rather
than passing with a fault silently skipped.

F2 beyond the lease (docs/drills.md, I4c): a planner frozen at an arbitrary instant nearly always
wakes up, sees its lease deadline passed and fences itself before it writes again: correct, but no
stale write ever reaches etcd, so etcd's fence compare is never exercised. With a proxy on its etcd
link, the nemesis first *holds* the planner's outgoing bytes, waits until a write is caught in the
proxy, then freezes the planner; the heal releases the held bytes first (the write reaches etcd after
the takeover, where the fence compare must refuse it) and then thaws the planner.
"""

from __future__ import annotations

import asyncio
import json
import os
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.infra.etcd import find_binary
from chaos.links import LinkFaultUnsupported
from chaos.live import LiveCluster
from chaos.netns_cluster import NetnsNetwork
from chaos.plan import FaultWindow
from scheduler.clock import SYSTEM_CLOCK
from scheduler.ids import schedule_of
from scheduler.store.keyspace import partition_for

__all__ = ["Active", "Nemesis", "Unsupported"]

Heal = Callable[[], Awaitable[str]]


class Unsupported(RuntimeError):
    """This cluster cannot make that fault (names the type and why)."""


@dataclass
class Active:
    window: FaultWindow
    heal: Heal
    note: str = ""
    started_ms: int | None = None  # when the fault took hold, if the nemesis waited before it (F7)
    counts: dict[str, int] = field(default_factory=dict)  # what it made, filled by the heal (F9: duplicated)
    # What the nemesis did, recorded with the window (faults.jsonl `detail`) so that validity can check
    # it happened; a heal may add to it (F12: the member added).
    detail: dict[str, Any] = field(default_factory=dict)


async def _nothing() -> str:
    return ""


# F7 waits this long for its worker to have an effect under way: 3 s missed one in eight on the sized game
# day (a worker of six, about 8 runs a second each, most of them 0-1 s long).
F7_WAIT_S = 10.0
# F13 strands its worker on the planner of a run it started this recently (the aim waits for one).
F13_RECENT_S = 3.0


class Nemesis:
    def __init__(self, live: LiveCluster) -> None:
        self.live = live

    def supported(self, fault_type: str, params: dict[str, Any] | None = None) -> str | None:
        """None if this cluster can make `fault_type` (with `params`: a variant may need more), else why not."""
        if fault_type == "F5" and (params or {}).get("variant") == "cut":
            if self.live.network.kind != "netns":
                return "a region cut needs network namespaces (root; the run fell back to loopback)"
            if len(self.live.scenario.cluster.regions) < 2:
                return "a region cut needs at least 2 regions (there is nothing to cut one from)"
        links = self.live.links.kind != "direct"
        members = len(self.live.scenario.cluster.etcd_members())
        why = {
            "F3": None if links else "needs a proxy or namespaces on the planner<->etcd links",
            "F10": None if links else "needs a proxy on the planner<->etcd links",
            "F11": None if links else "needs the planner's etcd link cut while etcd is compacted",
            "F6": None if self.live.clock is not None else "needs libfaketime (scripts/setup.sh installs it)",
            "F9": None if self.live.duplicate_dir is not None
            else "the planners were started without the duplicate-delivery switch (the plan held no F9)",
            # Removing one of 2 members leaves 1 of 1 (any hiccup of it is an outage), and of 1 none at all.
            "F12": None if members >= 3 else "a membership change needs at least 3 etcd members",
        }
        if fault_type == "F4" and members < 1:
            return "no etcd member"
        if fault_type == "F12" and members >= 3 and find_binary("etcdctl") is None:
            return "needs etcdctl next to etcd (scripts/setup.sh installs it)"
        if fault_type == "F13":
            if self.live.network.kind != "netns":
                return "a worker cut from some planners needs network namespaces (root; the run fell back to loopback)"
            if len(self.live.scenario.cluster.planners()) < 2:
                return "a stranded worker needs at least 2 planners (one to drain, one to take its partitions)"
        if fault_type not in why and getattr(self, f"_{fault_type.lower()}", None) is None:
            # Refused up front, not at its window: a plan holding a fault with no nemesis must not run and
            # come out with that fault silently missing.
            return "no nemesis for it"
        return why.get(fault_type)

    async def inject(self, w: FaultWindow) -> Active:
        fn: Callable[[FaultWindow], Awaitable[Active]] | None = getattr(self, f"_{w.type.lower()}", None)
        if fn is None or (why := self.supported(w.type, w.params)) is not None:
            raise Unsupported(f"{w.type} ({w.name}): {why or 'no nemesis'}")
        return await fn(w)

    # ---- processes -----------------------------------------------------------------------------

    async def _f1(self, w: FaultWindow) -> Active:
        p = self.live.planner(w.target)
        note, at = "", None
        if w.params.get("at") == "write":
            note, at = await self._kill_at_write(w.target, p.kill)
        else:
            p.kill()

        async def heal() -> str:
            if w.params.get("restart", True):
                address = await self.live.start_planner(w.target)
                return f"restarted on {address}"
            return "not restarted"

        return Active(w, heal, note, at)

    async def _kill_at_write(self, planner: str, kill: Callable[[], None]) -> tuple[str, int]:
        """SIGKILL `planner` the instant its next etcd write is read by its link's proxy, with that write held
        there, then drop it: the write never reaches etcd, as when a process dies between building a txn and
        sending it. Planners write every round (materialization, dispatch records, the checkpoint), so
        this lands between two writes of one round: after a dispatch, before its checkpoint, and the like.
        Returns the note and when the kill happened (the fault takes hold then, up to 5 s into its window)."""
        if self.live.links.kind == "direct":
            kill()
            return "direct links: no write to catch, killed at once", SYSTEM_CLOCK.wall_ms()
        killed_ms = [0]

        def at_write() -> None:
            kill()
            killed_ms[0] = SYSTEM_CLOCK.wall_ms()

        if not await self._at_next_write(planner, at_write):
            kill()
            return "no write within 5 s: killed anyway", SYSTEM_CLOCK.wall_ms()
        dropped = await self.live.links.drop_held(planner)
        return f"killed at a write; {dropped} held byte(s) dropped, never sent to etcd", killed_ms[0]

    async def _at_next_write(self, planner: str, act: Callable[[], None], timeout: float = 5.0) -> bool:
        """Call `act` the instant the planner's next etcd write is read by its link's proxy, with that write
        held there (chaos/proxy_links.py calls it from inside the read, so the planner learns nothing first).
        False, and nothing done, when no write came within `timeout`."""
        caught = asyncio.Event()

        def at_write() -> None:
            act()
            caught.set()

        self.live.links.arm_freeze(planner, at_write)
        try:
            await asyncio.wait_for(caught.wait(), timeout=timeout)
        except TimeoutError:
            self.live.links.disarm(planner)
            return False
        return True

    async def _f2(self, w: FaultWindow) -> Active:
        p = self.live.planner(w.target)
        ttl = self.live.scenario.cluster.lease_ttl_s
        note = ""
        held = False
        if w.duration_s > ttl and self.live.links.kind != "direct":
            # Freeze the planner the instant its next write is read by its link's proxy, with that write
            # held there (not forwarded): chaos/proxy_links.py calls `freeze` from inside the read, so the
            # planner cannot learn of anything before it is stopped. A hold started *before* the write
            # catches nothing: the planner's reads are held too and its rounds wait on them.
            held = await self._at_next_write(w.target, p.pause)
            note = "froze with a write held in its etcd link" if held else "no write within 5 s: frozen anyway"
        if not held:
            p.pause()

        async def heal() -> str:
            if self.live.links.kind != "direct":
                await self.live.links.heal(w.target)  # the held write reaches etcd after the takeover
                if held:
                    await asyncio.sleep(0.2)  # ... and is answered before the planner runs again
            p.resume()
            return ""

        return Active(w, heal, note, SYSTEM_CLOCK.wall_ms() if held else None)

    async def _f5(self, w: FaultWindow) -> Active:
        """Region loss. `single-region`: every planner and worker of the one region dies (etcd stays);
        after the window they come back, a site loss recovered from etcd alone. `multi-region`: the
        region's planners, workers *and* etcd members die together (SIGKILL), the other regions keep
        quorum and take its partitions over: with a region policy a standby's failover (chaos/regions.py
        judges it), without one the loss of one active region of an active-active cluster."""
        region = w.target
        if w.params.get("variant") == "cut":
            return await self._f5_cut(w)
        c = self.live.scenario.cluster
        planners = [p for p in c.planners() if self.live.region_of(p) == region]
        workers = [x for x in c.workers() if self.live.region_of(x) == region]
        members = [i for i, name in enumerate(c.etcd_members()) if self.live.region_of(name) == region] \
            if w.params.get("variant") == "multi-region" else []
        etcd = self.live.etcd
        assert etcd is not None
        for x in workers:
            self.live.workers[x].crash()
        for p in planners:
            self.live.planner(p).kill()
        for i in members:
            etcd.kill(i)

        async def heal() -> str:
            for i in members:
                await asyncio.to_thread(etcd.restart, i)
            await asyncio.gather(*(self.live.start_planner(p) for p in planners))
            for x in workers:
                self.live.start_worker(x)
            return f"restarted {len(members)} etcd member(s), {len(planners)} planners and {len(workers)} workers"

        return Active(w, heal, f"killed {len(members)} etcd member(s), {len(planners)} planners and {len(workers)} "
                               f"workers of {region}")

    async def _f5_cut(self, w: FaultWindow) -> Active:
        """Region loss by the network: every process of the region keeps running, cut from every other
        region (iptables in its namespaces, both ways; the planner<->etcd links across its border stalled:
        chaos/netns_cluster.py, `partition_region`). Its etcd member is left in a minority, so its planners
        can neither renew nor write, while its workers finish what they hold and cannot report it; the
        harness reaches both sides. The heal rejoins the region; nothing restarts."""
        network = self.live.network
        assert isinstance(network, NetnsNetwork)  # supported() refused the others
        cut = await network.partition(w.target, mode=w.params.get("mode", "drop"))

        async def heal() -> str:
            return await cut.heal()

        return Active(w, heal, cut.describe(), detail={"cut": w.target})

    async def _f7(self, w: FaultWindow) -> Active:
        """A worker crash mid-execution: waits (up to F7_WAIT_S) until the worker has an effect under way, so
        that the crash really cuts a run short (validity checks it), then kills it and its jobs."""
        assert self.live.sink is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + F7_WAIT_S
        while self.live.sink.running(w.target) == 0 and loop.time() < deadline:  # noqa: ASYNC110 (polls the sink)
            await asyncio.sleep(0.02)
        running = self.live.sink.running(w.target)
        at = SYSTEM_CLOCK.wall_ms()
        jobs = self.live.workers[w.target].crash()

        async def heal() -> str:
            if w.params.get("restart", True):
                self.live.start_worker(w.target)
                return "restarted"
            return "not restarted"

        return Active(w, heal, f"{running} effect(s) under way, {jobs} job process(es) killed with it", at)

    async def _f8(self, w: FaultWindow) -> Active:
        """Slow workers: every effect takes `hold_ms` longer (the sink holds its answer), so runs overlap
        their successors and the overlap policies decide. Made at the sink because the http executor's
        work *is* the call: a slow webhook is a slow job."""
        assert self.live.sink is not None
        sink = self.live.sink
        sink.extra_hold_ms = int(w.params.get("hold_ms", 2000))

        async def heal() -> str:
            sink.extra_hold_ms = 0
            return ""

        return Active(w, heal, f"every effect held {sink.extra_hold_ms} ms longer (all workers, at the sink)")

    async def _f13(self, w: FaultWindow) -> Active:
        """A worker stranded on one planner: cut from every other planner (iptables in its namespace, both
        ways), its effects held `hold_ms` longer at the sink, and once it runs an effect begun after the cut
        (from that planner, the only one it reaches), that planner drained (its drain key, as `schedctl planner
        drain`): every partition it owned moves to planners the worker cannot reach while the worker runs their
        runs and will report them to the drained planner. The new owners must not give those runs up and run
        them again (I1). The heal withdraws the drain, ends the hold and rejoins the worker.

        The planner is the owner of the worker's latest run (the runner aimed the fault at a worker that runs
        things): one that hands it work. Each planner fills its streams in the order they connected, so a
        planner whose first stream is another worker's would send the stranded one nothing (the first runs of
        this drill: three of four windows stranded a worker that then ran nothing)."""
        network = self.live.network
        assert isinstance(network, NetnsNetwork)  # supported() refused the others
        assert self.live.sink is not None
        sink, worker = self.live.sink, w.target
        owners = await self.live.owners()
        latest = sink.recent(worker, SYSTEM_CLOCK.wall_ms() - int(F13_RECENT_S * 1000))
        feeder = owners.get(partition_for(schedule_of(latest), self.live.scenario.cluster.partitions)) \
            if latest else None
        candidates = [feeder] if feeder else sorted(set(owners.values()))
        if not candidates:
            raise Unsupported(f"F13 ({w.name}): no planner owns a partition to strand {worker} on")
        origin = candidates[zlib.crc32(f"{w.index}".encode()) % len(candidates)]
        others = [p for p in self.live.scenario.cluster.planners() if p != origin]
        cut = await network.cut(worker, others)
        cut_ms = SYSTEM_CLOCK.wall_ms()
        sink.worker_hold_ms[worker] = int(w.params.get("hold_ms", 8000))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + F7_WAIT_S
        while sink.running(worker, cut_ms) == 0 and loop.time() < deadline:  # noqa: ASYNC110 (polls the sink)
            await asyncio.sleep(0.02)
        running = sink.running(worker, cut_ms)
        await self.live.drain(origin, f"drill F13 #{w.index}")

        async def heal() -> str:
            await self.live.undrain(origin)
            sink.worker_hold_ms.pop(worker, None)
            await network.heal(cut)
            return f"{origin} undrained, {worker} rejoined"

        # The window starts at the cut: the worker's runs on the other planners are cut off from then on.
        return Active(w, heal, f"{worker} reaches only {origin}, drained with {running} of its effect(s) under way",
                      cut_ms, detail={"origin": origin, "running_at_drain": running})

    # ---- the planners' assignment streams ---------------------------------------------------------

    def _f9_planners(self, w: FaultWindow) -> list[str]:
        """The planners whose streams duplicate: a planner, a link named after its planner, or every one."""
        if w.target == "cluster":
            return list(self.live.scenario.cluster.planners())
        return [w.target.split("->", 1)[0]]

    @staticmethod
    def _f9_state(control: Path) -> dict[str, Any]:
        """The planner's answer (dispatch/duplicate.py writes `<control>.state` atomically); {} before any."""
        try:
            return dict(json.loads(control.with_name(control.name + ".state").read_text()))
        except (OSError, ValueError):
            return {}

    async def _f9_wait(self, controls: list[Path], done: Callable[[dict[str, Any]], bool], timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not all(done(self._f9_state(c)) for c in controls):
            if loop.time() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def _f9(self, w: FaultWindow) -> Active:
        """Duplicate delivery: the target planners send a share (`probability`, 5-20%) of their assignments
        a second time, 0 to `delay_ms` later, on the same stream, through their test-only switch: a control
        file each polls (dispatch/duplicate.py). The window starts when every target said it is on, and its
        heal waits until every target said it is off with no repeat still pending, so the counts recorded
        (`duplicated`) are all the repeats this window made: a window that duplicated nothing is invalid."""
        planners = self._f9_planners(w)
        params = {"probability": float(w.params.get("probability", 0.1)),
                  "delay_ms": int(w.params.get("delay_ms", 2000))}
        controls = [self.live.duplicate_control(p) for p in planners]
        before = {c: self._f9_state(c) for c in controls}
        for p, c in zip(planners, controls, strict=True):
            tmp = c.with_name(c.name + ".tmp")
            # Seeded per window and planner: reproducible picks, but not the same picks on every planner.
            tmp.write_text(json.dumps({**params, "seed": w.index * 1000 + zlib.crc32(p.encode()) % 1000}))
            os.replace(tmp, c)  # atomic: a planner never reads half the parameters
        on = await self._f9_wait(controls, lambda st: bool(st.get("on")), 3.0)
        at = SYSTEM_CLOCK.wall_ms()
        note = (f"{len(planners)} planner(s) send {params['probability']:.0%} of assignments twice, within "
                f"{params['delay_ms']} ms" + ("" if on else " (not every planner said it was on within 3 s)"))
        active = Active(w, _nothing, note, at)

        async def heal() -> str:
            for c in controls:
                c.unlink(missing_ok=True)
            # Repeats already chosen still go out after the heal (they were in flight): wait for them.
            settled = await self._f9_wait(controls, lambda st: not st.get("on") and not st.get("pending"),
                                          params["delay_ms"] / 1000 + 3.0)
            totals = {"duplicated": 0, "skipped": 0, "dispatched": 0}
            for c in controls:
                now, then = self._f9_state(c), before[c]
                # A planner restarted meanwhile counts from 0 again: take its own count then.
                same = now.get("pid") == then.get("pid")
                for k in totals:
                    totals[k] += int(now.get(k, 0)) - (int(then.get(k, 0)) if same else 0)
            active.counts.update(totals)
            return (f"{totals['duplicated']} assignment(s) duplicated of {totals['dispatched']} sent while on "
                    f"({totals['skipped']} skipped: stream gone or no credit)"
                    + ("" if settled else "; not every planner said it was off"))

        active.heal = heal
        return active

    # ---- etcd ----------------------------------------------------------------------------------

    def _member(self, target: str) -> int:
        names = self.live.scenario.cluster.etcd_members()
        return names.index(target) if target in names else 0

    async def _f4(self, w: FaultWindow) -> Active:
        etcd = self.live.etcd
        assert etcd is not None
        n = int(w.params.get("members", 1))
        first = self._member(w.target)
        idx = [(first + i) % etcd.size for i in range(min(n, etcd.size))]
        how = str(w.params.get("signal", "KILL"))
        for i in idx:
            etcd.pause(i) if how == "STOP" else etcd.kill(i)

        async def heal() -> str:
            for i in idx:
                if how == "STOP":
                    etcd.resume(i)
                else:
                    await asyncio.to_thread(etcd.restart, i)
            return ""

        return Active(w, heal, f"{how} of member(s) {[etcd.members[i].name for i in idx]}")

    async def _f12(self, w: FaultWindow) -> Active:
        """Etcd membership change (etcd robustness's MemberReplace, Jepsen's `member` nemesis): the target
        member is removed from the membership (`etcdctl member remove`; refused if the others would not
        keep a quorum), its process gone and its data dir wiped; then a fresh member (new etcd name, empty
        data dir, `--initial-cluster-state=existing`) is added in its slot (`member add`, a voter) and
        started. `remove-add` (default): the window runs on the two members left and the add is the heal;
        `replace`: the add follows the remove at once, and the window holds the new member's joining.

        The heal returns only once the new member is a voter that caught up (chaos/infra/etcd.py
        `wait_caught_up`): a heal that cannot get there fails, and the window is recorded as never healed
        (invalid). The planners' links to the slot are re-pointed at the new member's address (on loopback
        it listens on new ports; in namespaces it is the slot's own address again), as a per-member DNS
        name would re-resolve; their endpoint lists never change."""
        etcd = self.live.etcd
        assert etcd is not None
        i = self._member(w.target)
        action = str(w.params.get("action", "remove-add"))
        voters = len(etcd.members)
        move = str(w.params.get("leader", "move")) == "move"
        leader = await asyncio.to_thread(etcd.leader_id)
        try:
            removed = await asyncio.to_thread(etcd.remove_member, i, move_leader=move)
        except ValueError as e:  # would lose quorum: that is F4's outage, not this fault
            raise Unsupported(f"F12 ({w.name}): {e}") from None
        at = SYSTEM_CLOCK.wall_ms()
        was_leader = leader == removed.id
        detail: dict[str, Any] = {"action": action, "slot": w.target,
                                  "removed": {"id": removed.hex_id, "name": removed.name,
                                              "peer_urls": list(removed.peer_urls), "data_dir_wiped": True,
                                              "was_leader": was_leader, "leader_moved_first": was_leader and move}}
        lead = ""
        if was_leader:
            lead = " (the leader; leadership moved first)" if move else " (the leader, removed as it led)"
        note = f"member {removed.name} ({removed.hex_id}) removed{lead}, its data dir wiped; {voters - 1} voters left"

        async def add() -> str:
            info, seen = await asyncio.to_thread(etcd.add_member, i, timeout=self.live.scenario.faults.health_timeout_s)
            moved = self.live.links.retarget(i, etcd.endpoints[i])
            detail["added"] = {"id": info.hex_id, "name": info.name, "peer_urls": list(info.peer_urls),
                               "client_urls": list(info.client_urls), "voting": not info.is_learner,
                               "applied_index": seen["applied_index"], "leader_index": seen["leader_index"],
                               "links_retargeted": moved}
            return (f"member {info.name} ({info.hex_id}) added at {etcd.endpoints[i]}, a voter caught up to raft "
                    f"index {seen['applied_index']} (leader's {seen['leader_index']})")

        if action == "replace":
            try:
                note += "; " + await add()
            except Exception as e:  # the window is recorded all the same; its heal tries the add again
                note += f"; add failed ({e!r}), retried at the heal"

        async def heal() -> str:
            return await add() if "added" not in detail else ""

        return Active(w, heal, note, at, detail=detail)

    # ---- links ---------------------------------------------------------------------------------

    async def _link_target(self, w: FaultWindow) -> str:
        return w.target.split("->", 1)[0]

    async def _f3(self, w: FaultWindow) -> Active:
        planner = await self._link_target(w)
        try:
            note = await self.live.links.cut(planner, str(w.params.get("direction", "both")),
                                             str(w.params.get("mode", "drop")))
        except LinkFaultUnsupported as e:
            raise Unsupported(f"F3: {e}") from None

        async def heal() -> str:
            return await self.live.links.heal(planner)

        return Active(w, heal, note)

    async def _f10(self, w: FaultWindow) -> Active:
        planner = await self._link_target(w)
        p: dict[str, Any] = dict(w.params)
        note = await self.live.links.flaky(planner, int(p.get("latency_ms", 200)), int(p.get("jitter_ms", 100)),
                                           float(p.get("drop", 0.0)))

        async def heal() -> str:
            return await self.live.links.heal(planner)

        return Active(w, heal, note)

    async def _f11(self, w: FaultWindow) -> Active:
        """Watch compaction during a disconnect: cut the planner's etcd link, let the cluster write on
        (the other planners' rounds), compact etcd to its current revision, heal: the planner's watches
        resume from a compacted revision and must reload, not miss what changed meanwhile."""
        planner = await self._link_target(w)
        await self.live.links.cut(planner, "both", "drop")
        kv = self.live.kv
        assert kv is not None

        async def heal() -> str:
            r = await kv.range(self.live.ks.owners, prefix=True, keys_only=True, timeout=3.0)
            await kv.compact(r.revision)
            await self.live.links.heal(planner)
            return f"compacted at revision {r.revision}"

        return Active(w, heal)

    async def _f6(self, w: FaultWindow) -> Active:
        clock = self.live.clock
        assert clock is not None
        offset = _offset_s(str(w.params.get("offset", "+30s")))
        clock.set_offset(w.target, offset)

        async def heal() -> str:
            clock.set_offset(w.target, 0.0)
            return ""

        return Active(w, heal, f"wall clock {offset:+g} s")


def _offset_s(text: str) -> float:
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    unit = {"s": 1.0, "m": 60.0, "h": 3600.0}[body[-1]]
    return sign * float(body[:-1]) * unit
