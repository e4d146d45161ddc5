"""Protobuf <-> domain objects. The only place that knows both shapes (STYLE: convert at the edge).

Unset optional fields take the defaults of the dataclasses in scheduler.model, so a client that
sends only id, tenant, spec, pool and task type gets a fully specified schedule back.
"""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from scheduler._gen.scheduler.v1 import execution_pb2 as epb
from scheduler._gen.scheduler.v1 import schedule_pb2 as pb
from scheduler.errors import InvalidArgument
from scheduler.execution import Attempt, ErrorClass, ExecState, Execution, Trigger
from scheduler.ids import FencingToken
from scheduler.model import Policies, RetryPolicy, Schedule, ScheduleState

# `as` marks an explicit re-export: dispatch/service.py still imports these two from here. It should import
# scheduler.timeconv itself (it is being reworked concurrently); then plain imports will do again.
from scheduler.timeconv import ms_to_duration as ms_to_duration
from scheduler.timeconv import ms_to_timestamp as ms_to_timestamp
from scheduler.timeplan import DstGap, DstOverlap, MissedRuns, Overlap

_STATE = {ScheduleState.ACTIVE: pb.SCHEDULE_STATE_ACTIVE, ScheduleState.PAUSED: pb.SCHEDULE_STATE_PAUSED}
_MISSED = {
    MissedRuns.SKIP: pb.MISSED_RUN_POLICY_SKIP,
    MissedRuns.LATEST: pb.MISSED_RUN_POLICY_LATEST,
    MissedRuns.ALL: pb.MISSED_RUN_POLICY_ALL,
}
_OVERLAP = {
    Overlap.SKIP: pb.OVERLAP_POLICY_SKIP,
    Overlap.BUFFER_ONE: pb.OVERLAP_POLICY_BUFFER_ONE,
    Overlap.BUFFER_ALL: pb.OVERLAP_POLICY_BUFFER_ALL,
    Overlap.CANCEL_OTHER: pb.OVERLAP_POLICY_CANCEL_OTHER,
    Overlap.ALLOW_ALL: pb.OVERLAP_POLICY_ALLOW_ALL,
}
_GAP = {DstGap.SHIFT: pb.DST_GAP_POLICY_SHIFT, DstGap.SKIP: pb.DST_GAP_POLICY_SKIP}
_DST_OVERLAP = {
    DstOverlap.FIRST: pb.DST_OVERLAP_POLICY_FIRST,
    DstOverlap.LAST: pb.DST_OVERLAP_POLICY_LAST,
    DstOverlap.BOTH: pb.DST_OVERLAP_POLICY_BOTH,
}


def _inverse(field: str, table: dict[object, int], value: int, default: object) -> object:
    if value == 0:
        return default
    for k, v in table.items():
        if v == value:
            return k
    raise InvalidArgument(field, f"unknown enum value {value}")


# google.protobuf's own bounds: Timestamp 0001-01-01..9999-12-31, Duration +-10,000 years. Values
# outside them make ToMilliseconds() raise ValueError, so they are refused here, naming the field.
_TS_MIN_S, _TS_MAX_S = -62_135_596_800, 253_402_300_799
_DURATION_MAX_S = 315_576_000_000


def duration_ms(field: str, d: Duration, present: bool, default: int) -> int:
    if not present:
        return default
    if d.seconds < 0 or d.nanos < 0:
        raise InvalidArgument(field, "must not be negative")
    if d.seconds > _DURATION_MAX_S or d.nanos > 999_999_999:
        raise InvalidArgument(field, "is outside the range of google.protobuf.Duration")
    return int(d.ToMilliseconds())


def timestamp_ms(field: str, t: Timestamp, *, ceil: bool = False) -> int:
    """Epoch ms of `t`, truncated (`ceil`: rounded up when it has a sub-millisecond part)."""
    if not _TS_MIN_S <= t.seconds <= _TS_MAX_S or not 0 <= t.nanos <= 999_999_999:
        raise InvalidArgument(field, "is outside the range of google.protobuf.Timestamp (0001-01-01..9999-12-31)")
    return int(t.ToMilliseconds()) + (1 if ceil and t.nanos % 1_000_000 else 0)


