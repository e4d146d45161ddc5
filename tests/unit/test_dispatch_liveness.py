"""The planner's liveness bookkeeping (dispatch/liveness.py) with a fake clock, no gRPC: silent streams are
ended, orphaned attempts are given up after the heartbeat timeout unless re-attached (Hello or a heartbeat
of an owned partition), and a result's worker id is written into its attempt."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, cast

from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.clock import FakeClock
from scheduler.dispatch.conn import AttemptKey, Conn, Held
from scheduler.dispatch.liveness import Liveness, adoptable, due, orphaned, reattach_refusal, silent, unheld, unlisted
from scheduler.execution import ErrorClass, ExecState, Execution, Trigger, dispatch, new_execution, result, started
from scheduler.ids import FencingToken
from scheduler.model import RetryPolicy

EID = "s1@2026-01-01T00:00:00.000Z"
OTHER = "other@2026-01-01T00:00:01.000Z"


class Env:
    def __init__(self, lookup: dict[str, Execution] | None = None, start_window: float = 3.0) -> None:
        self.clock = FakeClock()
        self.lost: list[list[AttemptKey]] = []
        self.released: list[str] = []
        self.conns: dict[int, Conn] = {}
        self.live = Liveness(conns=self.conns, clock=self.clock, kv=cast(Any, None), ledger=cast(Any, None),
                             lookup=(lookup or {}).get, release=self.released.append, on_lost=self.lost.append,
                             heartbeat_interval=0.1, heartbeat_timeout=1.0, start_window=start_window)

    def conn(self, worker: str = "w1") -> Conn:
        c = Conn(worker, "pool", "r", frozenset(), asyncio.Queue(), last_seen=self.clock.monotonic())
        self.conns[max(self.conns, default=-1) + 1] = c
        return c


def in_flight() -> Execution:
    e = new_execution(id=EID, schedule_id="s1", tenant="t", pool="pool", task_type="x", planned_ms=0, due_ms=0,
                      trigger=Trigger.SCHEDULED, retry=RetryPolicy(), timeout_ms=3_600_000)
    return dispatch(e, worker="", planner="n1", token=FencingToken(0, 1), now_ms=0)


# ---- the pure decisions ----------------------------------------------------------------------------


def test_silent_streams_are_those_past_the_timeout_not_yet_declared_dead() -> None:
    env = Env()
    fresh, old, gone = env.conn("fresh"), env.conn("old"), env.conn("gone")
    old.last_seen = gone.last_seen = env.clock.monotonic() - 2
    gone.dead = True
    assert silent(env.conns.values(), env.clock.monotonic(), 1.0) == [old]
    assert silent([fresh], env.clock.monotonic() + 1.0, 1.0) == [], "exactly the timeout is not yet silent"


def test_due_orphans_and_what_an_ended_stream_orphans() -> None:
    assert due({(EID, 1): 5.0, (OTHER, 1): 6.0}, 5.0) == [(EID, 1)]
    assert orphaned([(EID, 1), (OTHER, 1)], [{(OTHER, 1)}, set()]) == [(EID, 1)], "another stream holds OTHER"


def test_a_reattach_is_accepted_only_for_the_attempt_in_flight() -> None:
    e = in_flight()
    assert reattach_refusal(e, 1) == ""
    assert reattach_refusal(e, 2) == "execution is dispatched at attempt 1"
    assert reattach_refusal(None, 1) == "unknown execution"
    done, _ = result(e, 1, succeeded=True, error_class=None, message="", now_ms=5)
    assert done.state is ExecState.SUCCEEDED and reattach_refusal(done, 1) == "execution is succeeded at attempt 1"


def test_adoptable_takes_owned_in_flight_attempts_not_held_once_each() -> None:
    owned = {EID: in_flight()}
    listed = [(EID, 1), (EID, 1), (EID, 0), ("notmine@2026-01-01T00:00:00.000Z", 1)]
    assert [(e.id, e.attempt) for e in adoptable(listed, set(), owned.get)] == [(EID, 1)]
    assert adoptable(listed, {(EID, 1)}, owned.get) == [], "already held by the stream"


def test_unlisted_lets_go_of_what_the_worker_has_not_shown_for_longer_than_its_grace() -> None:
    a, b, c = (EID, 1), (OTHER, 1), ("c@2026-01-01T00:00:02.000Z", 1)
    held = {a: Held("x", 10.0, 1.5),  # not listed, within its grace: in transit, waiting for its start, or
            b: Held("x", 10.0, 1.5),  # ... just ended with its result on the way
            c: Held("x", 8.0, 1.5)}  # not listed past its grace: refused, dropped, or ended elsewhere
    assert unlisted(held, {b}, now=11.0) == [c]
    assert unlisted(held, {b}, now=11.6) == [a, c], "a listed attempt is never let go"
    assert unlisted(held, {a, b, c}, now=99.0) == []


# ---- applied to streams ----------------------------------------------------------------------------


def test_a_silent_stream_is_ended_once_and_only_after_the_timeout() -> None:
    env = Env()
    c = env.conn()
    env.clock.advance(0.9)
    env.live.check(env.clock.monotonic())
    assert c.out.empty() and not c.dead
    env.clock.advance(0.2)
    env.live.check(env.clock.monotonic())
    assert c.dead and c.out.get_nowait() is None, "the stream is told to end"
    env.live.check(env.clock.monotonic() + 5)
    assert c.out.empty() and env.live.streams_declared_dead == 1, "declared dead once"


def test_orphans_are_given_up_after_the_timeout_unless_reattached() -> None:
    env = Env()
    c = env.conn()
    c.running = {(EID, 1): Held("x", 0.0, 1.0), (OTHER, 1): Held("x", 0.0, 1.0)}
    del env.conns[0]
    env.live.orphan(c)
    assert set(env.live.orphans) == {(EID, 1), (OTHER, 1)} and not c.running
    assert env.released == ["x", "x"], "their task-type slots are free again"
    env.clock.advance(0.5)
    env.live.check(env.clock.monotonic())
    assert env.lost == []
    env.live.orphans.pop((EID, 1))  # what an accepted re-attach does
    env.clock.advance(0.6)
    env.live.check(env.clock.monotonic())
    assert env.lost == [[(OTHER, 1)]] and not env.live.orphans and env.live.attempts_lost == 1


def test_a_heartbeat_reattaches_owned_in_flight_attempts_only() -> None:
    env = Env({EID: in_flight()})
    env.live.orphans[(EID, 1)] = env.clock.monotonic() + 1.0
    c = env.conn("w2")
    running = [wpb.RunningAttempt(execution_id=EID, attempt=1),
               wpb.RunningAttempt(execution_id=EID, attempt=0),  # not the current attempt: not answered
               wpb.RunningAttempt(execution_id="notmine@2026-01-01T00:00:00.000Z", attempt=1)]  # other partition
    env.live.adopt(c, running)
    msg = c.out.get_nowait()
    assert msg is not None and [(r.execution_id, r.attempt) for r in msg.reattached.accepted] == [(EID, 1)]
    assert not msg.reattached.rejected and (EID, 1) in c.running and not env.live.orphans
    env.live.adopt(c, running)
    assert c.out.empty(), "an attempt already tracked on the stream is not answered again"
    env.clock.advance(5)
    env.live.check(env.clock.monotonic() - 4.5)
    assert env.lost == []


def test_a_result_records_the_worker_that_ran_it() -> None:
    e = in_flight()
    assert e.current is not None and e.current.worker == ""
    done, _ = result(e, 1, succeeded=True, error_class=None, message="", now_ms=5, worker="w7")
    assert done.current is not None and done.current.worker == "w7"
    timed, _ = result(e, 1, succeeded=False, error_class=ErrorClass.TIMEOUT, message="lost", now_ms=5)
    assert timed.attempts[0].worker == "", "a planner-side timeout knows no worker: left as dispatched"


def test_an_attempt_another_stream_already_reattached_is_not_orphaned() -> None:
    env = Env()
    old, new = env.conn(), env.conn()
    old.running = {(EID, 1): Held("x", 0.0, 1.0)}
    new.running = {(EID, 1): Held("x", 0.0, 1.0)}  # the worker's new stream re-attached it before the old one ended
    del env.conns[0]
    env.live.orphan(old)
    assert not env.live.orphans


def test_heartbeats_keep_the_stream_to_what_its_worker_holds() -> None:
    env = Env()
    c = env.conn()
    fresh, ran = (EID, 1), (OTHER, 1)
    env.live.hold(c, fresh, "x", start_window=0.6)  # grace: start window + heartbeat timeout = 1.6 s
    env.live.hold(c, ran, "x", start_window=0.6)
    env.live.heartbeat(c, [wpb.RunningAttempt(execution_id=OTHER, attempt=1)])
    assert set(c.running) == {fresh, ran} and c.reported == 1
    env.clock.advance(1.0)
    env.live.started(c, fresh)  # its start recorded through this stream, late: its grace counts from now
    env.live.heartbeat(c, [])  # `ran` ended; its result went to another planner
    assert set(c.running) == {fresh, ran} and c.reported == 0, "a heartbeat timeout for its result to come"
    env.clock.advance(1.1)
    env.live.heartbeat(c, [])
    assert set(c.running) == {fresh} and env.released == ["x"]
    env.clock.advance(0.6)
    env.live.heartbeat(c, [])
    assert not c.running and env.released == ["x", "x"], "never listed: the worker does not hold it"
    env.live.forget(c, [fresh])
    assert env.released == ["x", "x"], "let go once: its task-type slot is freed once"


def test_a_reattach_whose_record_cannot_be_read_is_neither_accepted_nor_rejected() -> None:
    """The game day's two-at-once runs: a planner whose etcd link was down answered a worker's Hello with
    "unknown execution" for attempts the ledger still had in flight, the worker stopped them mid-effect,
    and the owner retried them. A read that fails decides nothing."""
    from scheduler.store.etcd import Unavailable

    gone = "gone@2026-01-01T00:00:02.000Z"
    unreadable = "flaky@2026-01-01T00:00:03.000Z"

    class Ledger:
        async def get(self, kv: object, schedule_id: str, planned_ms: int, **_: object) -> Execution | None:
            if schedule_id == "flaky":
                raise Unavailable("etcd unreachable")
            return in_flight() if schedule_id == "s1" else None

    env = Env()
    env.live.ledger = cast(Any, Ledger())
    c = env.conn()
    msg = asyncio.run(env.live.reattach(c, [wpb.RunningAttempt(execution_id=i, attempt=1)
                                            for i in (EID, gone, unreadable)]))
    assert [r.execution_id for r in msg.reattached.accepted] == [EID]
    assert [(r.execution_id, r.reason) for r in msg.reattached.rejected] == [(gone, "unknown execution")]
    assert (EID, 1) in c.running and (unreadable, 1) not in c.running


# ---- a dead worker's attempt, given up when its worker, heartbeating, no longer holds it -------------------


def end(env: Env, c: Conn) -> None:
    """The stream ends: out of `conns`, then orphaned (as Dispatcher.Connect's finally does)."""
    del env.conns[next(k for k, v in env.conns.items() if v is c)]
    env.live.orphan(c)


def running_on(worker: str, eid: str = EID) -> Execution:
    return started(replace(in_flight(), id=eid), 1, now_ms=1, worker=worker)


def hb(env: Env, c: Conn, running: tuple[AttemptKey, ...] = (), unacked: tuple[AttemptKey, ...] | None = (),
       echo: int | None = None) -> None:
    """A heartbeat from `c`'s worker; `echo`: the probe it echoes (default: the latest the planner sent)."""
    env.live.heartbeat(c, [wpb.RunningAttempt(execution_id=k[0], attempt=k[1]) for k in running],
                       None if unacked is None else [wpb.AttemptRef(execution_id=k[0], attempt=k[1]) for k in unacked],
                       c.probe_seq if echo is None else echo)


def probes(c: Conn) -> list[int]:
    out = []
    while not c.out.empty():
        m = c.out.get_nowait()
        if m is not None and m.WhichOneof("body") == "probe":
            out.append(m.probe.seq)
    return out


def test_unheld_takes_only_started_attempts_of_that_worker_past_the_start_window() -> None:
    e = running_on("w1")
    look = {EID: e}.get
    key = (EID, 1)
    assert unheld([key], "w1", set(), look, {key: 0.0}, 0.5, 0.5) == [key]
    assert unheld([key], "w1", {key}, look, {key: 0.0}, 0.5, 0.5) == [], "listed (running or unacked)"
    assert unheld([key], "w2", set(), look, {key: 0.0}, 0.5, 0.5) == [], "another worker's attempt"
    assert unheld([key], "w1", set(), look, {key: 0.0}, 0.45, 0.5) == [], "its start may not be settled yet"
    assert unheld([(EID, 2)], "w1", set(), look, {(EID, 2): 0.0}, 1.0, 0.5) == [], "another attempt"
    assert unheld([key], "w1", set(), {EID: in_flight()}.get, {key: 0.0}, 1.0, 0.5) == [], \
        "DISPATCHED: the worker may hold it pending, unlisted"


async def test_a_restarted_worker_heartbeating_without_it_frees_an_expected_attempt_early() -> None:
    """The new owner takes up a dead worker's attempt at its claim (`expect`). The worker, restarted under the
    same id, heartbeats here without it: once the start window has passed the planner sends a probe, and the
    heartbeat echoing it frees the attempt, instead of the heartbeat timeout after the claim, which restarted
    with every handover (a game day: 23-66 s)."""
    env = Env({EID: running_on("w1")}, start_window=0.2)
    claimed = env.clock.monotonic()
    env.live.expect([(EID, 1)])
    c = env.conn("w1")
    hb(env, c)  # within the start window: no probe, nothing freed
    env.live.check(env.clock.monotonic())
    assert probes(c) == [] and env.lost == []
    env.clock.advance(0.25)
    hb(env, c)  # past the window: a probe goes out; this heartbeat echoes none
    env.live.check(env.clock.monotonic())
    assert probes(c) == [1] and env.lost == []
    env.clock.advance(0.1)
    hb(env, c, echo=1)
    env.live.check(env.clock.monotonic())
    assert env.lost == [[(EID, 1)]] and env.live.attempts_unheld == 1
    assert env.clock.monotonic() - claimed < 1.0, "well before the heartbeat timeout (1 s) after the claim"


async def test_a_heartbeat_echoing_a_probe_sent_before_the_window_frees_nothing() -> None:
    """The latency guard: a heartbeat built before the worker had settled the start (the echo of a probe sent
    within the window, or no echo) frees nothing, however late it arrives. Fails if the anchor is the
    heartbeat's arrival instead of its probe's send time."""
    env = Env({EID: running_on("w1"), OTHER: running_on("w1", OTHER)}, start_window=0.2)
    env.live.expect([(OTHER, 1)])
    env.clock.advance(0.25)
    c = env.conn("w1")
    hb(env, c)
    assert probes(c) == [1]  # OTHER passed its window: probe 1 at t = 0.25
    env.live.expect([(EID, 1)])  # taken up at t = 0.25: its window ends at 0.45
    env.clock.advance(0.5)  # arrives late, long past EID's window, echoing probe 1 (sent before it)
    hb(env, c, running=((OTHER, 1),), echo=1)
    env.live.check(env.clock.monotonic())
    assert env.lost == [], "probe 1 was sent before EID's window had passed"
    hb(env, c, running=((OTHER, 1),), echo=0)
    env.live.check(env.clock.monotonic())
    assert env.lost == []


async def test_a_result_awaiting_its_ack_is_never_given_up_early() -> None:
    """The meta-test of the rule: a worker that finished the attempt and still re-sends its result (through a
    planner that has not answered) lists it as unacked; giving it up would time the attempt out and retry it,
    a second effect. Fails if `unacked` is left out of what the worker holds."""
    env = Env({EID: running_on("w1")}, start_window=0.2)
    env.live.expect([(EID, 1)])
    c = env.conn("w1")
    for _ in range(6):
        env.clock.advance(0.1)
        hb(env, c, unacked=((EID, 1),))
        env.live.check(env.clock.monotonic())
    assert env.lost == [] and env.live.attempts_unheld == 0
    env.clock.advance(0.5)  # the heartbeat timeout after the claim still applies, as before
    env.live.check(env.clock.monotonic())
    assert env.lost == [[(EID, 1)]]


async def test_a_worker_that_does_not_list_its_results_never_frees_one_early() -> None:
    """A worker from before `lists_unacked`: its silence about results proves nothing."""
    env = Env({EID: running_on("w1")}, start_window=0.2)
    env.live.expect([(EID, 1)])
    c = env.conn("w1")
    for _ in range(6):
        env.clock.advance(0.1)
        hb(env, c, unacked=None)
        env.live.check(env.clock.monotonic())
    assert env.lost == [] and probes(c) == []


async def test_another_workers_heartbeats_never_free_it() -> None:
    env = Env({EID: running_on("w1")}, start_window=0.2)
    env.live.expect([(EID, 1)])
    other = env.conn("w2")
    for _ in range(6):
        env.clock.advance(0.1)
        hb(env, other)
        env.live.check(env.clock.monotonic())
    assert env.lost == [] and probes(other) == []


async def test_a_second_stream_under_the_same_worker_id_frees_nothing_while_the_first_is_open() -> None:
    """Two streams under one worker id (a restarted worker while its frozen predecessor's stream is still open
    here, or two processes misconfigured with one id): the new one's silence says nothing of what the other
    runs, so nothing is freed early until the old stream is gone. Fails without the guard."""
    env = Env({EID: running_on("w1")}, start_window=0.2)
    env.live.expect([(EID, 1)])
    old = env.conn("w1")
    new = env.conn("w1")
    for _ in range(6):
        env.clock.advance(0.1)
        old.last_seen = env.clock.monotonic()
        hb(env, new)
        env.live.check(env.clock.monotonic())
    assert env.lost == [] and env.live.attempts_unheld == 0
    del env.conns[0]  # the old stream ends (its worker declared dead, or its connection closed)
    env.clock.advance(0.1)
    hb(env, new)
    hb(env, new)  # echoes the probe the first one brought
    env.live.check(env.clock.monotonic())
    assert env.lost == [[(EID, 1)]] and env.live.attempts_unheld == 1


async def test_an_expected_attempt_of_a_worker_gone_from_here_is_given_up_from_its_streams_end() -> None:
    """A new owner's wait for an attempt in flight at its claim runs from when its worker's last stream here
    ended, not from the claim, when the worker was connected here and is not now: restarted at every claim, it
    held a killed region's runs 21 s when a rebalance moved their partition 10 s after the failover (the
    region drill). Timeout 1 s + interval 0.1 s. Fails if `expect` always waits from the claim."""
    env = Env({EID: running_on("w1"), OTHER: running_on("w2", OTHER)})
    # w1's stream here ends at t = 0 (nothing of ours on it: the attempt's origin was another planner)
    end(env, env.conn("w1"))
    env.clock.advance(0.5)
    env.live.expect([(EID, 1), (OTHER, 1)])  # claimed at t = 0.5; w2 was never connected here
    env.clock.advance(0.65)  # t = 1.15: past w1's end + 1.1, not yet the claim + 1.1
    env.live.check(env.clock.monotonic())
    assert env.lost == [[(EID, 1)]]
    env.clock.advance(0.5)
    env.live.check(env.clock.monotonic())
    assert env.lost == [[(EID, 1)], [(OTHER, 1)]], "a worker never seen here: the full wait from the claim"


async def test_an_expected_attempt_of_a_worker_connected_here_waits_from_the_claim() -> None:
    """A worker with an open stream here (it came back, or never left) gets the whole wait from the claim to
    list the attempt, whatever an earlier stream of it did; and a handover long after its stream ended gives
    the attempt up two heartbeat intervals after the claim (a vouch from its old planner may be on its way:
    dispatch/vouch.py), not at once inside `expect`."""
    env = Env({EID: running_on("w1"), OTHER: running_on("w2", OTHER)})
    end(env, env.conn("w1"))
    env.conn("w1")  # w1 is back
    end(env, env.conn("w2"))
    env.clock.advance(5.0)
    env.live.expect([(EID, 1), (OTHER, 1)])
    assert env.lost == [], "given up by the watchdog, not inside expect"
    env.live.check(env.clock.monotonic())
    assert env.lost == [], "w2's stream ended 5 s ago, yet a vouch may be on its way"
    env.clock.advance(0.2)
    env.live.check(env.clock.monotonic())
    assert env.lost == [[(OTHER, 1)]], "two intervals after the claim"
    env.clock.advance(0.8)
    env.live.check(env.clock.monotonic())
    assert env.lost == [[(OTHER, 1)]]
    env.clock.advance(0.2)
    env.live.check(env.clock.monotonic())
    assert env.lost == [[(OTHER, 1)], [(EID, 1)]]


async def test_a_stream_declared_dead_but_not_yet_ended_is_not_an_old_end() -> None:
    """The watchdog declares a stream dead (this node was frozen past the heartbeat timeout: every stream looked
    silent) and its end is handled a moment later; a claim in between must not read the worker's end from an
    earlier stream of it, long ago. The game day (session 33, seed 2, start ahead) gave up an armed run 0.46 s
    after the claim that way, re-dispatched it, and both attempts ran: the worker was alive, its stream to the
    dispatching planner up, and it reconnected here 0.9 s later. Fails if `expect` counts only live streams."""
    env = Env({EID: running_on("w1")})
    end(env, env.conn("w1"))  # an earlier stream of w1 here ended at t = 0
    env.clock.advance(60.0)
    c = env.conn("w1")  # it came back; then this node froze
    env.clock.advance(5.0)
    env.live.check(env.clock.monotonic())  # every stream silent for 5 s: declared dead, ending
    assert c.dead and any(x is c for x in env.conns.values())
    env.live.expect([(EID, 1)])  # the claim, before the stream's end is handled
    env.live.check(env.clock.monotonic())
    assert env.lost == [], "given up at once, as if w1 had been gone since its stream ended a minute ago"
    end(env, c)
    env.clock.advance(1.2)
    env.live.check(env.clock.monotonic())
    assert env.lost == [[(EID, 1)]], "not re-attached within the wait from the claim: given up"


async def test_a_node_that_saw_the_start_at_an_earlier_claim_counts_the_window_from_then() -> None:
    """A partition lost and claimed again by this node: the worker had received the attempt before this node
    first read its start, so the window is not counted again from the second claim. The probe goes out within
    the claim (the worker answers at once) and the echo frees the attempt there and then, not at the next
    watchdog tick. A game day's run waited 19.5 s through four handovers of its partition after a quorum loss,
    the window and a watchdog tick at each. Fails if `expect` restarts the window."""
    look = {EID: running_on("w1")}
    env = Env(look, start_window=0.5)
    c = env.conn("w1")
    env.live.expect([(EID, 1)])  # first claim at t = 0, RUNNING
    env.clock.advance(1.2)
    env.live.heard(c)
    env.live.check(env.clock.monotonic())  # timed out with the heartbeat timeout (the partition was lost)
    assert env.lost == [[(EID, 1)]]
    probes(c)
    env.live.expect([(EID, 1)])  # claimed again at t = 1.2: the window from t = 0 has passed
    await asyncio.sleep(0)  # (the probes of a turn's claims go out together)
    assert probes(c) == [1], "probed at once"
    hb(env, c, echo=1)
    assert env.lost == [[(EID, 1)], [(EID, 1)]] and env.live.attempts_unheld == 1, "freed on the echo"


async def test_a_dispatch_seen_before_its_start_was_recorded_is_no_anchor() -> None:
    """A first sighting of the attempt DISPATCHED (its assignment maybe still in transit) says nothing of when
    the worker received it: a later claim that reads it RUNNING counts the window from its own read."""
    look = {EID: in_flight()}
    env = Env(look, start_window=0.5)
    c = env.conn("w1")
    env.live.expect([(EID, 1)])
    env.clock.advance(1.2)
    env.live.heard(c)
    env.live.check(env.clock.monotonic())
    look[EID] = running_on("w1")
    env.live.expect([(EID, 1)])
    await asyncio.sleep(0)
    assert probes(c) == []
    hb(env, c, echo=0)
    assert env.lost == [[(EID, 1)]], "only the first claim's timeout"
    env.clock.advance(0.55)
    hb(env, c)  # past the window from the second claim: probe
    assert probes(c) == [1]
    hb(env, c, echo=1)
    assert env.lost == [[(EID, 1)], [(EID, 1)]]
