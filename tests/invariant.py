"""The product's one promise, checked from recorded history (DESIGN.md, "The invariant every change keeps").

`World` runs the real planner code (scheduler.node.PlannerNode for routing and result bookkeeping,
scheduler.planner.partition.PartitionPlanner driven round by round with `start()` / `step(now)`) on a
fake clock, against any `KV` (the in-memory twin, or a real etcd), with fake workers whose effects it
logs, and an operation log of what operators did and when. `check()` then judges the ledger as etcd
holds it (execution records, skip records, their write times from etcd's watch history) against that
log and the effects, independently of the planner's own view:

1. no execution id has two attempts running at once, and no planned time succeeded twice (a rerun
   is another run the operator asked for);
2. every planned time of every schedule after its activation (create, resume, the update that made
   the spec) and before its end (pause, delete, the next spec) either has an execution record that
   ran, is legitimately in flight or waiting, ended as a dead letter or an operator cancel, or it has
   a skip whose reason the policy justifies: paused / deleted at the time the skip was written (a
   pause also at any moment since the planned time came due); an overlap skip only when another run
   of the schedule was really in progress (per the effects log) at that planned time; the catch-up
   reasons only for times behind a takeover, with exactly the reason the schedule's missed-run
   policy, window and cap give;
3. planned times that are not owed (pre-written runs after a pause, a delete, a spec change) never
   run and do not stay pending (judged, like 2, only where an owner was there to withdraw them);
4. nothing is stuck: a due run of a pool with free workers is dispatched within a bound, a dispatch
   no worker received is retried within a bound (START_TIMEOUT_CHECK), and a partition never hits a
   txn etcd refuses as malformed or a loop of restarts.

Planned times of the specs used here (`*/k * * * * *`, `@every ks`) are the multiples of k seconds;
the checker computes them itself rather than asking the planner's cron code.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import json
import os
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from scheduler.api.operations import Operations
from scheduler.clock import FakeClock
from scheduler.config import CoordinationSettings
from scheduler.dispatch.results import record_result
from scheduler.dispatch.starts import start_cas
from scheduler.errors import FencedOut, NotFound, OutcomeUnknown, SchedError
from scheduler.execution import (
    HOLDING,
    IN_FLIGHT,
    RESERVED_MESSAGE,
    Disposition,
    ErrorClass,
    ExecState,
    Execution,
    Trigger,
    started,
    with_revision,
)
from scheduler.ids import FencingToken, execution_id
from scheduler.model import Policies, RetryPolicy, Schedule, ScheduleState
from scheduler.node import PlannerNode
from scheduler.planner.ownership import NotOwner, Ownership
from scheduler.planner.partition import PartitionPlanner, Restart
from scheduler.planner.settings import PlannerSettings
from scheduler.store.codec import decode_execution
from scheduler.store.etcd.errors import EtcdError
from scheduler.store.etcd.ops import Compare, delete, put
from scheduler.store.fenced import CompareFailed, Fence
from scheduler.store.keyspace import Keyspace
from scheduler.store.kv import KV
from scheduler.store.notices import notice_op
from scheduler.timeplan import MissedRuns, Overlap

# ---- knobs ---------------------------------------------------------------------------------------

# The start-timeout mechanism of issue 9 item 4 (a dispatch no worker received is retried within
# seconds). On: "lost" dispatches are generated, must be retried within START_TIMEOUT_MS (+ a bound),
# and count as "in progress" for overlap decisions only during that window. Off: no lost dispatches.
START_TIMEOUT_CHECK = os.environ.get("SCHED_START_TIMEOUT_CHECK", "1") != "0"
START_TIMEOUT_MS = int(os.environ.get("SCHED_START_TIMEOUT_MS", "5000"))
TRACE = os.environ.get("SCHED_TRACE", "")
# Workers confirm each start (DISPATCHED -> RUNNING by compare-and-swap, through the result path) before
# they run it: what a start timeout needs to tell a received dispatch from a lost one. Off by default
# while main has no start confirmation; turn it on (and point World.confirm_start at the real path) with
# the start timeout.
CONFIRM_STARTS = os.environ.get("SCHED_CONFIRM_STARTS", "1") == "1"

PARTITION = 0
ROUND_MS = 250  # a planner round every this much fake time (the loop's wake-ups, coarsened)
LEASE_TTL_MS = 3_000  # an owner that stops renewing loses its key this long after
HEARTBEAT_TIMEOUT_MS = 10_000  # a crashed worker's attempts are declared lost after this
CANCEL_GRACE_MS = 5_000  # a worker told to cancel stops this long after (the SDK default cancel_grace)
# A worker whose planner went away (killed, handed over) reconnects to another and resends its results
# this long after; one whose planner is frozen resends after its result acknowledgement timeout.
RECONNECT_MS = 1_500
RESULT_ACK_TIMEOUT_MS = 3_000  # the SDK default result_ack_timeout
POOL_CAPACITY = {"a": 2, "b": 2, "nobody": 0}
POOLS = tuple(POOL_CAPACITY)
STUCK_ROUNDS = 12  # rounds with free capacity in its pool a due run may wait before it is "stuck"
HOLDS = (Overlap.SKIP, Overlap.BUFFER_ONE, Overlap.BUFFER_ALL)  # the policies that never run two at once
RESTART_LOOP = 20  # restarts within one advance of the clock that make a loop
# The first attempt reserved in the create and handed out unwritten (docs/keyspace.md, "Reserved first attempt"):
# off by default in the product until a game day with it on passes, judged here all the same.
SETTINGS = PlannerSettings(lookahead_ms=2_000, late_grace_ms=5_000, backlog_ms=2_000, checkpoint_interval_ms=1_000,
                           max_planned_per_round=200, heartbeat_timeout=HEARTBEAT_TIMEOUT_MS / 1000,
                           reserve_first_attempt=os.environ.get("SCHED_TWIN_RESERVE", "1") == "1")
# A planned time is judged once it is this far in the past (and the partition has been served that long).
GRACE_MS = SETTINGS.lookahead_ms + 2 * ROUND_MS + 500
T0 = 1_767_225_600_000 + 123  # 2026-01-01T00:00:00.123Z: creates land between planned times

Behaviour = Literal["ok", "fail_transient", "fail_permanent", "slow", "crash", "lost", "lost_ack"]


# ---- the operation log -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Version:
    """What a schedule was from `at_ms` on (until the next version)."""

    at_ms: int
    state: Literal["active", "paused", "deleted"]
    period_s: int
    spec: str
    pool: str
    policies: Policies
    activated_ms: int  # by our own reckoning: create, resume, spec change
    rev: int = 0  # the etcd revision of the write that made this version


@dataclass
class Start:
    """A partition planner instance starting (a claim, or a reload after a restart)."""

    at_ms: int
    watermark_ms: int  # the checkpoint it started from (read from etcd just before)
    takeover: bool
    # The checkpoint's mod_revision (0: none): the writes before it were seen by its writer (the World
    # hands every write to the live planner before its next round), those after it were not.
    ck_rev: int = 0
    # Hold records read with the checkpoint: schedule id -> `from`. A hold overrides the watermark for its
    # schedule (docs/keyspace.md): its times after `from` were not materialized, and the claim's catch-up
    # decides them as any others behind it.
    holds: dict[str, int] = field(default_factory=dict)
    late_holds: set[str] = field(default_factory=set)  # held as a saturated pool's: their runs run late
    # Runs the checkpoint's writer wrote ahead, never dispatched, due beyond the late grace at this start: schedule
    # id -> planned times. The claim applies the missed-run policy to them with its catch-up (docs/time.md).
    inherited: dict[str, list[int]] = field(default_factory=dict)
    # Schedules whose inherited runs the claim leaves to the dispatch round (docs/time.md, "Left as they stand"):
    # a run of theirs out or waiting for its retry, or one that was out after an inherited run came due.
    excused: set[str] = field(default_factory=set)


@dataclass
class Effect:
    """What a fake worker did with one dispatched attempt."""

    eid: str
    sid: str
    planned_ms: int
    attempt: int
    run_trigger: str  # the execution's current trigger (rerun/replay: an operator's new run)
    behaviour: str
    start_ms: int
    end_ms: int | None = None  # the work stopped (None: still running)
    busy_end_ms: int | None = None  # until when others may take it for running (a crash: until detected)
    outcome: str = ""  # succeeded / failed / crashed / cancelled / lost
    # Start ahead: when it was handed out, before its due time (its worker holds it until start_ms); None: at once.
    armed_ms: int | None = None
    result_ms: int | None = None  # its result reached a planner (later than end_ms when an ack was lost)

    @property
    def ran_ms(self) -> int:
        """How long it ran, as a worker reports it with its result (finished_at - started_at)."""
        return 0 if self.end_ms is None else self.end_ms - self.start_ms


@dataclass
class Log:
    versions: dict[str, list[Version]] = field(default_factory=dict)
    starts: list[Start] = field(default_factory=list)
    effects: list[Effect] = field(default_factory=list)
    stale: list[Effect] = field(default_factory=list)  # handed out by a planner frozen and superseded
    cancels: set[str] = field(default_factory=set)  # execution ids an operator cancelled
    reruns: dict[str, int] = field(default_factory=dict)
    rerun_ms: dict[str, list[int]] = field(default_factory=dict)  # when each rerun or replay was asked, per id
    # When each execution record was first written after its create (its key's version 2): a first attempt handed
    # out without a write (reserve_first_attempt) can no longer start from then on (its start CAS compares the
    # creation revision), so that is when it ended, whenever a later dispatch records the number as retired.
    moved_ms: dict[str, int] = field(default_factory=dict)
    # Planner trouble seen by the driver: malformed txns, restarts per clock advance, stale writes.
    errors: list[str] = field(default_factory=list)
    # Per round: (time, free capacity per pool after the round).
    rounds: list[tuple[int, dict[str, int]]] = field(default_factory=list)
    outage_from: int | None = None  # the last round of the previous instance, while nobody serves
    ops: list[str] = field(default_factory=list)  # a readable trace
    start_ahead_ms: int = 0  # the planners' start ahead (an armed run may start after a pause: `armed_while_owed`)

    def version_at(self, sid: str, t: int) -> Version | None:
        vs = self.versions.get(sid, [])
        cur = None
        for v in vs:
            if v.at_ms <= t:
                cur = v
        return cur


# ---- the fake workers -------------------------------------------------------------------------------

@dataclass
class Job:
    e: Execution
    effect: Effect
    behaviour: Behaviour
    finish_ms: int  # natural end
    pool: str
    instance: int  # the planner process that dispatched it (whose stream the worker reports on)
    cancel_at: int | None = None


class Workers:
    """Worker pools behind the planner's DispatchSink: capacity per pool, and a queue of behaviours
    (drawn by the test) for the next dispatches."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.jobs: dict[tuple[str, int], Job] = {}
        self.reserved: dict[str, int] = {}
        self.plan: deque[tuple[Behaviour, int]] = deque()
        self.timers: list[tuple[int, int, str, tuple[str, int]]] = []  # (time, seq, kind, job key)
        self._seq = 0

    def busy(self, pool: str) -> int:
        return sum(1 for j in self.jobs.values() if j.pool == pool and j.effect.end_ms is None
                   and j.behaviour != "lost")

    def capacity(self, pool: str) -> int:
        return max(0, POOL_CAPACITY.get(pool, 0) - self.busy(pool) - self.reserved.get(pool, 0))

    def served(self, pool: str) -> bool:
        return POOL_CAPACITY.get(pool, 0) > 0

    def reserve(self, pool: str, n: int) -> None:
        self.reserved[pool] = self.reserved.get(pool, 0) + n

    def release(self, pool: str, n: int) -> None:
        self.reserved[pool] = self.reserved.get(pool, 0) - n

    def expect(self, attempts: Sequence[tuple[str, int]]) -> None:
        """A new owner's claim: the running attempts no live worker runs any more (crashed, with nobody
        left to orphan them if their planner is gone) are lost a heartbeat timeout from now; until then
        the planners cannot know, so they count as in progress."""
        now = self.world.clock.wall_ms()
        for key in attempts:
            job = self.jobs.get(key)
            if job is None or job.effect.outcome == "crashed":
                if job is not None:
                    job.effect.busy_end_ms = max(job.effect.busy_end_ms or 0, now + HEARTBEAT_TIMEOUT_MS + 2 * ROUND_MS)
                self.timer(now + HEARTBEAT_TIMEOUT_MS, "lost_stream", key)

    def timer(self, at: int, kind: str, key: tuple[str, int]) -> None:
        self._seq += 1
        self.timers.append((at, self._seq, kind, key))
        self.timers.sort()

    def submit(self, e: Execution, payload: bytes, token: FencingToken) -> None:
        now = self.world.clock.wall_ms()
        cur = e.current
        # Start ahead: handed out before its due time, it runs at its due time (the worker holds it until then).
        start = e.due_ms if cur is not None and cur.dispatched_ms < e.due_ms and now < e.due_ms else now
        behaviour, dur = self.plan.popleft() if self.plan else ("ok", 300)
        if behaviour == "lost" and not START_TIMEOUT_CHECK:
            behaviour = "ok"
        if POOL_CAPACITY.get(e.pool, 0) <= 0:
            self.world.log.errors.append(f"[no-worker-pool] "
                                         f"{e.id} attempt {e.attempt} dispatched to pool {e.pool!r} that has no worker")
        eff = Effect(e.id, e.schedule_id, e.planned_ms, e.attempt, e.current_trigger.value, behaviour, start,
                     armed_ms=now if start > now else None)
        self.world.log.effects.append(eff)
        key = (e.id, e.attempt)
        job = Job(e, eff, behaviour, start + dur, e.pool, self.world.stepping)
        self.jobs[key] = job
        if behaviour == "lost":  # the assignment never reached a worker: no effect at all
            eff.end_ms, eff.outcome = now, "lost"
            eff.busy_end_ms = now + START_TIMEOUT_MS
            return
        if CONFIRM_STARTS:
            self.timer(now, "start", key)
        if start > now:
            self.timer(start, "fire", key)
        if behaviour == "crash":
            self.timer(start + dur, "crash", key)
        else:
            self.timer(start + dur, "finish", key)

    def may_arm(self, pool: str) -> bool:
        return True  # the twin's workers honour start_in

    def disarm(self, e: Execution) -> None:
        """Start ahead: the worker drops an armed attempt it has not begun and reports it not started."""
        frozen = self.world.handing_to_frozen
        if frozen is not None:  # decided by a stopped process: sent when it resumes, if its stream still stands
            self.world.sent_when_thawed.setdefault(frozen.n, []).append(e)
            return
        job = self.jobs.get((e.id, e.attempt))
        now = self.world.clock.wall_ms()
        if job is None or job.effect.end_ms is not None or now >= job.effect.start_ms:
            return  # begun (it runs on), or over
        self._unfired(job, now)
        self.timer(now, "not_started", (e.id, e.attempt))

    @staticmethod
    def _unfired(job: Job, now: int) -> None:
        """An armed attempt that never ran its handler: no effect."""
        eff = job.effect
        eff.start_ms = eff.end_ms = eff.busy_end_ms = now
        eff.outcome = "lost"

    def cancel(self, e: Execution, reason: str) -> None:
        job = self.jobs.get((e.id, e.attempt))
        if job is None or job.effect.end_ms is not None or job.cancel_at is not None:
            return
        now = self.world.clock.wall_ms()
        if now < job.effect.start_ms:  # armed, not begun: stopped at once, never ran
            self._unfired(job, now)
            self.timer(now, "cancelled_armed", (e.id, e.attempt))
            return
        job.cancel_at = self.world.clock.wall_ms() + CANCEL_GRACE_MS
        if job.cancel_at < job.finish_ms:
            self.timer(job.cancel_at, "cancelled", (e.id, e.attempt))

    @staticmethod
    def _error_class(job: Job) -> ErrorClass | None:
        if job.behaviour in ("ok", "slow", "lost_ack"):
            return None
        return ErrorClass.PERMANENT if job.behaviour == "fail_permanent" else ErrorClass.TRANSIENT

    def next_timer(self) -> int | None:
        return self.timers[0][0] if self.timers else None

    async def fire_due(self, now: int) -> None:
        while self.timers and self.timers[0][0] <= now:
            _, _, kind, key = self.timers.pop(0)
            job = self.jobs.get(key)
            if job is None:
                continue
            eff = job.effect
            if kind in ("finish", "cancelled"):
                if eff.end_ms is not None:
                    continue
                eff.end_ms = eff.busy_end_ms = now
                if kind == "cancelled":
                    eff.outcome = "cancelled"
                    await self.world.deliver(job.e, False, ErrorClass.TRANSIENT, "cancelled", eff.ran_ms)
                    continue
                ok = job.behaviour in ("ok", "slow", "lost_ack")
                eff.outcome = "succeeded" if ok else "failed"
                late = self.world.result_delay(job.instance, now)
                if job.behaviour == "lost_ack":  # the acknowledgement is lost: resent after the timeout
                    late = max(late, now + RESULT_ACK_TIMEOUT_MS)
                if late > now:
                    self.timer(late, "late_result", key)
                    continue
                eff.result_ms = now
                await self.world.deliver(job.e, ok, self._error_class(job), "", eff.ran_ms)
            elif kind == "start":
                if not await self.world.confirm_start(job.e) and eff.end_ms is None:
                    # The worker runs a handler only once its start is acknowledged: a refused one never ran.
                    self._unfired(job, min(now, eff.start_ms))
            elif kind == "fire":
                # Start ahead: its instant. The worker runs it only if the stream it came on is still open (a
                # killed or handed-over planner's is not; a frozen one's still is) and it was not stopped.
                gone = self.world.gone_at.get(job.instance)
                if eff.end_ms is None and gone is not None and gone <= now:
                    self._unfired(job, now)
                    self.timer(max(now, gone + RECONNECT_MS), "not_started", key)
            elif kind == "not_started":
                await self.world.deliver(job.e, False, ErrorClass.TRANSIENT,
                                         "not started: disarmed before its start-at instant", not_started=True)
            elif kind == "cancelled_armed":
                await self.world.deliver(job.e, False, ErrorClass.TRANSIENT, "cancelled")
            elif kind == "late_result":
                eff.result_ms = now
                ok = job.behaviour in ("ok", "slow", "lost_ack")
                await self.world.deliver(job.e, ok, self._error_class(job), "", eff.ran_ms)
            elif kind == "crash":
                if eff.end_ms is not None:
                    continue
                eff.end_ms, eff.outcome = now, "crashed"
                eff.busy_end_ms = now + HEARTBEAT_TIMEOUT_MS + 2 * ROUND_MS
                self.timer(now + HEARTBEAT_TIMEOUT_MS, "lost_stream", key)
            elif kind == "lost_stream":
                if self.world.live is None and self.world.frozen:
                    # The owner is frozen with the watchdog that would notice: told when it resumes (a new
                    # owner's claim expects the attempt on its own: `expect`).
                    self.world.losses_in_freeze.append(key)
                    continue
                self.world.node.on_lost_attempts([key])