def schedule_to_pb(s: Schedule) -> pb.Schedule:
    p, r = s.policies, s.policies.retry
    out = pb.Schedule(
        id=s.id,
        tenant=s.tenant,
        spec=s.spec,
        time_zone=s.time_zone,
        worker_pool=s.worker_pool,
        task_type=s.task_type,
        payload=s.payload,
        labels=s.labels,
        state=_STATE[s.state],
        paused_reason=s.paused_reason,
        version=s.version,
        policies=pb.SchedulePolicies(
            missed_runs=pb.MissedRunPolicySettings(
                policy=_MISSED[p.missed_runs],
                catchup_window=ms_to_duration(p.catchup_window_ms),
                catchup_cap=p.catchup_cap,
            ),
            overlap=_OVERLAP[p.overlap],
            dst_gap=_GAP[p.dst_gap] if p.dst_gap else pb.DST_GAP_POLICY_UNSPECIFIED,
            dst_overlap=_DST_OVERLAP[p.dst_overlap] if p.dst_overlap else pb.DST_OVERLAP_POLICY_UNSPECIFIED,
            jitter=ms_to_duration(p.jitter_ms),
            retry=pb.RetryPolicy(
                max_attempts=r.max_attempts,
                initial_backoff=ms_to_duration(r.initial_backoff_ms),
                max_backoff=ms_to_duration(r.max_backoff_ms),
                backoff_multiplier=r.multiplier,
                max_unknown_attempts=r.max_unknown_attempts,
            ),
            execution_timeout=ms_to_duration(p.execution_timeout_ms),
        ),
    )
    if s.start_ms is not None:
        out.start_at.CopyFrom(ms_to_timestamp(s.start_ms))
    if s.end_ms is not None:
        out.end_at.CopyFrom(ms_to_timestamp(s.end_ms))
    return out


def schedule_from_pb(m: pb.Schedule) -> Schedule:
    """Domain schedule from a request; field paths in errors match the proto (`policies.jitter`)."""
    dp, dr = Policies(), RetryPolicy()
    pp, mr, rp = m.policies, m.policies.missed_runs, m.policies.retry
    max_attempts = rp.max_attempts if rp.HasField("max_attempts") else dr.max_attempts
    retry = RetryPolicy(
        max_attempts=max_attempts,
        initial_backoff_ms=duration_ms("policies.retry.initial_backoff", rp.initial_backoff,
                                       rp.HasField("initial_backoff"), dr.initial_backoff_ms),
        max_backoff_ms=duration_ms("policies.retry.max_backoff", rp.max_backoff, rp.HasField("max_backoff"),
                                   dr.max_backoff_ms),
        multiplier=rp.backoff_multiplier if rp.HasField("backoff_multiplier") else dr.multiplier,
        # Unset: the default, but never more than max_attempts (an outside audit: `max_attempts = 1`, "never
        # retry", was refused for a default of 2 unknown attempts the caller had not set).
        max_unknown_attempts=(rp.max_unknown_attempts if rp.HasField("max_unknown_attempts")
                              else max(1, min(dr.max_unknown_attempts, max_attempts))),
    )
    policies = Policies(
        missed_runs=_inverse("policies.missed_runs.policy", _MISSED, mr.policy, dp.missed_runs),  # type: ignore[arg-type]
        catchup_window_ms=duration_ms("policies.missed_runs.catchup_window", mr.catchup_window,
                                      mr.HasField("catchup_window"), dp.catchup_window_ms),
        catchup_cap=mr.catchup_cap if mr.HasField("catchup_cap") else dp.catchup_cap,
        overlap=_inverse("policies.overlap", _OVERLAP, pp.overlap, dp.overlap),  # type: ignore[arg-type]
        dst_gap=_inverse("policies.dst_gap", _GAP, pp.dst_gap, None),  # type: ignore[arg-type]
        dst_overlap=_inverse("policies.dst_overlap", _DST_OVERLAP, pp.dst_overlap, None),  # type: ignore[arg-type]
        jitter_ms=duration_ms("policies.jitter", pp.jitter, pp.HasField("jitter"), dp.jitter_ms),
        retry=retry,
        execution_timeout_ms=duration_ms("policies.execution_timeout", pp.execution_timeout,
                                         pp.HasField("execution_timeout"), dp.execution_timeout_ms),
    )
    return Schedule(
        id=m.id,
        tenant=m.tenant,
        spec=m.spec,
        worker_pool=m.worker_pool,
        task_type=m.task_type,
        time_zone=m.time_zone or "UTC",
        payload=m.payload,
        labels=dict(m.labels),
        state=_inverse("state", _STATE, m.state, ScheduleState.ACTIVE),  # type: ignore[arg-type]
        # A bound, not a planned time: a sub-millisecond start is rounded up (the same planned times, all whole
        # milliseconds, are at or after it); truncated, a run at the millisecond before it was planned (an audit).
        start_ms=timestamp_ms("start_at", m.start_at, ceil=True) if m.HasField("start_at") else None,
        end_ms=timestamp_ms("end_at", m.end_at) if m.HasField("end_at") else None,
        policies=policies,
        version=m.version,
        paused_reason=m.paused_reason,
    )


