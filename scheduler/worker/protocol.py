"""Worker-stream messages <-> the SDK's objects. The only worker module that builds or reads
protobuf fields (STYLE: convert at the edge)."""

from __future__ import annotations

from collections.abc import Iterable

from scheduler._gen.scheduler.v1 import execution_pb2 as epb
from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.clock import Clock
from scheduler.ids import FencingToken
from scheduler.outqueue import JoiningQueue
from scheduler.timeconv import ms_to_duration, ms_to_timestamp
from scheduler.timeplan.plan import from_ms
from scheduler.worker.attempt import Attempt, ErrorClass, Outcome, Status
from scheduler.worker.context import ExecutionContext

_STATUS = {
    Status.SUCCEEDED: epb.ATTEMPT_OUTCOME_SUCCEEDED,
    Status.FAILED: epb.ATTEMPT_OUTCOME_FAILED,
    Status.CANCELLED: epb.ATTEMPT_OUTCOME_CANCELLED,
}
_ERROR_CLASS = {
    ErrorClass.NONE: epb.ERROR_CLASS_UNSPECIFIED,
    ErrorClass.TRANSIENT: epb.ERROR_CLASS_TRANSIENT,
    ErrorClass.PERMANENT: epb.ERROR_CLASS_PERMANENT,
    ErrorClass.UNKNOWN: epb.ERROR_CLASS_UNKNOWN,
    ErrorClass.TIMEOUT: epb.ERROR_CLASS_TIMEOUT,
}

# What this SDK does beyond the first protocol (Hello.capabilities): it confirms starts and honours start_in
# and Disarm. A planner refuses a stream without the first and arms no run on one without the second.
CAPABILITIES = (wpb.WORKER_CAPABILITY_START_CONFIRMATION, wpb.WORKER_CAPABILITY_START_IN)


def _token_pb(t: FencingToken) -> epb.FencingToken:
    return epb.FencingToken(partition=t.partition, revision=t.revision)


def trigger_name(value: int) -> str:
    try:
        return str(epb.Trigger.Name(value)).removeprefix("TRIGGER_").lower()
    except ValueError:  # an enum value newer than this SDK
        return f"trigger_{value}"


def context_from_assignment(a: wpb.Assignment, worker_id: str, clock: Clock) -> tuple[ExecutionContext, float | None]:
    """The handler's context, and the execution timeout in seconds (None: no limit).

    The limit is the assignment's `timeout` counted on the worker's monotonic clock from receipt;
    an older planner that sends only `deadline` gets `deadline - worker wall time`, skew and all.
    """
    timeout: float | None = None
    if a.HasField("timeout") and (a.timeout.seconds or a.timeout.nanos):
        timeout = a.timeout.ToMilliseconds() / 1000
    elif a.HasField("deadline"):
        timeout = max(0.0, (a.deadline.ToMilliseconds() - clock.wall_ms()) / 1000)
    ahead = start_in_of(a)
    ctx = ExecutionContext(
        execution_id=a.execution_id,
        schedule_id=a.schedule_id,
        tenant=a.tenant,
        task_type=a.task_type,
        attempt=a.attempt,
        fencing_token=FencingToken(a.fencing_token.partition, a.fencing_token.revision),
        planned_at=from_ms(a.planned_at.ToMilliseconds()),
        deadline=from_ms(a.deadline.ToMilliseconds()) if a.HasField("deadline") else None,
        trigger=trigger_name(a.trigger),
        worker_id=worker_id,
        clock=clock,
        # Counted from the start-at instant for a run handed out ahead of its time.
        local_deadline=None if timeout is None else clock.monotonic() + ahead + timeout,
    )
    return ctx, timeout


def start_in_of(a: wpb.Assignment) -> float:
    """Seconds from receipt until the handler may run (start ahead); 0: at once."""
    if a.HasField("start_in") and (a.start_in.seconds or a.start_in.nanos):
        return max(0.0, a.start_in.ToMilliseconds() / 1000)
    return 0.0


def start_timeout_of(a: wpb.Assignment) -> float | None:
    """Seconds to wait for the start acknowledgement; None: a planner that does not confirm starts."""
    if a.HasField("start_timeout") and (a.start_timeout.seconds or a.start_timeout.nanos):
        return float(a.start_timeout.ToMilliseconds()) / 1000
    return None