# ---- a stand-in for Ownership: real fencing tokens from etcd, claims driven by the test ---------------

class StandInOwnership(Ownership):
    """Holds claims made by the World (owner key created with `create_revision == 0`, token = its
    revision). It never fences itself: a frozen instance that resumes writes with its old token, and
    only etcd's compare can stop it."""

    def __init__(self, kv: KV, ks: Keyspace, settings: CoordinationSettings, clock: FakeClock) -> None:
        super().__init__(kv, ks, settings, clock)
        self.tokens: dict[int, int] = {}

    def fence(self, partition: int) -> Fence | None:
        token = self.tokens.get(partition)
        return None if token is None else Fence(partition, self._ks.owner(partition), token)

    @contextlib.asynccontextmanager
    async def writing(self, partition: int) -> AsyncIterator[Fence]:
        fence = self.fence(partition)
        if fence is None:
            raise NotOwner(f"partition {partition} is not writable")
        yield fence


@dataclass
class Instance:
    """One planner process's partition planner (its own ownership and token)."""

    n: int
    planner: PartitionPlanner
    ownership: StandInOwnership
    token: int
    frozen_at: int | None = None
    dead: bool = False


# ---- the world --------------------------------------------------------------------------------------

class World:
    def __init__(self, kv: KV, clock: FakeClock, ks: Keyspace,
                 current_revision: Callable[[], int] | None = None, settings: PlannerSettings = SETTINGS) -> None:
        self.kv, self.clock, self.ks = kv, clock, ks
        self.settings = settings
        self.coord = CoordinationSettings(node_id="n1", partitions=1, lease_ttl=3, rpc_timeout=5.0)
        self.workers = Workers(self)
        self.node = PlannerNode(kv, ks, self.coord, clock, planner=settings, dispatcher=self.workers)
        self.ops = Operations(kv, ks, 1, self.node.store, self.node.ledger, clock, rpc_timeout=5.0)
        self.log = Log(start_ahead_ms=settings.start_ahead_ms)
        self.live: Instance | None = None
        self.frozen: list[Instance] = []
        # Worker losses detected while the owner was frozen (SIGSTOP): its dispatcher's watchdog runs in its
        # process, so it reports them when the process resumes (`thaw`), not into a node without the planner.
        self.losses_in_freeze: list[tuple[str, int]] = []
        self.instances = 0
        self.next_round = clock.wall_ms()
        self.owner_expires_at: int | None = None  # the dead/frozen owner's key goes at this time
        self.claim_at: int | None = None  # a standby claims the partition at this time (after expiry)
        # The next standby to claim dies right after its claim's first write, before any round (SIGKILL),
        # and the one after it claims this long after the lease expires.
        self.die_after_claim: int | None = None
        self.restarts_this_advance = 0
        self.rev_times: list[tuple[int, int]] = [(0, clock.wall_ms())]  # (revision, fake time first seen)
        self._seen_rev = 0
        self._watch_task: asyncio.Task[None] | None = None
        self._current_revision = current_revision
        self.sched_count = 0
        self.stepping = 0  # the instance whose round is running (its dispatches go on its streams)
        self.gone_at: dict[int, int] = {}  # instance -> when its process went away (killed, handed over)
        self.handing_to_frozen: Instance | None = None  # the frozen instance the watch is handing an event to
        self.sent_when_thawed: dict[int, list[Execution]] = {}  # instance -> disarms it sends when it resumes

    # ---- setup / teardown ------------------------------------------------------------------------

    async def revision(self) -> int:
        if self._current_revision is not None:
            return self._current_revision()
        return (await self.kv.range(self.ks.cluster_config, count_only=True)).revision

    async def start(self) -> None:
        rev = await self.revision()
        self._seen_rev = rev
        self.rev_times = [(rev, self.clock.wall_ms())]
        self._watch_task = asyncio.create_task(self._watch(rev))
        await self.claim(takeover=True)

    async def close(self) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(BaseException):
                await self._watch_task

    async def _watch(self, rev: int) -> None:
        """etcd's watch history of the whole keyspace: routed to the node as its own watches would
        (schedules, notices), and the fake time each revision was first seen kept for the checker."""
        prefix = self.ks.prefix.encode() + b"/"
        sched, notices = self.ks.all_schedules, self.ks.notices()
        execs = self.ks.all_executions
        async for batch in self.kv.watch(prefix, prefix=True, start_revision=rev + 1):
            for ev in batch.events:
                if ev.revision > self._seen_rev:
                    self._seen_rev = ev.revision
                    self.rev_times.append((ev.revision, self.clock.wall_ms()))
                key = ev.kv.key
                if ev.kv.version == 2 and key.startswith(execs):
                    self.log.moved_ms.setdefault(json.loads(ev.kv.value)["id"], self.clock.wall_ms())
                if TRACE and TRACE.encode() in key:  # SCHED_TRACE=<part of a key>: its history, to debug a finding
                    print(f"t={self.clock.wall_ms() - T0} rev={ev.revision} {ev.type} {key.decode()} "
                          f"{ev.kv.value.decode(errors='replace')[:2000]}")
                if not key.startswith((sched, notices)):
                    continue
                # A frozen process gets the events its watch stream buffered when it resumes: handing
                # them over now is the same, as it does nothing until then.
                live = self.node.planners.get(PARTITION)
                for target, frozen in [(live, None), *((f.planner, f) for f in self.frozen)]:
                    if target is None:
                        continue
                    self.node.planners[PARTITION] = target
                    # What a frozen one sends its workers on these events (a disarm) goes when it resumes.
                    self.handing_to_frozen = frozen
                    try:
                        if key.startswith(sched):
                            self.node._route(ev.type, key, ev.kv.value, ev.kv.mod_revision)
                        else:
                            self.node._route_notice(ev.type, key, ev.kv.value, ev.kv.mod_revision)
                    finally:
                        self.handing_to_frozen = None
                if live is None:
                    self.node.planners.pop(PARTITION, None)
                else:
                    self.node.planners[PARTITION] = live

    async def settle(self) -> None:
        """Until every write so far has been seen by the watch (and so routed to the planner)."""
        want = await self.revision()
        for _ in range(10_000):
            if self._seen_rev >= want:
                break
            await asyncio.sleep(0 if self._current_revision is not None else 0.001)
        for _ in range(3):
            await asyncio.sleep(0)

    def time_of(self, revision: int) -> int:
        i = bisect.bisect_left(self.rev_times, (revision, -1))
        return self.rev_times[min(i, len(self.rev_times) - 1)][1]

    # ---- planner instances ------------------------------------------------------------------------

    def _new_planner(self, ownership: StandInOwnership) -> PartitionPlanner:
        return PartitionPlanner(
            PARTITION, kv=self.kv, ks=self.ks, ownership=ownership, store=self.node.store, ledger=self.node.ledger,
            dispatcher=self.workers, settings=self.settings, clock=self.clock, node_id=f"n{self.instances}",
            rpc_timeout=5.0, max_ops=self.coord.max_txn_ops, combiner=None, metrics=self.node.metrics)

    async def claim(self, *, takeover: bool) -> bool:
        key = self.ks.owner(PARTITION)
        r = await self.kv.txn([Compare.create_revision(key, "==", 0)], [put(key, b"planner")])
        if not r.succeeded:
            return False
        self.instances += 1
        own = StandInOwnership(self.kv, self.ks, self.coord, self.clock)
        own.tokens[PARTITION] = r.revision
        inst = Instance(self.instances, self._new_planner(own), own, r.revision)
        self.live = inst
        self.claim_at = None
        self.owner_expires_at = None
        await self._start(inst, takeover=takeover)
        return True

    async def _start(self, inst: Instance, *, takeover: bool, depth: int = 0) -> None:
        now = self.clock.wall_ms()
        ck = await self.kv.get(self.ks.checkpoint(PARTITION))
        wm = 0 if ck is None else int(json.loads(ck.value)["watermark_ms"])
        held = await self.kv.range(self.ks.holds(PARTITION), prefix=True)
        holds = {self.ks.last_segment(kv.key): int(json.loads(kv.value)["from"]) for kv in held.kvs
                 if not json.loads(kv.value).get("late")}  # a late hold's times run late: not missed
        late = {self.ks.last_segment(kv.key) for kv in held.kvs if json.loads(kv.value).get("late")}
        inherited: dict[str, list[int]] = {}
        records = [decode_execution(kv.value, kv.mod_revision)
                   for kv in (await self.kv.range(self.ks.executions(PARTITION), prefix=True)).kvs]
        for x in records:
            if (x.state is ExecState.SCHEDULED and x.trigger is Trigger.SCHEDULED and x.run_trigger is None
                    and not x.attempts and x.due_ms <= now - SETTINGS.late_grace_ms):
                inherited.setdefault(x.schedule_id, []).append(x.planned_ms)
        first_due = {sid: min(ts) for sid, ts in inherited.items()}
        excused = {x.schedule_id for x in records if x.state in HOLDING or any(
            a.dispatched_ms and (not a.finished_ms or a.finished_ms > first_due.get(x.schedule_id, 1 << 62))
            for a in x.attempts)}
        self.log.starts.append(Start(now, wm, takeover, 0 if ck is None else ck.mod_revision, holds, late,
                                     inherited, excused))
        if takeover:
            self.log.outage_from = None
        self.node.planners[PARTITION] = inst.planner
        await self.settle()
        try:
            await inst.planner.start()
        except Exception as e:  # every failure is judged the same way as in a round
            await self._failed(inst, e, depth + 1)

    async def _failed(self, inst: Instance, e: BaseException, depth: int = 0) -> None:
        """What PlannerNode._partition does after a failed round: restart from etcd, or give up."""
        msg = f"{type(e).__name__}: {e}"
        if "duplicate key" in msg or "too many operations" in msg or "request is too large" in msg:
            self.log.errors.append(f"[malformed-txn] "
                                   f"t={self.clock.wall_ms() - T0}: a txn etcd refuses as malformed: {msg}")
        if isinstance(e, FencedOut | NotOwner):
            if inst is self.live:
                self.log.errors.append(f"[fenced-live] the live planner was fenced out: {msg}")
                self.live = None
            inst.dead = True
            return
        if isinstance(e, Restart | OutcomeUnknown | CompareFailed | EtcdError):
            self.node.restarts += 1
            self.restarts_this_advance += 1
            if inst is not self.live:
                inst.dead = True
                return
            fresh = Instance(inst.n, self._new_planner(inst.ownership), inst.ownership, inst.token)
            self.live = fresh
            if depth > RESTART_LOOP:
                self.log.errors.append(f"[restart-loop] "
                                       f"t={self.clock.wall_ms() - T0}: the planner's start() failed {depth} times "
                                       f"in a row: {msg}")
                return  # tried again next round
            await self._start(fresh, takeover=False, depth=depth)
            return
        raise e

    async def round(self) -> None:
        now = self.clock.wall_ms()
        await self.settle()
        if self.live is None and self.claim_at is not None and now >= self.claim_at:
            outage_from = self.log.outage_from
            claimed = await self.claim(takeover=True)
            if claimed and self.die_after_claim is not None and self.live is not None:
                extra, self.die_after_claim = self.die_after_claim, None
                self.log.ops.append(f"t={now - T0}: the claiming planner dies after its claim's first write")
                await self.kill(extra)
                # Nobody served in between: the outage goes on from the last round of an owner. The claim's
                # write records planned times (it must: the next owner resumes after it), but withdrawals
                # are a round's work, which this owner never did.
                self.log.outage_from = outage_from
                return
        inst = self.live
        if inst is not None:
            self.stepping = inst.n
            for _ in range(5):
                try:
                    again = await inst.planner.step(now)
                except Exception as e:
                    await self._failed(inst, e)
                    break
                await self.settle()
                if not again:
                    break
        if inst is not None and self.live is not None:
            self.log.rounds.append((now, {p: self.workers.capacity(p) for p in POOLS}))

    # ---- faults of the planner ---------------------------------------------------------------------

    def _lose_owner_later(self, extra_ms: int) -> None:
        now = self.clock.wall_ms()
        self.owner_expires_at = now + LEASE_TTL_MS
        self.claim_at = now + LEASE_TTL_MS + extra_ms
        # From its last round: what came due after it (a run written ahead of a pause, to skip once due) is
        # the next owner's to settle, even if this one lived a little longer without a round.
        self.log.outage_from = self.log.rounds[-1][0] if self.log.rounds else now

    def result_delay(self, instance: int, now: int) -> int:
        """When a result a worker has now for an attempt of `instance` reaches a planner that records it."""
        if any(f.n == instance for f in self.frozen):
            return now + RESULT_ACK_TIMEOUT_MS  # sent, never acknowledged: resent through another planner
        gone = self.gone_at.get(instance)
        if gone is not None:
            return max(now, gone + RECONNECT_MS)  # the stream ended: reconnect elsewhere, then report
        return now

    async def kill(self, restart_after_ms: int) -> None:
        """SIGKILL: the instance is gone; its owner key expires with its lease; a standby claims."""
        if self.live is None:
            return
        self.gone_at[self.live.n] = self.clock.wall_ms()
        self.live.dead = True
        self.live = None
        self.node.planners.pop(PARTITION, None)
        self._lose_owner_later(restart_after_ms)

    async def freeze(self) -> None:
        """SIGSTOP: the instance keeps its memory and will try to write when it resumes."""
        if self.live is None:
            return
        self.live.frozen_at = self.clock.wall_ms()
        self.frozen.append(self.live)
        self.live = None
        self.node.planners.pop(PARTITION, None)
        self._lose_owner_later(0)

    async def thaw(self) -> None:
        """SIGCONT of the oldest frozen instance: it goes on where it was, and must be fenced out if
        somebody took over meanwhile; if nobody did, it simply serves again."""
        if not self.frozen:
            return
        inst = self.frozen.pop(0)
        inst.frozen_at = None
        for e in self.sent_when_thawed.pop(inst.n, []):
            self.workers.disarm(e)  # (a worker takes a disarm from any planner's stream)
        key = self.ks.owner(PARTITION)
        owner = await self.kv.get(key)
        if self.live is None and owner is not None and owner.create_revision == inst.token:
            self.live = inst  # resumed within its lease
            self.node.planners[PARTITION] = inst.planner
            self.owner_expires_at = self.claim_at = None
            self.log.outage_from = None
            # Its watchdog's overdue timers fire now: the worker losses it would have noticed while stopped.
            # (Dropped into a node without the planner, a crashed worker's attempt stayed RUNNING until its
            # deadline, and the stateful twin saw its `skip` schedule's runs skipped as overlapped by it.)
            losses, self.losses_in_freeze = self.losses_in_freeze, []
            if losses:
                self.node.on_lost_attempts(losses)
            return
        self.losses_in_freeze = []  # superseded: the new owner's claim expected the attempts itself
        before = len(self.log.effects)
        self.stepping = inst.n
        try:
            await inst.planner.step(self.clock.wall_ms())
        except (FencedOut, NotOwner):
            pass
        except (Restart, OutcomeUnknown, CompareFailed, EtcdError, SchedError):
            pass
        inst.dead = True
        self.gone_at[inst.n] = self.clock.wall_ms()
        # It may hand out a reserved attempt (no write to fence), but none of them may start: judged below.
        self.log.stale += self.log.effects[before:]
        await self.settle()

    async def handover(self) -> None:
        """A graceful move: the owner finishes its round, deletes its key, another claims at once."""
        if self.live is None:
            return
        key = self.ks.owner(PARTITION)
        await self.kv.txn([Compare.create_revision(key, "==", self.live.token)], [delete(key)])
        self.gone_at[self.live.n] = self.clock.wall_ms()
        self.live.dead = True
        self.live = None
        self.node.planners.pop(PARTITION, None)
        await self.claim(takeover=True)

    async def _expire_owner(self) -> None:
        key = self.ks.owner(PARTITION)
        owner = await self.kv.get(key)
        live_token = self.live.token if self.live is not None else None
        if owner is not None and owner.create_revision != live_token:
            await self.kv.txn([Compare.create_revision(key, "==", owner.create_revision)], [delete(key)])
        self.owner_expires_at = None

    # ---- time ----------------------------------------------------------------------------------------

    async def advance(self, ms: int) -> None:
        end = self.clock.wall_ms() + ms
        self.restarts_this_advance = 0
        while True:
            now = self.clock.wall_ms()
            cands = [end, self.next_round]
            for t in (self.workers.next_timer(), self.owner_expires_at, self.claim_at):
                if t is not None:
                    cands.append(t)
            nxt = max(now, min(cands))
            self.clock.advance((nxt - now) / 1000)
            now = nxt
            await self.workers.fire_due(now)
            if self.owner_expires_at is not None and now >= self.owner_expires_at:
                await self._expire_owner()
            if now >= self.next_round or (self.claim_at is not None and now >= self.claim_at and self.live is None):
                await self.round()
                self.next_round = now + ROUND_MS
            if now >= end:
                break
        if self.restarts_this_advance >= RESTART_LOOP:
            self.log.errors.append(f"[restart-loop] "
                                   f"t={self.clock.wall_ms() - T0}: {self.restarts_this_advance} planner restarts "
                                   f"within {ms} ms: a restart loop")

    async def deliver(self, e: Execution, ok: bool, ec: ErrorClass | None, message: str, ran_ms: int = 0,
                      *, not_started: bool = False) -> None:
        """A worker's result, through the real result path of the node it reaches (with the run's duration
        by the worker's clock, as a real worker's started_at/finished_at say)."""
        live = self.live is not None
        extra = [] if live else [notice_op(self.ks, 1, e.schedule_id, e.planned_ms)]
        try:
            new, disposition = await record_result(
                self.kv, self.node.ledger, e.schedule_id, e.planned_ms, e.attempt, succeeded=ok, error_class=ec,
                message=message, now_ms=self.clock.wall_ms(), worker="w", payload_of=self.node.payload_of,
                extra=extra, ran_ms=ran_ms, token=e.current.token if e.current is not None else None,
                not_started=not_started)
        except NotFound:
            return
        if disposition is Disposition.RECORDED:
            self.node._on_transition(new)

    async def confirm_start(self, e: Execution) -> bool:
        """A worker confirms it starts attempt `e.attempt` (see CONFIRM_STARTS). False: the start is refused
        (the record moved on: cancelled before it started, given up), and the handler never runs."""
        handed = e.current
        assert handed is not None
        for _ in range(5):
            cur = await self.node.ledger.get(self.kv, e.schedule_id, e.planned_ms)
            if (cur is not None and cur.state is ExecState.SCHEDULED and cur.reserved == handed.token
                    and cur.attempt == e.attempt - 1 and cur.mod_revision == e.mod_revision):
                cur = e  # its owner's reserved attempt, handed out unwritten: started from the record as created
            elif cur is None or cur.attempt != e.attempt or cur.state is not ExecState.DISPATCHED:
                return cur is not None and cur.attempt == e.attempt and cur.state in IN_FLIGHT
            new = started(cur, e.attempt, self.clock.wall_ms())
            extra = [] if self.live is not None else [notice_op(self.ks, 1, e.schedule_id, e.planned_ms)]
            # StartRecorder's own CAS: fenced by the owner key of the token the attempt was dispatched under.
            r = await self.kv.txn([], [start_cas(self.node.ledger, self.ks, cur, new, extra)])
            if self.node.ledger.cas_results(r)[0]:
                self.node._on_transition(with_revision(new, r.revision))
                return True
            again = await self.node.ledger.get(self.kv, e.schedule_id, e.planned_ms)
            if again is not None and again.mod_revision == cur.mod_revision:
                return False  # the record did not move: the fence refused it (the owner changed), as the real one
        return True  # not known either way: taken as started (the worker would retry; the safe side here)

    # ---- operations --------------------------------------------------------------------------------

    def _version(self, sid: str, state: Literal["active", "paused", "deleted"], s: Schedule | None,
                 activated: int, period_s: int = 0, *, rev: int = 0) -> None:
        now = self.clock.wall_ms()
        prev = self.log.versions.get(sid, [])
        if s is None:
            v = replace(prev[-1], at_ms=now, state=state, rev=rev)
        else:
            v = Version(now, state, period_s or prev[-1].period_s, s.spec, s.worker_pool, s.policies, activated, rev)
        self.log.versions.setdefault(sid, []).append(v)

    async def create(self, period_s: int, every: bool, pool: str, policies: Policies) -> str:
        self.sched_count += 1
        sid = f"s{self.sched_count}"
        await self._create(sid, period_s, every, pool, policies, "create")
        return sid

    async def recreate(self, sid: str, period_s: int, every: bool, pool: str, policies: Policies) -> None:
        """A deleted schedule's id created again (an operator re-creating what they deleted, `apply` after a
        delete): a new activation of the same execution ids."""
        await self._create(sid, period_s, every, pool, policies, "recreate")

    async def _create(self, sid: str, period_s: int, every: bool, pool: str, policies: Policies, what: str) -> None:
        spec = f"@every {period_s}s" if every else ("* * * * * *" if period_s == 1 else f"*/{period_s} * * * * *")
        s = Schedule(id=sid, tenant="t", spec=spec, worker_pool=pool, task_type="x", policies=policies)
        now = self.clock.wall_ms()
        st = await self.node.store.create(s, now)
        self._version(sid, "active", s, now, period_s, rev=st.schedule.version)
        self.log.ops.append(f"t={now - T0}: {what} {sid} {spec!r} pool={pool} {policies.missed_runs.value}"
                            f"/cap={policies.catchup_cap}/window={policies.catchup_window_ms} "
                            f"overlap={policies.overlap.value}")
        await self.settle()

    def deleted(self) -> list[str]:
        return sorted(sid for sid, vs in self.log.versions.items() if vs[-1].state == "deleted")

    def alive(self) -> list[str]:
        return sorted(sid for sid, vs in self.log.versions.items() if vs[-1].state != "deleted")

    async def update(self, sid: str, *, period_s: int | None = None, pool: str | None = None,
                     overlap: Overlap | None = None, missed: MissedRuns | None = None) -> None:
        st = await self.node.store.get(sid)
        s = st.schedule
        if period_s is not None:
            s = replace(s, spec="* * * * * *" if period_s == 1 else f"*/{period_s} * * * * *")
        if pool is not None:
            s = replace(s, worker_pool=pool)
        if overlap is not None or missed is not None:
            s = replace(s, policies=replace(s.policies, overlap=overlap or s.policies.overlap,
                                            missed_runs=missed or s.policies.missed_runs))
        now = self.clock.wall_ms()
        new = await self.node.store.update(s, None, now)
        base = self.log.versions[sid][-1]
        spec_changed = s.spec != st.schedule.spec
        activated = now if spec_changed else base.activated_ms
        self._version(sid, base.state, s, activated, period_s or base.period_s,
                      rev=new.schedule.version if spec_changed else base.rev)
        self.log.ops.append(f"t={now - T0}: update {sid} spec={s.spec!r} pool={s.worker_pool} "
                            f"overlap={s.policies.overlap.value} missed={s.policies.missed_runs.value}")
        await self.settle()

    async def pause(self, sid: str) -> None:
        st = await self.node.store.get(sid)
        if st.schedule.state is ScheduleState.PAUSED:
            return
        now = self.clock.wall_ms()
        new = await self.node.store.update(replace(st.schedule, state=ScheduleState.PAUSED), None, now)
        self._version(sid, "paused", None, now, rev=new.schedule.version)
        self.log.ops.append(f"t={now - T0}: pause {sid}")
        await self.settle()

    async def resume(self, sid: str) -> None:
        st = await self.node.store.get(sid)
        if st.schedule.state is ScheduleState.ACTIVE:
            return
        now = self.clock.wall_ms()
        new = await self.node.store.update(replace(st.schedule, state=ScheduleState.ACTIVE), None, now)
        base = self.log.versions[sid][-1]
        self.log.versions[sid].append(replace(base, at_ms=now, state="active", activated_ms=now,
                                              rev=new.schedule.version))
        self.log.ops.append(f"t={now - T0}: resume {sid}")
        await self.settle()

    async def delete(self, sid: str, cancel_running: bool) -> None:
        now = self.clock.wall_ms()
        await self.node.store.delete(sid, now_ms=now)
        self._version(sid, "deleted", None, now)
        if cancel_running:
            await self.ops.cancel_running(sid, "deleted")
        self.log.ops.append(f"t={now - T0}: delete {sid} cancel_running={cancel_running}")
        await self.settle()

    async def executions(self) -> list[Execution]:
        r = await self.kv.range(self.ks.executions(PARTITION), prefix=True)
        return [decode_execution(x.value, x.mod_revision) for x in r.kvs]

    async def operate(self, what: str, pick: Callable[[list[Execution]], Execution | None],
                      sid: str | None = None, back_s: int = 0) -> None:
        """Operator operations on executions, through the API's implementation; refusals are fine."""
        now = self.clock.wall_ms()
        try:
            if what == "trigger" and sid is not None:
                e = await self.ops.trigger(sid, None, None)
                self.log.ops.append(f"t={now - T0}: trigger {sid} -> {e.id}")
            elif what == "backfill" and sid is not None:
                async for c in self.ops.backfill(sid, now - back_s * 1000, now - 1, None, False):
                    if c.done:
                        self.log.ops.append(f"t={now - T0}: backfill {sid} {back_s}s: {c}")
            else:
                es = await self.executions()
                e0 = pick(es)
                if e0 is None:
                    return
                if what == "rerun":
                    self.log.ops.append(f"t={now - T0}: rerun {e0.id} ({e0.state.value})")
                    await self.ops.rerun(e0.schedule_id, e0.planned_ms)
                    self.log.reruns[e0.id] = self.log.reruns.get(e0.id, 0) + 1
                    self.log.rerun_ms.setdefault(e0.id, []).append(now)
                elif what == "cancel":
                    self.log.ops.append(f"t={now - T0}: cancel {e0.id} ({e0.state.value})")
                    await self.ops.cancel_execution(e0.id)
                    self.log.cancels.add(e0.id)
                elif what == "replay":
                    self.log.ops.append(f"t={now - T0}: replay {e0.id}")
                    await self.ops.replay_dead_letter(e0.id)
                    self.log.rerun_ms.setdefault(e0.id, []).append(now)  # a replay restarts its waits too
        except SchedError as err:
            self.log.ops.append(f"t={now - T0}:   refused: {type(err).__name__}: {err}")
        await self.settle()

    # ---- the checker --------------------------------------------------------------------------------

    async def check(self, *, final: bool = False) -> list[str]:
        es = await self.executions()
        skips = await self.kv.range(self.ks.skips(PARTITION), prefix=True)
        ranges: dict[str, list[tuple[int, int, str, int]]] = {}
        for x in skips.kvs:
            head, _, span = x.key.rpartition(b"/")
            sid = head.rsplit(b"/", 1)[1].decode()
            a, _, b = span.decode().partition("-")
            ranges.setdefault(sid, []).append((int(a), int(b), json.loads(x.value)["reason"],
                                               self.time_of(x.create_revision)))
        ck = await self.kv.get(self.ks.checkpoint(PARTITION))
        ckd = {} if ck is None else json.loads(ck.value)
        watermark, sched_rev = int(ckd.get("watermark_ms", 0)), int(ckd.get("sched_rev", 0))
        held = await self.kv.range(self.ks.holds(PARTITION), prefix=True)
        holds = {self.ks.last_segment(kv.key): int(json.loads(kv.value)["from"]) for kv in held.kvs}
        return judge(self.log, es, ranges, self.clock.wall_ms(), self.time_of, live=self.live is not None,
                     watermark=watermark, holds=holds, sched_rev=sched_rev)