# ---- executions, dead letters, backfill progress -------------------------------------------------

_EXEC_STATE = {
    ExecState.SCHEDULED: epb.EXECUTION_STATE_SCHEDULED,
    ExecState.DISPATCHED: epb.EXECUTION_STATE_DISPATCHED,
    ExecState.RUNNING: epb.EXECUTION_STATE_RUNNING,
    ExecState.SUCCEEDED: epb.EXECUTION_STATE_SUCCEEDED,
    ExecState.FAILED: epb.EXECUTION_STATE_FAILED,
    ExecState.RETRY_WAIT: epb.EXECUTION_STATE_RETRY_WAIT,
    ExecState.DEAD_LETTER: epb.EXECUTION_STATE_DEAD_LETTER,
    ExecState.SKIPPED: epb.EXECUTION_STATE_SKIPPED,
    ExecState.CANCELLED: epb.EXECUTION_STATE_CANCELLED,
    ExecState.CANCELLING: epb.EXECUTION_STATE_CANCELLING,
}
_TRIGGER = {
    Trigger.SCHEDULED: epb.TRIGGER_SCHEDULED,
    Trigger.MANUAL: epb.TRIGGER_MANUAL,
    Trigger.RERUN: epb.TRIGGER_RERUN,
    Trigger.BACKFILL: epb.TRIGGER_BACKFILL,
    Trigger.REPLAY: epb.TRIGGER_REPLAY,
}
_ERROR_CLASS = {
    ErrorClass.TRANSIENT: epb.ERROR_CLASS_TRANSIENT,
    ErrorClass.PERMANENT: epb.ERROR_CLASS_PERMANENT,
    ErrorClass.UNKNOWN: epb.ERROR_CLASS_UNKNOWN,
    ErrorClass.TIMEOUT: epb.ERROR_CLASS_TIMEOUT,
}
# Stored skip reasons (SkipReason values, plus the planner's withdrawal reasons) -> the enum.
_SKIP = {
    "policy_skip": epb.SKIP_REASON_POLICY_SKIP,
    "outside_catchup_window": epb.SKIP_REASON_OUTSIDE_CATCHUP_WINDOW,
    "over_cap": epb.SKIP_REASON_OVER_CAP,
    "overlap_skip": epb.SKIP_REASON_OVERLAP_SKIP,
    "superseded": epb.SKIP_REASON_SUPERSEDED,
    "paused": epb.SKIP_REASON_PAUSED,
    "schedule_changed": epb.SKIP_REASON_SCHEDULE_CHANGED,
    "schedule_deleted": epb.SKIP_REASON_SCHEDULE_DELETED,
}


def skip_reason_pb(reason: str) -> epb.SkipReason:
    """A stored skip reason (a SkipReason value) as the enum; UNSPECIFIED for one this build does not know."""
    return _SKIP.get(reason, epb.SKIP_REASON_UNSPECIFIED)


def execution_state_from_pb(field: str, value: int) -> ExecState:
    for k, v in _EXEC_STATE.items():
        if v == value:
            return k
    raise InvalidArgument(field, f"unknown execution state {value}")


def overlap_from_pb(field: str, value: int) -> Overlap | None:
    """A per-request overlap override: UNSPECIFIED means the schedule's own policy (None)."""
    return _inverse(field, _OVERLAP, value, None)  # type: ignore[arg-type, return-value]


