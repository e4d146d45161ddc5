"""The planner's half of the heartbeat lease over its worker streams (docs/workers.md, "Liveness").

Every message on a stream refreshes its monotonic last-seen time; a watchdog ends a stream silent for
`heartbeat_timeout`. The attempts of an ended stream become orphans: a stream that re-attaches one
within `heartbeat_timeout` keeps it (Hello.running, answered after a ledger read; or a heartbeat
listing an attempt of a partition this node owns, answered from the owner's memory without a read),
else `on_lost` hands it to the owner's planner, which times it out by a CAS keyed on the attempt (a
result recorded meanwhile wins). One watchdog tick is O(streams + orphans), nothing per result.

What a stream holds (`Conn.running`) is kept true to what its worker holds, since cancels, orphaning
and the fair queue's per-type caps act on it: an attempt is added when it is assigned or re-attached
and removed by its result on that stream, a refused start (the worker never runs it), the stream's
end, or the worker's heartbeats, which list every attempt it runs: each held attempt is a lease that
the assignment, its recorded start and each heartbeat listing it renew, and that ends unrenewed after
its grace (`unlisted`). Without that, an attempt that ended without a result on its stream (the
result sent through another planner, the start refused or never asked for, an assignment the worker
dropped) stayed held for the stream's life: `cluster status` counted it, a type cap stayed taken.

The decisions are the pure functions at the top (which streams are silent, which orphans are due,
what an ended stream orphans, which held attempts a heartbeat shows gone, which listed attempts a
heartbeat re-attaches, whether a Hello's re-attach is accepted); `Liveness` applies them to the
streams and owns the orphans and the watchdog.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Container, Iterable, Mapping, Sequence

from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.clock import Clock
from scheduler.dispatch.conn import AttemptKey, Conn, Held
from scheduler.dispatch.scope import refused
from scheduler.errors import SchedError
from scheduler.execution import IN_FLIGHT, ExecState, Execution
from scheduler.ids import ExecutionId
from scheduler.store.kv import KV
from scheduler.store.ledger import Ledger

log = logging.getLogger(__name__)

Lookup = Callable[[str], Execution | None]

# ---- decisions (pure) -------------------------------------------------------------------------------


def silent(conns: Iterable[Conn], now: float, timeout: float) -> list[Conn]:
    """Streams not yet declared dead whose last message is older than `timeout` (monotonic `now`)."""
    return [c for c in conns if not c.dead and now - c.last_seen > timeout]


def due(orphans: Mapping[AttemptKey, float], now: float) -> list[AttemptKey]:
    """Orphans whose give-up time has come."""
    return [k for k, t in orphans.items() if t <= now]


def orphaned(ended: Iterable[AttemptKey], others: Sequence[Container[AttemptKey]]) -> list[AttemptKey]:
    """What an ended stream held that no other stream holds: another stream of the worker may have
    re-attached it before this one was seen to end."""
    return [k for k in ended if not any(k in held for held in others)]


def unlisted(held: Mapping[AttemptKey, Held], listed: Container[AttemptKey], now: float) -> list[AttemptKey]:
    """Attempts a stream holds that its worker no longer holds, going by a heartbeat (`listed`: every attempt
    the worker runs, whichever planner dispatched it): those without a sign of it for longer than their
    grace. A worker lists an attempt from the moment its handler runs until it ends, in every heartbeat,
    so an attempt it does not list past its grace was refused or dropped, never started, or has ended
    (its result went elsewhere, or was lost with the worker; the stream's end orphans it until then)."""
    return [k for k, h in held.items() if k not in listed and now - h.since > h.grace]


def reattach_refusal(e: Execution | None, attempt: int) -> str:
    """Why a re-attach of `attempt` is refused given the ledger's record ("" to accept): only the attempt
    the ledger still shows in flight may go on."""
    if e is not None and e.attempt == attempt and e.state in IN_FLIGHT:
        return ""
    return "unknown execution" if e is None else f"execution is {e.state.value} at attempt {e.attempt}"


def adoptable(listed: Iterable[AttemptKey], held: Container[AttemptKey], lookup: Lookup) -> list[Execution]:
    """Attempts a heartbeat lists that this stream does not hold and that the owner's memory (`lookup`: only
    partitions this node owns) shows in flight at that very attempt. Attempts of other partitions are
    another planner's to answer."""
    out: list[Execution] = []
    taken: set[AttemptKey] = set()
    for key in listed:
        if key in held or key in taken:
            continue
        e = lookup(key[0])
        if e is None or e.attempt != key[1] or e.state not in IN_FLIGHT:
            continue
        taken.add(key)
        out.append(e)
    return out


def unheld(orphans: Iterable[AttemptKey], worker_id: str, holds: Container[AttemptKey], lookup: Lookup,
           since: Mapping[AttemptKey, float], anchor: float, default_window: float) -> list[AttemptKey]:
    """Orphans that a heartbeat of `worker_id` shows it no longer holds in any form (`holds`: what it runs and
    the results it still awaits an acknowledgement for, from a worker that lists both), judged at `anchor`:
    a monotonic time before which the heartbeat cannot have been built (the send time of the probe it
    echoes). Only attempts whose start the owner's memory records (RUNNING) at that very attempt on that
    very worker count: a DISPATCHED one may still be waiting for its start answer, and a pending attempt is
    not listed. And only once the start window had passed at `anchor` since the orphan was taken up
    (`since`): the worker received the attempt before then (its start was recorded before this planner read
    it, or before the stream it came on ended), so by then it was running it (and listed it) or had refused
    it itself (docs/workers.md, "Start confirmation")."""
    out: list[AttemptKey] = []
    for key in orphans:
        if key in holds:
            continue
        e = lookup(key[0])
        cur = e.current if e is not None else None
        if e is None or cur is None or e.state is not ExecState.RUNNING or cur.attempt != key[1] \
                or cur.worker != worker_id:
            continue
        window = (cur.start_by_ms - cur.dispatched_ms) / 1000 if cur.start_by_ms > cur.dispatched_ms else default_window
        if anchor - since.get(key, anchor) >= window:
            out.append(key)
    return out


GONE_KEPT = 10_000  # workers whose last stream's end `Liveness` remembers (restarts get new ids: bounded)
SEEN_KEPT = 20_000  # attempts whose first sighting `Liveness` remembers past their orphaning (bounded)


# ---- applying them --------------------------------------------------------------------------------------


class Liveness:
    def __init__(
        self,
        *,
        conns: Mapping[int, Conn],
        clock: Clock,
        kv: KV,
        ledger: Ledger,
        lookup: Lookup,
        release: Callable[[str], None],
        on_lost: Callable[[list[AttemptKey]], None],
        heartbeat_interval: float,
        heartbeat_timeout: float,
        start_window: float = 3.0,
    ) -> None:
        """`conns`: the dispatcher's live streams (read, never changed here); `release`: an attempt of that
        task type is no longer out (the fair queue's per-type count); `on_lost`: orphans given up."""
        self.conns, self.clock, self.kv, self.ledger, self._lookup = conns, clock, kv, ledger, lookup
        self._release, self._on_lost = release, on_lost
        self.hb_interval, self.hb_timeout = heartbeat_interval, heartbeat_timeout
        self.start_window = start_window  # the default start window, for attempts whose record has none
        # Attempts of ended streams -> monotonic time they are given up unless re-attached first.
        self.orphans: dict[AttemptKey, float] = {}
        # When each orphan was taken up (monotonic): `unheld` counts the start window from then.
        self._since: dict[AttemptKey, float] = {}
        # The earliest time this node knew that any receipt of an attempt by its worker had already happened:
        # the end of the stream it was assigned on, or a claim's read of its start (RUNNING at that attempt).
        # Kept past the orphan's end, so that a partition lost and claimed again (a game day moved one four
        # times in 11 s after a quorum loss) does not count the start window again from each claim.
        self._seen: dict[AttemptKey, float] = {}
        self._probe_timer: asyncio.TimerHandle | None = None
        self._probe_due = float("inf")  # when that timer fires (monotonic, of `clock`)
        self._probe_pending = False
        # Worker id -> when its last stream here ended (monotonic), for `expect`; a new stream makes it moot
        # (`expect` looks at the open streams first). Bounded: GONE_KEPT entries.
        self._gone: dict[str, float] = {}
        self.attempts_unheld = 0
        self.orphans_vouched = 0  # renewals of an orphan's wait by another node's vouch
        # Attempt -> when another node last vouched for it (monotonic), owned here or not yet: the first vouch
        # after a planned handover can come before this node's claim, which clears the notice unread.
        self._vouched_at: dict[AttemptKey, float] = {}
        self.streams_declared_dead = 0
        self.attempts_lost = 0
        self._watchdog: asyncio.Task[None] | None = None

    def heard(self, c: Conn) -> None:
        """Any message from the worker proves it alive."""
        c.last_seen = self.clock.monotonic()

    def check(self, now: float) -> None:
        """One watchdog tick (monotonic `now`): end streams silent for longer than the heartbeat timeout,
        and give up orphaned attempts nobody re-attached in time."""
        for c in silent(self.conns.values(), now, self.hb_timeout):
            c.dead = True
            self.streams_declared_dead += 1
            log.warning("worker stopped heartbeating; ending its stream",
                        extra={"event": "worker_silent", "worker": c.worker_id,
                               "silent_s": round(now - c.last_seen, 3), "running": len(c.running)})
            c.out.put_nowait(None)  # Connect returns; its finally orphans what the worker was running
        if not self.orphans:
            return
        lost = due(self.orphans, now)
        if lost:
            self._lose(lost)
            log.warning("attempts orphaned by a lost worker stream were not re-attached in time",
                        extra={"event": "attempts_lost", "count": len(lost)})

    def _lose(self, keys: list[AttemptKey]) -> None:
        for k in keys:
            self._drop(k)
        self.attempts_lost += len(keys)
        self._on_lost(keys)

    def _sighted(self, key: AttemptKey, at: float) -> float:
        """`at`: a time by which the worker had received the attempt, if ever. Returns the earliest such time
        this node knows of, the start window's anchor."""
        first = self._seen.setdefault(key, at)
        if len(self._seen) > SEEN_KEPT:  # the oldest half: attempts long settled
            for k in list(self._seen)[: SEEN_KEPT // 2]:
                del self._seen[k]
        return min(first, at)

    def expect(self, keys: Iterable[AttemptKey]) -> None:
        """Attempts a new owner found in flight at its claim: their worker's stream may have been on the
        planner that died (or froze), which can no longer orphan them. Each is orphaned now unless a
        stream holds it, so that a heartbeat listing it (any worker's stream to this node) re-attaches it
        and, if no worker lists it within the heartbeat timeout, it is given up like any orphan: its worker
        is gone too. Without this a worker crash plus an owner change held the run until its execution
        deadline (5 min by default), its schedule's later runs skipped as overlap meanwhile."""
        now = self.clock.monotonic()
        wait = self.hb_timeout + self.hb_interval
        held = [c.running for c in self.conns.values()]
        # Streams declared dead count as here: their end (`orphan`, which records it in `_gone`) is still to be
        # handled, and `_gone` may hold an earlier stream's end, long ago. A node just thawed from a freeze declares
        # every stream dead; read as that old end, an armed run was given up 0.46 s after the claim and ran twice
        # (game day, session 33).
        here = {c.worker_id for c in self.conns.values()}
        n = 0
        for key in keys:
            if key not in self.orphans and not any(key in h for h in held):
                # The wait runs from the claim, unless the attempt's worker was connected here and is no longer:
                # then from when its last stream here ended, as if this node had dispatched it. Restarted at
                # every claim, it held a killed region's runs 21 s when a rebalance moved their partition 10 s
                # after the failover (the region drill), and 23-66 s over two or three handovers (a game day).
                # Vouched for lately by the planner it came from (dispatch/vouch.py): its worker runs it and only
                # cannot reach us, whatever became of its stream here. The whole wait, renewed by further vouches.
                # An old end is not taken for gone at once either: the first vouch may still be on its way (the
                # old owner sends it at the worker's first heartbeat after its release).
                e = self._lookup(key[0])
                worker = e.current.worker if e is not None and e.current is not None else ""
                vouched = now - self._vouched_at.get(key, float("-inf")) < self.hb_timeout
                ended = self._gone.get(worker) if worker and worker not in here and not vouched else None
                self.orphans[key] = now + wait if ended is None else max(now + 2 * self.hb_interval, ended + wait)
                # A start read as recorded: its worker had received the attempt before now (before an earlier
                # claim's read, if this node saw it then). A DISPATCHED one may still be in transit.
                running = e is not None and e.state is ExecState.RUNNING and e.attempt == key[1]
                self._since[key] = self._sighted(key, now) if running else self._seen.get(key, now)
                n += 1
        if n:
            self.start_watchdog()
            self._probe_soon()

    def vouched(self, key: AttemptKey, worker: str) -> None:
        """Another node, which no longer owns the partition, hears `worker` list this attempt on the stream it
        came on (dispatch/vouch.py): the worker runs it and sends its result there, it only cannot reach us. An
        orphan waits on as if the worker had listed it here; giving it up would run it a second time."""
        now = self.clock.monotonic()
        self._vouched_at[key] = now
        if len(self._vouched_at) > SEEN_KEPT:  # vouches long past: their attempts have ended or moved on
            self._vouched_at = {k: t for k, t in self._vouched_at.items() if now - t < self.hb_timeout}
        give_up = self.orphans.get(key)
        if give_up is None:
            return  # held by a stream here, not in flight any more, or not yet taken up (a claim to come)
        self.orphans[key] = max(give_up, now + self.hb_timeout + self.hb_interval)
        self.orphans_vouched += 1
        log.debug("an orphan's worker runs it elsewhere: waiting on", extra={
            "event": "orphan_vouched", "worker": worker, "execution_id": key[0], "attempt": key[1]})

    def orphan(self, c: Conn) -> None:
        """The stream ended (and is no longer in `conns`): what it was running may still run (a reconnect
        re-attaches it) or not."""
        now = self.clock.monotonic()
        give_up = now + self.hb_timeout
        for h in c.running.values():
            self._release(h.task_type)
        if not any(o.worker_id == c.worker_id for o in self.conns.values() if o is not c):
            self._gone[c.worker_id] = now
            if len(self._gone) > GONE_KEPT:  # worker ids of long-gone processes: forget the oldest half
                for w, _ in sorted(self._gone.items(), key=lambda x: x[1])[: GONE_KEPT // 2]:
                    del self._gone[w]
        others = [o.running for o in self.conns.values() if o is not c]
        n = 0
        for key in orphaned(c.running, others):
            self.orphans[key] = give_up
            self._since[key] = self._sighted(key, now)  # nothing reaches the worker on an ended stream
            n += 1
        c.running.clear()
        if n:
            self._probe_soon()

    # ---- what a stream holds ---------------------------------------------------------------------------

    def hold(self, c: Conn, key: AttemptKey, task_type: str, start_window: float) -> None:
        """An assignment put on the stream. Its worker lists it once its handler runs: after the transit and
        the start confirmation, which the worker gives up `start_window` after receipt (then it refuses the
        attempt itself); `heartbeat_timeout` covers the transit and the next heartbeat."""
        c.running[key] = Held(task_type, self.clock.monotonic(), start_window + self.hb_timeout)

    def started(self, c: Conn, key: AttemptKey) -> None:
        """Its start was recorded through this stream: the worker runs it, and lists it, once the answer
        arrives (a slow etcd write must not count against its grace)."""
        h = c.running.get(key)
        if h is not None:
            h.since = self.clock.monotonic()

    def forget(self, c: Conn, keys: Iterable[AttemptKey]) -> None:
        """The worker no longer holds these (a result, a refused start, its heartbeats): the stream lets go
        and their task-type slots are free again."""
        for k in keys:
            h = c.running.pop(k, None)
            if h is not None:
                self._release(h.task_type)

    def heartbeat(self, c: Conn, running: Sequence[wpb.RunningAttempt],
                  unacked: Sequence[wpb.AttemptRef] | None = None, echo: int = 0) -> None:
        """A heartbeat lists every attempt the worker runs: it is what `cluster status` shows, it renews the
        stream's hold on those and ends it on what the worker has not shown for too long, and it re-attaches
        owned attempts the stream lacks. Once per heartbeat interval: O(held + listed)."""
        now = self.clock.monotonic()
        c.reported = len(running)
        listed = {(ra.execution_id, ra.attempt) for ra in running}
        for k in listed:
            h = c.running.get(k)
            if h is not None:  # held while listed, and one heartbeat timeout after: its result is on its way
                h.since, h.grace = now, self.hb_timeout
        gone = unlisted(c.running, listed, now)
        if gone:
            log.debug("attempts the worker no longer lists let go", extra={
                "event": "unlisted", "worker": c.worker_id, "count": len(gone)})
            self.forget(c, gone)
        if running:
            self.adopt(c, running)
        if unacked is not None and self.orphans:
            self._give_up_unheld(c, listed | {(r.execution_id, r.attempt) for r in unacked}, echo, now)

    def _give_up_unheld(self, c: Conn, holds: set[AttemptKey], echo: int, now: float) -> None:
        """The orphans that this worker, heartbeating here, holds in no form are given up at once, instead of
        the heartbeat timeout after the orphan was taken up. That timeout restarted with every ownership
        change, since a new owner takes up the attempts in flight at its claim as orphans: a game day saw a
        dead worker's run held 23-66 s through two or three handovers while the worker, restarted,
        heartbeated to every planner without it. Judged only from a heartbeat echoing a probe sent after the
        start window had passed (`unheld`): a heartbeat delayed in transit, built before the worker had
        settled the start, would free an attempt it then ran, and its retry would be a second effect.
        O(orphans) per heartbeat."""
        if any(o is not c and o.worker_id == c.worker_id for o in self.conns.values()):
            # Another stream under the same id (a restarted worker while its frozen predecessor's stream is
            # still open here, or two processes given one id): this one's silence says nothing of what the
            # other runs. Wait until that stream has gone (declared dead, or closed).
            return
        sent = c.probes.get(echo) if echo else None
        if sent is not None:
            gone = unheld(self.orphans, c.worker_id, holds, self._lookup, self._since, sent, self.start_window)
            for k in gone:
                self.attempts_unheld += 1
                log.info("an orphaned attempt's worker, heartbeating, no longer holds it: giving it up",
                         extra={"event": "attempt_unheld", "worker": c.worker_id, "execution_id": k[0],
                                "attempt": k[1]})
            if gone:  # at once, not at the next watchdog tick (up to a heartbeat interval later)
                self._lose(gone)
        self._probe(c, holds, now)

    def _probe(self, c: Conn, holds: Container[AttemptKey], now: float) -> None:
        """A probe for the worker to echo, if one of its candidates has passed its window (`holds`: what the
        worker last showed it holds)."""
        if unheld(self.orphans, c.worker_id, holds, self._lookup, self._since, now, self.start_window):
            self._send_probe(c, now)

    def _send_probe(self, c: Conn, now: float) -> None:
        """A probe, unless one that recent is out (a worker answers each with a heartbeat at once)."""
        latest = max(c.probes.values(), default=None)
        if latest is None or latest < now - self.hb_interval / 4:
            c.probe_seq += 1
            c.probes[c.probe_seq] = now
            for old in [q for q in c.probes if q <= c.probe_seq - 8]:
                del c.probes[old]
            c.out.put_nowait(wpb.PlannerMessage(probe=wpb.Probe(seq=c.probe_seq)))

    def _probe_soon(self) -> None:
        """New orphans: probe their workers' streams now if a window has passed, and again when the next one
        passes. Otherwise the probe waited for the worker's next heartbeat (a second after the window, at
        worst). Once per turn of the loop, however many claims took orphans up in it."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous test): heartbeats bring the probes
            return
        if not self._probe_pending:
            self._probe_pending = True
            loop.call_soon(self._probe_now)

    def _on_probe_timer(self) -> None:
        self._probe_timer, self._probe_due = None, float("inf")
        self._probe_now()

    def _probe_now(self) -> None:
        self._probe_pending = False
        now = self.clock.monotonic()
        workers = {w for k in self.orphans if (w := self._probe_worker(k, now))}
        for c in list(self.conns.values()):
            if not c.dead and c.worker_id in workers:
                self._send_probe(c, now)
        nxt = min((t + self.start_window for k, t in self._since.items() if k in self.orphans
                   and t + self.start_window > now), default=None)
        if nxt is not None and nxt < self._probe_due - 0.05:
            if self._probe_timer is not None:
                self._probe_timer.cancel()
            self._probe_due = nxt
            self._probe_timer = asyncio.get_running_loop().call_later(nxt - now + 0.01, self._on_probe_timer)

    def _probe_worker(self, key: AttemptKey, now: float) -> str:
        """The worker to probe for orphan `key` ("" if none yet): `unheld`'s test with nothing known held."""
        e = self._lookup(key[0])
        worker = e.current.worker if e is not None and e.current is not None else ""
        ready = worker and unheld((key,), worker, (), self._lookup, self._since, now, self.start_window)
        return worker if ready else ""

    def _drop(self, key: AttemptKey) -> None:
        self.orphans.pop(key, None)
        self._since.pop(key, None)

    def _attach(self, c: Conn, key: AttemptKey, task_type: str) -> None:
        """Re-attached from a list of what the worker runs (Hello or a heartbeat): as if listed just now."""
        c.running[key] = Held(task_type, self.clock.monotonic(), self.hb_timeout)
        self._drop(key)  # its worker is back in time

    async def reattach(self, c: Conn, running: Sequence[wpb.RunningAttempt]) -> wpb.PlannerMessage:
        """A Hello's running attempts: accepted where the ledger still shows that attempt in flight, else
        rejected (the worker stops it at once, without a result). An attempt whose record could not be
        read (etcd unreachable from here, a read timeout) is neither: not knowing is no reason to stop a
        run, and a rejection would cut short an attempt the ledger still has in flight, which the owner
        then times out and retries while the worker's handler had been stopped mid-effect (the game day
        saw 17 such runs, each during a link fault or a quorum loss). The worker keeps it on its origin
        stream, under the same heartbeat timeout as any orphan, and the owner adopts it from a heartbeat.
        Returns the Reattached answer."""
        c.reported = len(running)
        accepted, rejected = [], []
        unread = 0
        for ra in running:
            try:
                eid = ExecutionId.parse(ra.execution_id)
            except SchedError:
                e = None  # not an execution id at all: nothing to re-attach
            else:
                try:
                    e = await self.ledger.get(self.kv, eid.schedule_id, eid.planned_ms)
                except SchedError:
                    unread += 1
                    continue
            # Another pool's or tenant's run is never re-attached to this stream (dispatch/scope.py).
            why = (refused(c.scope, e, "re-attach", c.worker_id) if e is not None else "") \
                or reattach_refusal(e, ra.attempt)
            if not why:
                assert e is not None
                self._attach(c, (ra.execution_id, ra.attempt), e.task_type)
                accepted.append(wpb.AttemptRef(execution_id=ra.execution_id, attempt=ra.attempt))
            else:
                rejected.append(wpb.RejectedAttempt(execution_id=ra.execution_id, attempt=ra.attempt, reason=why))
        if unread:
            log.warning("re-attach: %d running attempt(s) of worker %s left unanswered, their records unreadable",
                        unread, c.worker_id, extra={"event": "reattach_unread", "worker": c.worker_id,
                                                    "count": unread})
        return wpb.PlannerMessage(reattached=wpb.Reattached(accepted=accepted, rejected=rejected))

    def adopt(self, c: Conn, running: Sequence[wpb.RunningAttempt]) -> None:
        """A heartbeat lists attempts this stream does not track: those of partitions this node owns, still
        in flight at the same attempt in the owner's memory, are taken over (answered Reattached), so that a
        planner taking over a partition re-attaches its running attempts without a ledger read and they
        are not orphaned."""
        taken = []
        for e in adoptable(((ra.execution_id, ra.attempt) for ra in running if (ra.execution_id, ra.attempt)
                            not in c.refused), c.running, self._lookup):
            if refused(c.scope, e, "heartbeat re-attach", c.worker_id):
                c.refused.add((e.id, e.attempt))
            else:
                taken.append(e)
        if not taken:
            return
        for e in taken:
            self._attach(c, (e.id, e.attempt), e.task_type)
        log.info("running attempts re-attached from a heartbeat",
                 extra={"event": "reattached", "worker": c.worker_id, "count": len(taken)})
        c.out.put_nowait(wpb.PlannerMessage(reattached=wpb.Reattached(
            accepted=[wpb.AttemptRef(execution_id=e.id, attempt=e.attempt) for e in taken])))

    # ---- the watchdog -------------------------------------------------------------------------------

    def start_watchdog(self) -> None:
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.create_task(self._watch(), name="dispatch-watchdog")

    async def _watch(self) -> None:
        period = max(0.01, min(self.hb_interval, self.hb_timeout / 4))
        while True:
            await asyncio.sleep(period)
            try:
                self.check(self.clock.monotonic())
            except Exception:  # the watchdog must outlive a bug in one tick
                log.exception("liveness check failed")