# ---- judging ----------------------------------------------------------------------------------------

def armed_while_owed(log: Log, f: Effect) -> bool:
    """Start ahead (docs/workers.md): a run handed out before its due time, its start recorded then, runs at its
    due time unless its owner disarms it first; a run armed while it was owed, within the start-ahead bound of its
    planned time, counts as started then, whatever a pause, change or delete made later did not reach its worker
    in time (an owner frozen past its lease, say, while its worker still held the stream). Owed when armed: the
    version then was active, and planned it (a time of its period, after its activation)."""
    if f.armed_ms is None or f.planned_ms - f.armed_ms > log.start_ahead_ms:
        return False
    v = log.version_at(f.sid, f.armed_ms)
    return (v is not None and v.state == "active" and f.planned_ms > max(v.activated_ms, 0)
            and f.planned_ms % (v.period_s * 1000) == 0)


def owed_times(log: Log, sid: str, until_ms: int) -> dict[int, Version]:
    """Planned times the schedule owes up to `until_ms`, each with the version that planned it: a
    version covers (its start, the next version's start], so the instant of a pause or a delete is
    still owed, and a pool or policy change continues the same times."""
    out: dict[int, Version] = {}
    for v, nxt in _segments(log, sid):
        if v.state != "active":
            continue
        end = min(until_ms, nxt.at_ms if nxt is not None else until_ms)
        k = v.period_s * 1000
        t = (max(v.at_ms, v.activated_ms) // k + 1) * k
        while t <= end:
            out[t] = v
            t += k
    return out


def expected_catch_up(log: Log, sid: str, start: Start, *, before: bool = False) -> dict[int, str]:
    """What the missed-run policy says for the times behind a (re)start: "run" or a skip reason. The
    times of each activation between the watermark and the start, under the policies in effect at the
    start (a catch-up is decided when it is made), each activation's times on their own (its window and
    cap count back from its end).

    `before`: as decided by a claim that listed the schedule before the changes made at its very instant
    landed (the same fake instant): the whole decision, its catch-up and the runs it inherited, with the
    version in force just before. The judge takes either reading (the stateful twin, session 30: a handover
    and two updates at one instant; the claim decided both parts with the version before, and the checker
    judged the catch-up with the one after and the inherited runs with the one before)."""
    at = start.at_ms - 1 if before else start.at_ms
    v = log.version_at(sid, at)
    if v is not None and v.state == "deleted" and v.at_ms == start.at_ms:
        # Deleted at the instant of the start: the claim may have listed the schedule before the delete landed
        # (the same fake instant; the stateful twin: a graceful handover and a delete at 14.877 s), and then
        # decided its catch-up as of the version before.
        v = log.version_at(sid, start.at_ms - 1)
    if v is None or v.state == "deleted":
        return {}
    horizon = start.at_ms - SETTINGS.late_grace_ms
    p = v.policies
    out: dict[int, str] = {}
    acts: list[Version] = []
    for x in log.versions.get(sid, []):
        if acts and x.activated_ms == acts[-1].activated_ms:
            if x.at_ms == acts[-1].at_ms:
                # Made at the activation's very instant (a create and a spec change at once): one activation,
                # planned by the spec it ended that instant with (the stateful twin: s5 created */5 and changed to
                # every second at 5.55 s).
                acts[-1] = x
            continue
        acts.append(x)
    for i, a in enumerate(acts):
        if a.at_ms > at:
            break
        end = acts[i + 1].activated_ms if i + 1 < len(acts) and acts[i + 1].at_ms <= at else horizon
        # Owed from the watermark if the checkpoint's writer knew the activation, else from its instant: a
        # create or change made after the writer's last checkpoint but before the watermark it wrote (which
        # runs `lookahead_ms` ahead) was planned by nobody (docs/time.md, Activation).
        seen = a.rev < start.ck_rev
        wm = min(start.watermark_ms, start.holds.get(sid, start.watermark_ms))
        lo, hi = (max(wm, a.activated_ms) if seen else a.activated_ms), min(horizon, end)
        if a.state != "active" or hi <= lo:
            continue
        k = a.period_s * 1000
        times = list(range((lo // k + 1) * k, hi + 1, k))
        window_lo = max(lo, horizon - p.catchup_window_ms)  # the window counts back from now
        inside = [t for t in times if t > window_lo]
        out.update({t: "outside_catchup_window" for t in times if t <= window_lo})
        if p.missed_runs is MissedRuns.SKIP:
            out.update({t: "policy_skip" for t in inside})
        elif p.missed_runs is MissedRuns.LATEST:
            out.update({t: "policy_skip" for t in inside[:-1]})
            out.update({t: "run" for t in inside[-1:]})
        else:
            keep = inside[-p.catchup_cap:]
            out.update({t: "over_cap" for t in inside if t not in keep})
            out.update({t: "run" for t in keep})
    # Runs the dead owner wrote ahead and never handed out, as late as the times above: the policy takes them
    # with the current activation's catch-up, all of them older (docs/time.md, "Missed runs"). A change at the
    # start's very instant may have landed after the claim's listing (a pause there: the claim decided on the
    # active schedule; the stateful twin): `before`. A skip for the change's own reason is judged by that
    # reason's rule.
    cur = next((a for a in reversed(acts) if a.at_ms <= at), None)
    cands = start.inherited.get(sid, [])
    if cands and cur is not None and v.state == "active" and cur.rev < start.ck_rev and sid not in start.late_holds:
        wm = min(start.watermark_ms, start.holds.get(sid, start.watermark_ms))
        mine = sorted(t for t in cands if cur.activated_ms < t <= wm)
        made = sum(1 for t, r in out.items() if r == "run" and t > max(wm, cur.activated_ms))
        lo = horizon - p.catchup_window_ms if p.catchup_window_ms is not None else None
        older = [t for t in mine if lo is not None and t <= lo]
        inside = [t for t in mine if t not in older]
        out.update({t: "outside_catchup_window" for t in older})
        if p.missed_runs is MissedRuns.SKIP:
            out.update({t: "policy_skip" for t in inside})
        elif p.missed_runs is MissedRuns.LATEST:
            out.update({t: "policy_skip" for t in (inside if made else inside[:-1])})
        else:
            n = max(0, len(inside) - max(0, p.catchup_cap - made))
            out.update({t: "over_cap" for t in inside[:n]})
    return out


def judge(log: Log, es: list[Execution], ranges: dict[str, list[tuple[int, int, str, int]]], now: int,
          time_of: Callable[[int], int], *, live: bool, watermark: int,
          holds: dict[str, int] | None = None, sched_rev: int = 1 << 62) -> list[str]:
    """`watermark`: the partition's checkpoint in etcd. Planned times after it are not claimed handled
    yet (backpressure holds them in the planner's timer heap while workers lack capacity); the next
    owner's catch-up answers for them. So a time without any record is judged only at or below it, and
    the checkpoint itself must not stall while a pool with work has free workers."""
    bad: list[str] = list(dict.fromkeys(log.errors))
    # A planner frozen and superseded writes nothing (etcd's fence): its written dispatches fail, and a reserved
    # attempt it hands out unwritten has its start refused by the same fence (the start CAS compares the owner
    # key with the attempt's token), so no worker ever runs it.
    for f in log.stale:
        if f.start_ms < now and f.outcome != "lost":
            bad.append(f"[stale-dispatch] {f.eid} attempt {f.attempt}, handed out by a planner frozen and "
                       f"superseded after it resumed, was started ({f.outcome or 'running'})")
    by_id = {e.id: e for e in es}
    effects: dict[str, list[Effect]] = {}
    by_sched: dict[str, list[Effect]] = {}
    # Handed out by such a planner at this very instant, its start not yet asked for: judged above once it is
    # (refused), not as a run in progress (the stateful twin: a thawed stale planner handed out s1@54 at the
    # instant s1@56 ended, and the check in between read it as two runs at once).
    pending = {id(f) for f in log.stale if f.start_ms >= now and not f.outcome}
    for f in log.effects:
        if id(f) in pending:
            continue
        effects.setdefault(f.eid, []).append(f)
        by_sched.setdefault(f.sid, []).append(f)

    # 1. One attempt at a time per execution id; a planned time succeeds once (per operator rerun).
    for eid, fs in effects.items():
        runs = sorted((f for f in fs if f.outcome != "lost"), key=lambda f: f.start_ms)
        for i, one in enumerate(runs):
            for two in runs[i + 1:]:
                if one.end_ms is None or two.start_ms < one.end_ms:
                    bad.append(f"[two-at-once] {eid}: attempts {one.attempt} and {two.attempt} ran at once "
                               f"({one.start_ms - T0}-{(one.end_ms or now) - T0} and {two.start_ms - T0}-...)")
        ok = [f for f in fs if f.outcome == "succeeded"]
        if len(ok) > 1 + log.reruns.get(eid, 0):
            bad.append(f"[succeeded-twice] {eid}: succeeded {len(ok)} times (attempts {[f.attempt for f in ok]}), "
                       f"{log.reruns.get(eid, 0)} reruns asked")

    # cancel_other: the next run starts only once the cancelled one has really stopped.
    for sid, fs in by_sched.items():
        runs = sorted((f for f in fs if f.outcome != "lost"), key=lambda f: f.start_ms)
        for i, one in enumerate(runs):
            for two in runs[i + 1:]:
                if two.eid == one.eid or two.run_trigger != "scheduled":
                    continue
                # The policy of the version in force at the start, and of the one just before: an update at the
                # very instant of a round is not seen by it yet (the owner sees it through its watch; docs/time.md,
                # Activation: the stateful twin's allow_all start at the instant of an update to cancel_other).
                if not all(v is not None and v.policies.overlap is Overlap.CANCEL_OTHER
                           for v in (log.version_at(sid, two.start_ms), log.version_at(sid, two.start_ms - 1))):
                    continue
                if one.end_ms is None or two.start_ms < one.end_ms:
                    bad.append(f"[two-at-once] {two.eid} started at t={two.start_ms - T0} under cancel_other while "
                               f"{one.eid} still ran (until t={(one.end_ms or now) - T0})")

    # skip / buffer_one / buffer_all: no two of a schedule's own runs at once (docs/time.md), a retry included: a
    # run due in the backoff gap of an earlier one is not overlapped by it, but waits for its retry to end.
    for sid, fs in by_sched.items():
        runs = sorted((f for f in fs if f.outcome != "lost" and f.run_trigger == "scheduled"),
                      key=lambda f: f.start_ms)
        for i, one in enumerate(runs):
            for two in runs[i + 1:]:
                if two.eid == one.eid or (one.end_ms is not None and two.start_ms >= one.end_ms):
                    continue
                v = log.version_at(sid, two.start_ms)
                if not all(u is not None and u.policies.overlap in HOLDS
                           for u in (v, log.version_at(sid, two.start_ms - 1))):
                    continue  # (an update at the very instant of the start: as above)
                assert v is not None
                bad.append(f"[overlap-two-at-once] {two.eid} (attempt {two.attempt}) started at "
                           f"t={two.start_ms - T0} under {v.policies.overlap.value} while {one.eid} (attempt "
                           f"{one.attempt}) still ran (t={one.start_ms - T0}-{(one.end_ms or now) - T0})")

    first_start: dict[str, Effect] = {}
    for f in sorted(log.effects, key=lambda f: f.start_ms):
        first_start.setdefault(f.eid, f)

    def running_at(sid: str, eid: str, t: int) -> bool:
        """Another run was in progress at t; or an earlier one, late (it started after t though due before),
        would have been, had it started on time (docs/time.md, "What counts as overlap")."""
        for f in by_sched.get(sid, []):
            if (f.eid != eid and first_start.get(f.eid) is f and f.run_trigger == "scheduled"
                    and f.end_ms is not None and f.planned_ms <= t < f.start_ms
                    and t < f.planned_ms + f.ran_ms + ROUND_MS):
                return True
            if f.eid == eid or f.start_ms > t:
                continue
            end = f.busy_end_ms
            if end is None or t < end:
                return True
        return False

    def state_at(sid: str, t: int) -> str:
        v = log.version_at(sid, t)
        return "none" if v is None else v.state

    starts = log.starts
    catch: dict[str, list[tuple[Start, dict[int, str]]]] = {}
    for sid in log.versions:
        at_once = {x.at_ms for x in log.versions[sid]}
        catch[sid] = [(s, expected_catch_up(log, sid, s, before=b)) for s in starts
                      for b in ((False, True) if s.at_ms in at_once else (False,))]

    def later_time_due(sid: str, p: int, by: int) -> bool:
        """A planned time of sid after p came due by `by`, under the version in force when it came due: the next
        time of the spec in force then, or one of an earlier spec owed before a change (a spec change does not
        withdraw runs already due; a later run due before the change supersedes an older one just as well)."""
        vs = log.versions.get(sid, [])
        for i, v in enumerate(vs):
            end = vs[i + 1].at_ms if i + 1 < len(vs) else by + 1
            if v.state != "active" or end <= p:
                continue
            k = v.period_s * 1000  # its planned times are multiples of its period (after a change p need not be one)
            q = (max(p, v.activated_ms - 1) // k + 1) * k
            if q < end and q <= by:
                return True
        return False

    def deleted_by(sid: str, p: int, written: int) -> bool:
        """A delete can account for planned time p's record written at `written`: deleted then, or at p itself
        (a time between a delete and a create of the same id again: the deleted schedule's, owed to nobody), or
        at some moment between the two (a delete withdraws every run not started yet and cancels retries and,
        when asked, runs in flight, also when the id is created again before the owner acts on it)."""
        return state_at(sid, written) == "deleted" or state_at(sid, p) == "deleted" or any(
            v.state == "deleted" and p <= v.at_ms <= written for v in log.versions.get(sid, []))

    def skip_ok(sid: str, eid: str, p: int, reason: str, written: int) -> str | None:
        """None if the reason is justified for planned time p (skip written at `written`), else why not."""
        if reason == "paused":
            # Paused when the skip was written, or at the planned time itself (an activation that ended
            # while the partition had no owner is recorded by the next one), or paused at some moment
            # between the two: a pause withdraws every run due and not started yet, overdue ones too,
            # also when a resume follows before the owner acts on it (the skip is written after the
            # resume, the planned time was owed before the pause; docs/time.md, Activation).
            if state_at(sid, written) in ("paused", "deleted") or state_at(sid, p) == "paused" or any(
                    v.state == "paused" and p <= v.at_ms <= written for v in log.versions.get(sid, [])):
                return None
            return "paused, but it was not paused then"
        if reason in ("schedule_deleted", "deleted"):
            # Deleted when the skip was written, or at the planned time itself (a time between a delete and a
            # create of the same id again: the deleted schedule's run written ahead, owed to nobody), or deleted
            # at some moment between the two (a delete withdraws every run not started yet, also when the id is
            # created again before the owner acts on it: the skip is written after the create).
            return None if deleted_by(sid, p, written) else "deleted, but it was not deleted then"
        if reason == "overlap_skip":
            return None if running_at(sid, eid, p) else "overlap_skip, but no run of it was in progress at that time"
        if reason == "superseded":
            # cancel_other when the skip was written, and a later planned time of it was due by then.
            v = log.version_at(sid, written)
            if v is None or v.policies.overlap is not Overlap.CANCEL_OTHER:
                return "superseded, but its overlap policy was not cancel_other then"
            return None if later_time_due(sid, p, written + ROUND_MS) else "superseded, but no later run was due yet"
        if reason in ("outside_catchup_window", "over_cap", "policy_skip"):
            for s, exp in catch.get(sid, []):
                if abs(s.at_ms - written) <= ROUND_MS and exp.get(p) == reason:
                    return None
            # The same decision an earlier claim made, written again by a later one: a claim that died before
            # its first round leaves its writer's sched_rev in the checkpoint, so the next owner plans the
            # activations that writer did not know again from the replan margin (docs/time.md), and records
            # the times the dead claim had already decided once more, for the same reason.
            if any(s.at_ms <= written + ROUND_MS and exp.get(p) == reason for s, exp in catch.get(sid, [])):
                return None
            # Held while its pool had no worker, then decided as missed (when the schedule changed, or as
            # the backlog outgrew the policy): the missed-run policy applies to the times it held.
            for v0, v1 in _segments(log, sid):
                if v0.pool in ("a", "b") or (v1 is not None and p > v1.at_ms):
                    continue
                if p <= v0.at_ms and not any(
                        v0.at_ms <= s.at_ms and (v1 is None or s.at_ms < v1.at_ms)
                        and min(s.watermark_ms, s.holds.get(sid, s.watermark_ms)) < p <= s.at_ms for s in starts):
                    # Planned before the pool lost its workers: held only if a claim made while it had none
                    # took it over from behind its checkpoint (its catch-up, held as the pool's; the stateful
                    # twin: s2@3, owed through two dying claims, held by the claim at 7.9 s, decided at 8.1 s).
                    continue
                if v1 is not None and v1.at_ms <= written <= v1.at_ms + 2 * ROUND_MS:
                    return None
                # The held segment's policies, or those in force when the decision was written: a catch-up is
                # decided with the policies of its moment (docs/time.md), and a takeover decides the held times
                # of an activation that a later change (made while nobody owned the partition) ended.
                now_v = log.version_at(sid, written)
                # ... or those of a later change of its policies alone while the hold lasted (no worker still, the
                # same activation): the hold is decided with the policies it ended with (the stateful twin: s1
                # held from 2.8 s, made missed=all at 15.5 s, its times from 8 s decided over_cap at the spec
                # change at 29.3 s).
                held_on: list[Policies] = []
                for u in log.versions.get(sid, []):
                    if v0.at_ms < u.at_ms <= written:
                        if u.pool in ("a", "b") or u.state != "active" or u.activated_ms != v0.activated_ms:
                            break
                        held_on.append(u.policies)
                for pol in (v0.policies, *held_on, *((now_v.policies,) if now_v is not None else ())):
                    if ((reason == "over_cap" and pol.missed_runs is MissedRuns.ALL)
                            or (reason == "policy_skip" and pol.missed_runs is not MissedRuns.ALL)
                            or (reason == "outside_catchup_window"
                                and p <= written - pol.catchup_window_ms + GRACE_MS)):
                        return None
            wants = sorted({exp[p] for s, exp in catch.get(sid, []) if p in exp})
            return f"{reason}, but the missed-run policy after the takeovers says {wants or 'nothing (not missed)'}"
        return f"unknown skip reason {reason!r}"

    # How far planned times are judged: GRACE behind now, and not into an outage not yet over (the
    # times behind it are the next owner's, at its claim).
    until = now - GRACE_MS
    if log.outage_from is not None or not live:
        until = min(until, log.outage_from if log.outage_from is not None else now)

    owed_by_sched: dict[str, dict[int, Version]] = {}
    for sid in log.versions:
        owed = owed_times(log, sid, until)
        owed_by_sched[sid] = owed
        for p, v in sorted(owed.items()):
            eid = execution_id(sid, p)
            e = by_id.get(eid)
            covering = [(a, b, r, w) for a, b, r, w in ranges.get(sid, []) if a < p <= b]
            if e is not None:
                if e.state is ExecState.SKIPPED:
                    why = skip_ok(sid, eid, p, e.skip_reason, time_of(e.mod_revision))
                    if why is not None:
                        bad.append(f"[{_tag(why)}] {eid}: skipped as {why}")
                elif e.state is ExecState.CANCELLED and eid not in log.cancels and not (
                        e.skip_reason == "overlap"
                        and any(x.policies.overlap is Overlap.CANCEL_OTHER for x in log.versions[sid])) and not (
                        # a delete cancels the retries of its schedule's runs (docs/time.md, Activation)
                        e.skip_reason in ("schedule_deleted", "deleted")
                        and deleted_by(sid, p, time_of(e.mod_revision))) and not (
                        # a pause or delete asked to cancel what was running (cancel_running)
                        e.skip_reason == "paused" and state_at(sid, time_of(e.mod_revision)) == "paused"):
                        bad.append(f"[bad-cancel] "
                                   f"{eid}: cancelled ({e.skip_reason!r}) though no operator or policy cancelled it")
                if e.state in (ExecState.SUCCEEDED, *IN_FLIGHT) and e.trigger is Trigger.SCHEDULED:
                    for a, b, r, _ in covering:
                        bad.append(f"[ran-and-skipped] "
                                   f"{eid}: ran ({e.state.value}) and also has a skip record ({a}-{b}] {r}")
                continue
            if covering:
                for a, b, r, w in covering:
                    why = skip_ok(sid, eid, p, r, w)
                    if why is not None:
                        bad.append(f"[{_tag(why)}] {eid}: skip record ({a - T0}-{b - T0}] {why}")
                continue
            if p > watermark or (holds and sid in holds and p > holds[sid]):
                continue  # not handled yet (backpressure): the checkpoint, or the schedule's hold, is before it
            if v.rev > sched_rev:
                # An activation the checkpoint does not cover yet (written at an older schedule revision: the
                # owner has not planned with it, e.g. frozen right after the create): its owed times are the
                # owner's next round's (a takeover's catch-up), judged once a checkpoint covers it.
                continue
            cur = log.version_at(sid, now)
            before = log.version_at(sid, now - GRACE_MS)  # a pool fixed just now: the owner's next round decides
            if v.pool not in ("a", "b") and cur is not None and (
                    (cur.state == "active" and cur.pool == v.pool)
                    or (before is not None and before.state == "active" and before.pool == v.pool)):
                continue  # held while its pool has no worker: decided when the pool is served or it changes
            bad.append(f"[gap] {eid}: planned time owed since activation at t={v.activated_ms - T0} has no execution "
                       f"record and no skip record (missed silently)")

    # 3. Planned times not owed (after a pause, a delete, a spec change) must not run or stay pending.
    for e in es:
        if e.trigger is not Trigger.SCHEDULED or e.schedule_id not in log.versions:
            continue
        if e.planned_ms in owed_times(log, e.schedule_id, max(now, e.planned_ms)):
            continue
        ran = [f for f in effects.get(e.id, []) if f.run_trigger == "scheduled" and f.outcome != "lost"
               and not armed_while_owed(log, f)]
        if ran:
            st = state_at(e.schedule_id, e.planned_ms)
            bad.append(f"[not-owed-ran] "
                       f"{e.id}: ran though that planned time was not owed (schedule {st} then, or not a time of "
                       f"its spec of then)")
        elif e.state is ExecState.SCHEDULED and e.current_trigger is Trigger.SCHEDULED and e.due_ms < until:
            # (not while nobody owns the partition; and an operator's rerun of it is a run asked for, which
            # the stuck rule below judges)
            bad.append(f"[not-withdrawn] "
                       f"{e.id}: a pre-written run that is no longer owed was not withdrawn (still scheduled)")

    # 4. Nothing stuck: due runs of pools with free workers are dispatched; lost dispatches retried.
    for e in es:
        cur = log.version_at(e.schedule_id, now)
        if cur is None or cur.state != "active":
            continue
        ready = e.due_ms if e.state is ExecState.SCHEDULED else e.next_attempt_ms \
            if e.state is ExecState.RETRY_WAIT else None
        if ready is not None and cur.pool in ("a", "b"):
            siblings = [x for x in es if x.schedule_id == e.schedule_id and x.state in IN_FLIGHT]
            queued = (e.overlap or cur.policies.overlap) in (Overlap.BUFFER_ONE, Overlap.BUFFER_ALL, Overlap.SKIP,
                                                             Overlap.CANCEL_OTHER)
            if siblings and queued:
                continue  # waits behind a run that is in flight (itself judged below)
            holding = (e.overlap or cur.policies.overlap) in HOLDS
            if holding and e.state is ExecState.SCHEDULED and any(
                    x.schedule_id == e.schedule_id and x.state is ExecState.RETRY_WAIT and x.planned_ms < e.planned_ms
                    for x in es):
                continue  # waits for an earlier run's retry to end (itself judged as ready at its retry time)
            earlier = [x for x in es if x.schedule_id == e.schedule_id and x.planned_ms < e.planned_ms
                       and not x.terminal and x.state is not ExecState.RETRY_WAIT]
            progress = [f for f in by_sched.get(e.schedule_id, []) if f.start_ms > now - 2 * STUCK_ROUNDS * ROUND_MS]
            if queued and earlier and progress:
                continue  # queued, in order, behind earlier runs of its schedule that keep starting one by one
            # The pool it waits for is the current version's; a record made ready again (replay, rerun)
            # waits from when it was written.
            since = max(ready, cur.at_ms, time_of(e.mod_revision))
            runs = by_sched.get(e.schedule_id, []) if queued else []

            # A run of its schedule out then (or its result in transit): it may wait behind it.
            out = [(f.start_ms, max(f.busy_end_ms or f.end_ms or now, f.result_ms or 0) + ROUND_MS) for f in runs]
            if holding and e.state is ExecState.SCHEDULED:  # ... and an earlier run's backoff gaps
                out += [(a.finished_ms, b.dispatched_ms + ROUND_MS) for x in es
                        if x.schedule_id == e.schedule_id and x.planned_ms < e.planned_ms
                        for a, b in itertools.pairwise(x.attempts) if a.finished_ms]
            free = [t for t, cap in log.rounds if t > since + ROUND_MS and cap.get(cur.pool, 0) > 0
                    and not any(a <= t < b for a, b in out)]
            if len(free) >= STUCK_ROUNDS:
                bad.append(f"[stuck] "
                           f"{e.id}: {e.state.value} (pool {e.pool}) ready since t={ready - T0}, not dispatched "
                           f"though pool {cur.pool} had free workers in {len(free)} rounds since (stuck)")
    # A dispatch no worker received is retried (same id, next attempt) within the start timeout.
    if START_TIMEOUT_CHECK:
        for eid, fs in effects.items():
            for f in fs:
                if f.outcome != "lost":
                    continue
                # From the first round an owner had once the start timeout passed: nobody gives a dispatch up
                # while the partition has no owner, or while its claims die before their first round.
                due = f.start_ms + START_TIMEOUT_MS
                limit = next((t for t, _ in log.rounds if t >= due), max(now, due)) + 4 * ROUND_MS
                later = [g for g in fs if g.attempt > f.attempt]
                e = by_id.get(eid)
                att = None if e is None else next((a for a in e.attempts if a.attempt == f.attempt), None)
                if later and later[0].start_ms > limit:
                    # Given up in time, the next attempt waits like any retry: for a worker of its pool
                    # with capacity, and for a resume if the schedule was paused meanwhile. Its pool is the
                    # one its schedule had then (a record follows its schedule's pool changes), not the one
                    # it ends with. An attempt cancelled (by an operator or cancel_other) has no retry: the
                    # next one waits from the operator's rerun.
                    # Under skip and the buffers it also waits for the other runs of its schedule in flight
                    # (docs/time.md: a retry does not start beside another run).
                    gave_up = att.finished_ms if att is not None and att.finished_ms else None
                    if att is not None and att.never_started and att.message == RESERVED_MESSAGE:
                        # A hand-out lost with its owner ended when the record first moved or another owner claimed
                        # the partition, whichever came first: its start CAS compares the creation revision and the
                        # owner key of the planner that handed it out. The number is retired only by the next
                        # dispatch: an operator's rerun 4.5 s after a `superseded` skip, or the new owner's dispatch
                        # of the run in its turn behind a backfill's runs, 4 s after its claim (the stateful twin).
                        ends = [t for t in (log.moved_ms.get(eid), next(
                            (s.at_ms for s in log.starts if s.takeover and s.at_ms >= f.start_ms), None))
                            if t is not None]
                        if ends:
                            gave_up = min(gave_up or min(ends), *ends)
                    waits_from = None if gave_up is None else max(
                        [gave_up, *(t for t in log.rerun_ms.get(eid, []) if t < later[0].start_ms)])
                    # The run's own policy first (a backfill's or trigger's, buffer_all unless given), as the
                    # planner decides (and [stuck] above): twin, session 23, a backfill run's retry held behind
                    # an operator's rerun of its allow_all schedule. Not when a rerun or replay rewrote the
                    # record (allow_all) after this wait: it then says nothing of the policy the wait had (twin,
                    # session 23: a skip schedule's retry held behind a rerun, judged by a later replay's
                    # allow_all); the schedule's policy stands in.
                    rewritten = any(t >= later[0].start_ms for t in log.rerun_ms.get(eid, []))
                    own = e.overlap if e is not None and not rewritten else None
                    others = [(a.dispatched_ms, (a.finished_ms or now) + ROUND_MS) for x in es
                              if x.schedule_id == f.sid and x.id != eid for a in x.attempts]
                    free = [] if waits_from is None else [
                        t for t, cap in log.rounds if waits_from + ROUND_MS < t < later[0].start_ms
                        and (v := log.version_at(f.sid, t)) is not None and v.state == "active"
                        and cap.get(v.pool, 0) > 0 and not (
                            (own or v.policies.overlap) in HOLDS and any(a <= t < b for a, b in others))]
                    if gave_up is None or gave_up > limit or len(free) >= STUCK_ROUNDS:
                        bad.append(f"[start-timeout] {eid}: attempt {f.attempt} dispatched at t={f.start_ms - T0} "
                                   f"never reached a worker; attempt {later[0].attempt} came only at "
                                   f"t={later[0].start_ms - T0}")
                    continue
                if not later and att is not None and att.finished_ms > limit:
                    bad.append(f"[start-timeout] {eid}: attempt {f.attempt} dispatched at t={f.start_ms - T0} never "
                               f"reached a worker; the planner gave it up only at t={att.finished_ms - T0}")
                elif not later and now > limit and e is not None and e.attempt == f.attempt and e.state in IN_FLIGHT:
                    bad.append(f"[start-timeout] {eid}: attempt {f.attempt} dispatched at t={f.start_ms - T0} never "
                               f"reached a worker and is still {e.state.value} (no start timeout)")

    # 5. A run the previous owner wrote ahead and never handed out is as missed by the outage as the times after
    # the watermark: the claim's missed-run policy decides it, and one the policy skips never runs (docs/time.md,
    # "Missed runs"; an outside audit, session 36: runs written ahead past a watermark a paused schedule held back
    # ran 25 s late under `missed=skip`). Judged until the next start, which decides again; not for schedules the
    # claim leaves to the dispatch round, nor ones changed since (their change's rules decide), nor reruns.
    for i, claim in enumerate(starts):
        nxt = starts[i + 1].at_ms if i + 1 < len(starts) else now + 1
        for sid, cands in claim.inherited.items():
            if sid in claim.excused or sid in claim.late_holds or any(
                    claim.at_ms - ROUND_MS <= v.at_ms < nxt for v in log.versions.get(sid, [])):
                continue
            readings = [exp for s2, exp in catch.get(sid, []) if s2 is claim]
            cur = log.version_at(sid, claim.at_ms)
            for t in cands:
                says = {exp.get(t) for exp in readings}
                eid = execution_id(sid, t)
                # Only the spec in force's own times: an earlier spec's runs written ahead are withdrawn by the
                # spec change's rule (item 3), which judges them.
                if (not says or None in says or "run" in says or eid in log.reruns or cur is None
                        or t <= cur.activated_ms or t % (cur.period_s * 1000)):
                    continue
                ran = [f for f in effects.get(eid, []) if claim.at_ms <= f.start_ms < nxt and f.outcome != "lost"]
                if ran:
                    bad.append(f"[ran-missed] {eid}: written ahead by the previous owner and due beyond the late grace "
                               f"at the claim at t={claim.at_ms - T0}, it ran at t={ran[0].start_ms - T0}; the "
                               f"missed-run policy says {sorted(str(w) for w in says)}")

    # The checkpoint must not stall while a pool that has work has free workers.
    busy_pools = {vs[-1].pool for vs in log.versions.values() if vs[-1].state == "active"} & {"a", "b"}
    if live and watermark and watermark < now - 4 * GRACE_MS and busy_pools:
        free = [t for t, cap in log.rounds if t > watermark + GRACE_MS and any(cap.get(x, 0) > 0 for x in busy_pools)]
        if len(free) >= 2 * STUCK_ROUNDS:
            bad.append(f"[stuck] the partition's checkpoint is at t={watermark - T0}, {now - watermark} ms behind, "
                       f"though pools {sorted(busy_pools)} had free workers in {len(free)} rounds since")
    ignored = {t.strip() for t in os.environ.get("SCHED_IGNORE", "").split(",") if t.strip()}
    return [b for b in dict.fromkeys(bad) if b[1:b.index("]")] not in ignored]


def _tag(why: str) -> str:
    """The tag of a skip that is not justified, from its reason."""
    reason = why.split(",", 1)[0]
    return {"overlap_skip": "overlap-skip", "paused": "bad-paused-skip"}.get(reason, "bad-catch-up-skip")


def _segments(log: Log, sid: str) -> list[tuple[Version, Version | None]]:
    vs = log.versions.get(sid, [])
    return [(v, vs[i + 1] if i + 1 < len(vs) else None) for i, v in enumerate(vs)]


def default_policies(missed: MissedRuns, cap: int, window_s: int, overlap: Overlap) -> Policies:
    return Policies(missed_runs=missed, catchup_cap=cap, catchup_window_ms=window_s * 1000, overlap=overlap,
                    execution_timeout_ms=20_000,
                    retry=RetryPolicy(max_attempts=2, initial_backoff_ms=500, max_backoff_ms=1_000))


def describe(log: Log) -> str:
    return "\n".join(log.ops)




# ---- scenarios run both on the twin (tests/unit/planner) and on a real etcd (tests/store) ------------------

async def catch_up_after_a_pause_and_a_kill(w: World) -> None:
    """Two skip schedules, one paused, the planner killed: the next owner's catch-up must not record a skip
    over a run the dead owner had written ahead of its watermark (the paused one held the watermark back)."""
    skip_1s = default_policies(MissedRuns.SKIP, 1, 3, Overlap.SKIP)
    await w.advance(216)
    await w.create(1, False, "a", skip_1s)
    await w.create(1, False, "a", skip_1s)
    await w.advance(2_041)
    await w.pause("s1")
    await w.advance(800)
    await w.kill(restart_after_ms=5_183)
    await w.advance(9_158)