def fencing_token_pb(t: FencingToken) -> epb.FencingToken:
    return epb.FencingToken(partition=t.partition, revision=t.revision)


def fencing_token_from_pb(m: epb.FencingToken) -> FencingToken:
    """A token as a worker sends it back (start requests, results): compared with the attempt's, never trusted."""
    return FencingToken(m.partition, m.revision)


def _attempt_to_pb(a: Attempt, trigger: int) -> epb.AttemptRecord:
    """`trigger`: the execution's own; an attempt of a run an operator started again (rerun, replay)
    records that run's trigger instead."""
    run = _TRIGGER[a.trigger] if a.trigger is not None else trigger
    out = epb.AttemptRecord(attempt=a.attempt, worker_id=a.worker, planner_id=a.planner,
                            error_message=a.message, trigger=run)  # type: ignore[arg-type]
    if a.dispatched_ms:  # 0: a reserved attempt retired without being handed out (never dispatched)
        out.dispatched_at.CopyFrom(ms_to_timestamp(a.dispatched_ms))
    if a.deadline_ms:
        out.deadline.CopyFrom(ms_to_timestamp(a.deadline_ms))
    out.fencing_token.CopyFrom(fencing_token_pb(a.token))
    if a.started_ms:
        out.started_at.CopyFrom(ms_to_timestamp(a.started_ms))
    if a.finished_ms:
        out.finished_at.CopyFrom(ms_to_timestamp(a.finished_ms))
        if a.succeeded:
            out.outcome = epb.ATTEMPT_OUTCOME_SUCCEEDED
        elif a.error_class is ErrorClass.TIMEOUT:
            out.outcome = epb.ATTEMPT_OUTCOME_TIMED_OUT
        elif a.error_class is None:  # a failure always has a class: this one was stopped by a Cancel
            out.outcome = epb.ATTEMPT_OUTCOME_CANCELLED
        else:
            out.outcome = epb.ATTEMPT_OUTCOME_FAILED
    if a.error_class is not None:
        out.error_class = _ERROR_CLASS[a.error_class]
    if a.start_by_ms:
        out.start_by.CopyFrom(ms_to_timestamp(a.start_by_ms))
    if a.stop_requested_ms:
        out.stop_requested_at.CopyFrom(ms_to_timestamp(a.stop_requested_ms))
    out.never_started = a.never_started
    out.stdout_tail, out.stderr_tail = a.stdout_tail, a.stderr_tail
    if a.exit_code is not None:
        out.exit_code = a.exit_code
    return out


def execution_to_pb(e: Execution) -> epb.Execution:
    trigger = _TRIGGER[e.trigger]
    out = epb.Execution(
        execution_id=e.id, schedule_id=e.schedule_id, tenant=e.tenant, planned_at=ms_to_timestamp(e.planned_ms),
        due_at=ms_to_timestamp(e.due_ms), trigger=trigger, state=_EXEC_STATE[e.state],
        attempt=e.attempt, attempts=[_attempt_to_pb(a, trigger) for a in e.attempts], task_type=e.task_type,
        worker_pool=e.pool,
    )
    if e.state is ExecState.SKIPPED:
        out.skip_reason = _SKIP.get(e.skip_reason, epb.SKIP_REASON_UNSPECIFIED)
    if e.skip_reason:
        out.state_message = e.skip_reason  # the cancel reason, or the stored skip reason
    elif e.state is ExecState.DEAD_LETTER and e.dead_reason:
        out.state_message = e.dead_reason  # as recorded when it was dead-lettered
    if e.next_attempt_ms and e.state is ExecState.RETRY_WAIT:
        out.next_attempt_at.CopyFrom(ms_to_timestamp(e.next_attempt_ms))
    if e.attempts:
        out.fencing_token.CopyFrom(fencing_token_pb(e.attempts[-1].token))
    if e.quota_deferred_ms:
        out.quota_deferred.CopyFrom(ms_to_duration(e.quota_deferred_ms))
    return out


def dead_letter_to_pb(e: Execution, payload: bytes, dead_ms: int, reason: str) -> epb.DeadLetter:
    return epb.DeadLetter(execution=execution_to_pb(e), payload=payload, dead_lettered_at=ms_to_timestamp(dead_ms),
                          reason=reason)
