"""Operator operations on executions, on behalf of API callers on any node: trigger, rerun, backfill,
cancel, replay and discard.

None of these depends on owning the partition, so none is fenced: a new record is created only if its
key is absent (`create_revision == 0`), a change is a compare-and-swap on the record's mod_revision,
exactly as a result recorded by any planner is (DESIGN.md, Execution identity and the ledger). Every
write also puts a notice (scheduler.store.notices) in the same txn, so the partition's owner re-reads
the record at once: it dispatches a triggered run without waiting for a restart, drops a cancelled one
and tells its worker to stop. A lost compare means someone changed the record meanwhile: read it again
and decide again, a bounded number of times.

Semantics follow the comments of proto/scheduler/v1/schedule_service.proto; errors name the request
field (`trigger_time`, `planned_at`, `start_time`, `end_time`, `execution_id`, `reason`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from scheduler.clock import Clock
from scheduler.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from scheduler.execution import (
    IN_FLIGHT,
    ExecState,
    Execution,
    Trigger,
    armed,
    cancel,
    discard,
    replay,
    rerun,
    with_revision,
)
from scheduler.ids import ID_RE, MAX_ID_LEN, ExecutionId, execution_id, format_rfc3339_ms
from scheduler.model import Schedule, ScheduleState
from scheduler.store.etcd.ops import Op
from scheduler.store.keyspace import Keyspace, partition_for
from scheduler.store.kv import KV
from scheduler.store.ledger import DeadLetterEntry, Ledger
from scheduler.store.notices import notice_op
from scheduler.store.schedules import ScheduleStore, StoredSchedule
from scheduler.timeplan import Overlap, SkipReason
from scheduler.timeplan.overlap import OverlapAction, decide_overlap
from scheduler.timeplan.plan import format_duration_ms

MAX_REASON_BYTES = 1024
BACKFILL_OVERLAP = Overlap.BUFFER_ALL  # BackfillRequest.overlap_policy UNSPECIFIED


@dataclass(frozen=True)
class BackfillCounts:
    """Cumulative progress of one backfill call: planned = created + existing + skipped."""

    planned: int
    created: int  # with dry_run: that would be created
    existing: int  # already had an execution; left alone
    skipped: int  # recorded as skipped by the overlap policy (overlap_skip)
    processed_until_ms: int | None  # every planned time before this has been processed
    done: bool


class Operations:
    def __init__(
        self,
        kv: KV,
        ks: Keyspace,
        partitions: int,
        store: ScheduleStore,
        ledger: Ledger,
        clock: Clock,
        *,
        rpc_timeout: float,
        skew_allowance_ms: int = 60_000,
        backfill_limit: int = 100_000,
        backfill_batch: int = 100,
        max_rounds: int = 5,
        max_trigger_probes: int = 10_000,
    ) -> None:
        self.kv, self.ks, self.partitions = kv, ks, partitions
        self.store, self.ledger, self.clock = store, ledger, clock
        self.timeout = rpc_timeout
        self.skew_allowance_ms = skew_allowance_ms
        self.backfill_limit = backfill_limit
        # Creates per txn: each is a nested txn, and etcd's default --max-txn-ops is 128.
        self.backfill_batch = max(1, min(backfill_batch, 100))
        self.max_rounds = max_rounds
        self.max_trigger_probes = max_trigger_probes

    # ---- helpers ------------------------------------------------------------------------------------

    async def _schedule(self, schedule_id: str) -> StoredSchedule:
        if not schedule_id or len(schedule_id) > MAX_ID_LEN or not ID_RE.match(schedule_id):
            raise NotFound(f"schedule {schedule_id!r} not found")  # no stored schedule can have this id
        return await self.store.get(schedule_id)

    @staticmethod
    def _active(st: StoredSchedule, what: str) -> Schedule:
        s = st.schedule
        if s.state is ScheduleState.PAUSED:
            raise FailedPrecondition(f"schedule {s.id!r} is paused; resume it before {what}")
        return s

    @staticmethod
    def _check_reason(reason: str) -> None:
        if len(reason.encode()) > MAX_REASON_BYTES:
            raise InvalidArgument("reason", f"is {len(reason.encode())} bytes; the limit is {MAX_REASON_BYTES}")

    def _notice(self, e: Execution, *, cancel_attempt: int = 0, reason: str = "") -> list[Op]:
        return [notice_op(self.ks, self.partitions, e.schedule_id, e.planned_ms, cancel_attempt=cancel_attempt,
                          reason=reason)]

    @staticmethod
    def _new(s: Schedule, planned_ms: int, due_ms: int, trigger: Trigger, overlap: Overlap | None) -> Execution:
        p = s.policies
        return Execution(id=execution_id(s.id, planned_ms), schedule_id=s.id, tenant=s.tenant, pool=s.worker_pool,
                         task_type=s.task_type, planned_ms=planned_ms, due_ms=due_ms, trigger=trigger, retry=p.retry,
                         timeout_ms=p.execution_timeout_ms, overlap=overlap)

    async def _create(self, e: Execution) -> Execution | None:
        """Create-if-absent with its notice; None if the id was taken meanwhile."""
        r = await self.kv.txn([], [self.ledger.create_op(e, self._notice(e))], timeout=self.timeout)
        return with_revision(e, r.revision) if self.ledger.cas_results(r)[0] else None

    async def _cas(self, old: Execution, new: Execution, *, cancel_attempt: int = 0,
                   reason: str = "") -> Execution | None:
        """Compare-and-swap with its notice; None if the record changed since `old` was read."""
        op = self.ledger.cas_op(new, old.mod_revision, now_ms=self.clock.wall_ms(), old_state=old.state,
                                extra=self._notice(new, cancel_attempt=cancel_attempt, reason=reason))
        r = await self.kv.txn([], [op], timeout=self.timeout)
        return with_revision(new, r.revision) if self.ledger.cas_results(r)[0] else None

    def _busy(self, eid: str) -> FailedPrecondition:
        return FailedPrecondition(f"execution {eid} kept changing under {self.max_rounds} attempts; try again")

    # ---- trigger ------------------------------------------------------------------------------------

    async def trigger(self, schedule_id: str, at_ms: int | None, overlap: Overlap | None) -> Execution:
        """Run now (Trigger MANUAL). The id comes from the trigger time, moved forward by whole
        milliseconds off planned times and taken ids; a repeat with the same trigger_time returns the
        execution the first call created."""
        s = self._active(await self._schedule(schedule_id), "triggering it")
        now = self.clock.wall_ms()
        if at_ms is not None and abs(at_ms - now) > self.skew_allowance_ms:
            off = format_duration_ms(abs(at_ms - now))
            raise InvalidArgument("trigger_time", f"{format_rfc3339_ms(at_ms)} is {off} from the server's clock; "
                                  f"the allowance is "
                                  f"{format_duration_ms(self.skew_allowance_ms)} (leave it unset for now)")
        plan = s.plan()
        t = now if at_ms is None else at_ms
        for _ in range(self.max_trigger_probes):
            if plan.next_after_ms(t - 1) == t:
                t += 1  # a manual run never takes a planned run's id
                continue
            e = await self.ledger.get(self.kv, s.id, t, timeout=self.timeout)
            if e is not None:
                if at_ms is not None and e.trigger is Trigger.MANUAL:
                    return e  # a retried request: the run its first call created
                t += 1
                continue
            created = await self._create(self._new(s, t, t, Trigger.MANUAL, overlap))
            if created is not None:
                return created
            # Taken between our read and our create: look at the same instant again.
        raise ResourceExhausted(f"no free execution id within {format_duration_ms(self.max_trigger_probes)} of the "
                                f"trigger time")

    # ---- rerun --------------------------------------------------------------------------------------

    async def rerun(self, schedule_id: str, planned_ms: int) -> Execution:
        """Run one planned time again under its execution id (Trigger RERUN), as the next attempt."""
        s = self._active(await self._schedule(schedule_id), "rerunning it")
        now = self.clock.wall_ms()
        if planned_ms > now:
            raise InvalidArgument("planned_at", f"{format_rfc3339_ms(planned_ms)} is in the future")
        eid = execution_id(s.id, planned_ms)
        for _ in range(self.max_rounds):
            e = await self.ledger.get(self.kv, s.id, planned_ms, timeout=self.timeout)
            if e is None:
                if s.plan().next_after_ms(planned_ms - 1) != planned_ms:
                    raise InvalidArgument("planned_at", f"{format_rfc3339_ms(planned_ms)} is not a planned time of "
                                          f"the schedule's current spec and has no execution")
                created = await self._create(self._new(s, planned_ms, now, Trigger.RERUN, Overlap.ALLOW_ALL))
                if created is not None:
                    return created
                continue
            if e.state is ExecState.DEAD_LETTER:
                raise FailedPrecondition(f"execution {eid} is a dead letter; replay it (ReplayDeadLetter; "
                                         "schedctl dlq replay)")
            if e.state is ExecState.CANCELLING and e.current is not None:
                raise FailedPrecondition(f"execution {eid} is cancelling: attempt {e.attempt} has not confirmed its "
                                         f"stop yet (at the latest by {format_rfc3339_ms(e.current.deadline_ms)}); "
                                         f"rerun it once it has stopped")
            if not e.terminal:
                raise FailedPrecondition(f"execution {eid} is {e.state.value} (attempt {e.attempt}); "
                                         f"rerun it once it has finished")
            p = s.policies
            new = replace(rerun(e, now, retry=p.retry, timeout_ms=p.execution_timeout_ms),
                          tenant=s.tenant, pool=s.worker_pool, task_type=s.task_type)
            done = await self._cas(e, new)
            if done is not None:
                return done
        raise self._busy(eid)

    # ---- backfill -----------------------------------------------------------------------------------

    async def backfill(self, schedule_id: str, start_ms: int, end_ms: int, overlap: Overlap | None,
                       dry_run: bool) -> AsyncIterator[BackfillCounts]:
        """Materialize the planned times in [start, end) (Trigger BACKFILL), due now, in batches of one
        txn each, yielding cumulative counts after each. Validation happens before the first yield."""
        s = self._active(await self._schedule(schedule_id), "backfilling it")
        now = self.clock.wall_ms()
        if end_ms <= start_ms:
            raise InvalidArgument("end_time", "must be after start_time")
        if end_ms > now:
            raise InvalidArgument("end_time", f"{format_rfc3339_ms(end_ms)} is in the future")
        plan = s.plan()
        times: list[int] = []
        for t in plan.between_ms(start_ms - 1, end_ms - 1):
            times.append(t)
            if len(times) > self.backfill_limit:
                raise ResourceExhausted(f"the range holds more than {self.backfill_limit} planned times (the "
                                        f"backfill limit); split it")
        # A backfill's own policy (Temporal's BackfillRequest has one), by default every planned time
        # of the range, one after another: the schedule's policy is about a run coming due while
        # another runs, and a backfill makes them all due at once (issue 9, item 6).
        policy = overlap or BACKFILL_OVERLAP
        p = partition_for(s.id, self.partitions)
        current, _ = await self.ledger.list_partition(self.kv, p, schedule_id=s.id, timeout=self.timeout)
        running = tuple(e.id for e in current if e.state in IN_FLIGHT)
        buffered: tuple[str, ...] = ()
        planned = created = existing = skipped = 0
        if not times:
            yield BackfillCounts(0, 0, 0, 0, end_ms, True)
            return
        for i in range(0, len(times), self.backfill_batch):
            batch = times[i:i + self.backfill_batch]
            have = await self.kv.range(self.ks.execution(p, s.id, batch[0]),
                                       range_end=self.ks.execution(p, s.id, batch[-1] + 1), keys_only=True,
                                       timeout=self.timeout)
            taken = {int(self.ks.last_segment(kv.key)) for kv in have.kvs}
            new: list[Execution] = []
            for t in batch:
                if t in taken:
                    continue
                e = self._new(s, t, now, Trigger.BACKFILL, policy)
                action = OverlapAction.START if policy is Overlap.ALLOW_ALL else \
                    decide_overlap(policy, running, buffered).action
                if action is OverlapAction.SKIP:
                    e = replace(e, state=ExecState.SKIPPED, skip_reason=SkipReason.OVERLAP_SKIP.value)
                elif action is OverlapAction.BUFFER:
                    buffered += (e.id,)
                else:
                    running += (e.id,)  # cancel_other: each cancels the one before when dispatched
                new.append(e)
            applied = [True] * len(new)
            if new and not dry_run:
                ops: list[Op] = [self.ledger.create_op(e) for e in new]
                ops.append(notice_op(self.ks, self.partitions, s.id, batch[0], batch[-1]))
                r = await self.kv.txn([], ops, timeout=self.timeout)
                applied = self.ledger.cas_results(r)[: len(new)]
            for e, ok in zip(new, applied, strict=True):
                if not ok:
                    existing += 1  # created by someone else since we looked: never overwritten
                elif e.state is ExecState.SKIPPED:
                    skipped += 1
                else:
                    created += 1
            existing += len(batch) - len(new)
            planned += len(batch)
            nxt = i + self.backfill_batch
            last = nxt >= len(times)
            # Up to the next planned time still to do: a progress bar moves over the gaps too.
            yield BackfillCounts(planned, created, existing, skipped, end_ms if last else times[nxt], last)

    # ---- cancel ---------------------------------------------------------------------------------------

    async def _cancel(self, e: Execution, reason: str) -> Execution | None:
        """One cancel attempt from a read record: raises if it cannot be cancelled, None if it changed."""
        if e.state is ExecState.DEAD_LETTER:
            raise FailedPrecondition(f"execution {e.id} is a dead letter; discard it with DiscardDeadLetter")
        if e.terminal:
            raise FailedPrecondition(f"execution {e.id} is already {e.state.value}")
        if e.state is ExecState.CANCELLING and e.current is not None:  # the first cancel's kill deadline stands
            raise FailedPrecondition(f"execution {e.id} is already cancelling: its worker is stopping attempt "
                                     f"{e.attempt} (at the latest by {format_rfc3339_ms(e.current.deadline_ms)})")
        in_flight = e.state in IN_FLIGHT
        # An attempt that is out becomes CANCELLING until its worker confirms the stop (or the kill
        # deadline passes): nothing may start this id again (rerun) before it really stopped.
        new = cancel(e, reason, self.clock.wall_ms())
        return await self._cas(e, new, cancel_attempt=e.attempt if in_flight else 0, reason=reason)

    async def cancel_execution(self, execution_id: str, reason: str = "cancelled by operator") -> Execution:
        """Cancel a non-terminal execution; a running attempt's worker is told to stop (via the owner)."""
        eid = ExecutionId.parse(execution_id)
        self._check_reason(reason)
        reason = reason or "cancelled by operator"
        for _ in range(self.max_rounds):
            e = await self.ledger.get(self.kv, eid.schedule_id, eid.planned_ms, timeout=self.timeout)
            if e is None:
                raise NotFound(f"execution {execution_id} not found")
            done = await self._cancel(e, reason)
            if done is not None:
                return done
        raise self._busy(execution_id)

    async def cancel_running(self, schedule_id: str, reason: str) -> int:
        """Cancel every dispatched or running execution of a schedule (pause/delete with cancel_running);
        returns how many were cancelled. The schedule itself need not exist any more.

        Not a run handed out ahead of its due time that is not due yet (start ahead, `execution.armed`): nothing
        of it runs yet, and its owner disarms it on the pause or delete, after which it is withdrawn as paused or
        deleted once due, as the schedule's other waiting runs are (and owed again by a resume, or by a schedule
        created again with the same id; cancelled here, it was lost for good: the stateful twin, a delete with
        cancel_running and a create of the same id at one instant). One whose worker could not be reached in time
        runs, as any run that started before the pause."""
        self._check_reason(reason)
        reason = reason or "cancelled by operator"
        p = partition_for(schedule_id, self.partitions)
        listing, _ = await self.ledger.list_partition(self.kv, p, schedule_id=schedule_id, timeout=self.timeout)
        n = 0
        for e in listing:
            cur: Execution | None = e
            for _ in range(self.max_rounds):
                if cur is None or cur.state not in IN_FLIGHT or cur.state is ExecState.CANCELLING:
                    break  # finished (or gone, or being cancelled) meanwhile: nothing to cancel
                if armed(cur, self.clock.wall_ms()):
                    break  # waits for its due time on its worker: disarmed by its owner instead
                if await self._cancel(cur, reason) is not None:
                    n += 1
                    break
                cur = await self.ledger.get(self.kv, e.schedule_id, e.planned_ms, timeout=self.timeout)
        return n

    # ---- dead letters -------------------------------------------------------------------------------

    async def _dead_letter(self, execution_id: str) -> Execution:
        eid = ExecutionId.parse(execution_id)
        e = await self.ledger.get(self.kv, eid.schedule_id, eid.planned_ms, timeout=self.timeout)
        if e is None or e.state is not ExecState.DEAD_LETTER:
            raise NotFound(f"{execution_id} is not a dead letter" + ("" if e is None else f" (it is {e.state.value})"))
        return e

    async def _dead_payload(self, e: Execution) -> bytes | None:
        p = partition_for(e.schedule_id, self.partitions)
        got = await self.kv.get(self.ks.dead_letter(p, e.schedule_id, e.planned_ms), timeout=self.timeout)
        # None for an unreadable index entry too: the schedule's current payload, as for any run.
        return None if got is None else DeadLetterEntry.payload_of(got.value)

    async def replay_dead_letter(self, execution_id: str, reason: str = "",
                                 use_current_schedule: bool = False) -> Execution:
        """Back to scheduled under its original id, with a fresh retry budget (Trigger REPLAY); the
        dead-letter key goes in the same txn. By default it runs as it died: the payload snapshot of
        its dead letter, its task type, pool, retry policy and timeout. `use_current_schedule`: with
        the schedule's current payload, task type, pool, retry policy and timeout instead (the fix an
        operator made with UpdateSchedule)."""
        self._check_reason(reason)
        for _ in range(self.max_rounds):
            e = await self._dead_letter(execution_id)
            try:
                st = await self.store.get(e.schedule_id)
            except NotFound:
                raise FailedPrecondition(f"schedule {e.schedule_id!r} was deleted; discard the dead letter "
                                         f"instead") from None
            s = self._active(st, "replaying its dead letters")
            if use_current_schedule:
                p = s.policies
                # payload None: the planner sends the schedule's payload as of the dispatch.
                new = replace(replay(e, self.clock.wall_ms()), payload=None, tenant=s.tenant, pool=s.worker_pool,
                              task_type=s.task_type, retry=p.retry, timeout_ms=p.execution_timeout_ms)
            else:
                new = replay(e, self.clock.wall_ms(), payload=await self._dead_payload(e))
            if reason:
                new = replace(new, skip_reason=reason)
            done = await self._cas(e, new)
            if done is not None:
                return done
        raise self._busy(execution_id)

    async def discard_dead_letter(self, execution_id: str, reason: str = "") -> Execution:
        """Remove the dead letter for good; the execution ends FAILED."""
        self._check_reason(reason)
        for _ in range(self.max_rounds):
            e = await self._dead_letter(execution_id)
            new = discard(e)
            if reason:
                new = replace(new, skip_reason=reason)
            done = await self._cas(e, new)
            if done is not None:
                return done
        raise self._busy(execution_id)