def result_pb(attempt: Attempt, outcome: Outcome, finished_ms: int) -> wpb.Result:
    ctx = attempt.ctx
    r = wpb.Result(
        execution_id=ctx.execution_id,
        attempt=ctx.attempt,
        fencing_token=_token_pb(ctx.fencing_token),
        outcome=_STATUS[outcome.status],
        error_class=_ERROR_CLASS[outcome.error_class],
        message=outcome.message,
        started_at=ms_to_timestamp(attempt.started_ms if attempt.started_ms is not None else finished_ms),
        finished_at=ms_to_timestamp(finished_ms),
        not_started=outcome.not_started,
    )
    out = ctx.output
    if out is not None:
        r.stdout_tail, r.stderr_tail = out.stdout_tail, out.stderr_tail
        if out.exit_code is not None:
            r.exit_code = out.exit_code
    if outcome.retry_after is not None:
        r.retry_after.CopyFrom(ms_to_duration(max(0, round(outcome.retry_after * 1000))))
    return r


def running_pb(attempts: Iterable[Attempt], origin: str = "") -> list[wpb.RunningAttempt]:
    """`origin`: the address of the stream this list goes to; its attempts say so (`RunningAttempt.origin`)."""
    return [
        wpb.RunningAttempt(
            execution_id=a.ctx.execution_id,
            attempt=a.ctx.attempt,
            fencing_token=_token_pb(a.ctx.fencing_token),
            # An armed attempt (start confirmed, waiting for its instant): when it began to wait.
            started_at=ms_to_timestamp(a.started_ms if a.started_ms is not None else a.armed_ms or 0),
            origin=bool(origin) and a.origin == origin,
        )
        for a in attempts
        if a.started_ms is not None or a.armed_ms is not None
    ]


def attempt_refs(attempts: Iterable[Attempt]) -> list[wpb.AttemptRef]:
    return [wpb.AttemptRef(execution_id=a.ctx.execution_id, attempt=a.ctx.attempt) for a in attempts]


def drain_message(reason: str, grace: float, returned: Iterable[Attempt]) -> wpb.WorkerMessage:
    return wpb.WorkerMessage(drain=wpb.Drain(reason=reason, grace=ms_to_duration(round(grace * 1000)),
                                             returned=attempt_refs(returned)))


def heartbeat_message(running: Iterable[Attempt], unacked: Iterable[tuple[str, int]],
                      now_ms: int, *, origin: str = "") -> wpb.WorkerMessage:
    """`unacked`: the results no planner has acknowledged yet (the outbox). With `running`, every attempt the
    worker still holds: a planner may give up an attempt of this worker that is in neither."""
    return wpb.WorkerMessage(heartbeat=wpb.Heartbeat(
        running=running_pb(running, origin), worker_time=ms_to_timestamp(now_ms), lists_unacked=True,
        unacked=[wpb.AttemptRef(execution_id=eid, attempt=n) for eid, n in unacked]))


def credits_message(n: int) -> wpb.WorkerMessage:
    return wpb.WorkerMessage(credits=wpb.Credits(credits=n))


def results_message(results: list[wpb.Result]) -> wpb.WorkerMessage:
    return wpb.WorkerMessage(results=wpb.Results(results=results))


def _size(m: wpb.WorkerMessage) -> int:
    kind = m.WhichOneof("body")
    if kind == "results":
        # The message and a process's output tails (4 KiB each) are what make a result large.
        return sum(len(r.message) + len(r.stdout_tail) + len(r.stderr_tail) + 256 for r in m.results.results)
    if kind == "started":
        return 128 * len(m.started.starts)
    return 0  # not joined (credits: a number)


def _join(last: wpb.WorkerMessage, new: wpb.WorkerMessage) -> bool:
    """Start requests, results and credit grants queued one right behind another go as one message (the
    planner handles a message's entries in order, as it would the messages; credits add up)."""
    kind = new.WhichOneof("body")
    if kind != last.WhichOneof("body"):
        return False
    if kind == "started":
        last.started.starts.extend(new.started.starts)
    elif kind == "results":
        last.results.results.extend(new.results.results)
    elif kind == "credits":
        last.credits.credits += new.credits.credits
    else:
        return False
    return True


def outgoing() -> JoiningQueue[wpb.WorkerMessage]:
    """A stream's queue of messages to its planner (None ends the request stream)."""
    return JoiningQueue(_join, _size)
