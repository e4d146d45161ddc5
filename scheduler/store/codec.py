"""JSON encodings of domain objects as stored in etcd (compact keys; version-tolerant decoding).

Stored values outlive processes and versions: decoders take missing fields from the dataclass
defaults, so adding a field never breaks reading old records.
"""

from __future__ import annotations

import base64
import json
import sys
from dataclasses import dataclass, replace
from typing import Any

from scheduler.execution import Attempt, ErrorClass, ExecState, Execution, Trigger
from scheduler.ids import FencingToken
from scheduler.model import Policies, RetryPolicy, Schedule, ScheduleState
from scheduler.timeplan import DstGap, DstOverlap, MissedRuns, Overlap

_SEP = (",", ":")
# One encoder for all records: json.dumps with non-default arguments builds a new encoder per call.
_dumps = json.JSONEncoder(separators=_SEP).encode


def _retry_to(r: RetryPolicy) -> dict[str, Any]:
    return {"n": r.max_attempts, "i": r.initial_backoff_ms, "x": r.max_backoff_ms, "k": r.multiplier,
            "u": r.max_unknown_attempts}


def _retry_from(d: dict[str, Any]) -> RetryPolicy:
    dr = RetryPolicy()
    return RetryPolicy(int(d.get("n", dr.max_attempts)), int(d.get("i", dr.initial_backoff_ms)),
                       int(d.get("x", dr.max_backoff_ms)), float(d.get("k", dr.multiplier)),
                       int(d.get("u", dr.max_unknown_attempts)))


@dataclass(frozen=True, slots=True)
class ScheduleMeta:
    """Bookkeeping the API returns with a schedule (created_at, updated_at) and the create's
    request_id, which makes a retried CreateSchedule return the schedule instead of ALREADY_EXISTS."""

    created_ms: int = 0
    updated_ms: int = 0
    request_id: str = ""
    # The etcd revision of the put that set the current activation (create, resume, pause, spec change);
    # 0: the put that wrote this very value (its mod_revision). A planner compares it with the revision
    # its partition's checkpoint was planned at, to know whether the checkpoint's writer knew this
    # activation (scheduler/store/checkpoint.py).
    activated_rev: int = 0
    # The activations before the current one that a new owner may still have to plan, oldest first, as
    # far as planning goes: {"spec", "tz", "start", "end", "state", "gap", "fold", "activated", "rev"}.
    # A new owner whose checkpoint's writer never saw the current activation handles the planned times
    # from the watermark under the one the writer knew, and each later one from its own instant up to
    # the next (scheduler/planner/activations.py). Pruned at each update to the ones no checkpoint has
    # covered yet (ScheduleStore.update): one entry while the partition has an owner.
    history: tuple[dict[str, Any], ...] = ()

    @property
    def previous(self) -> dict[str, Any] | None:
        """The activation right before the current one."""
        return self.history[-1] if self.history else None


def plan_fields(s: Schedule, activated_ms: int, activation_rev: int) -> dict[str, Any]:
    """The fields of a schedule that its planned times depend on, for ScheduleMeta.history."""
    p = s.policies
    return {"spec": s.spec, "tz": s.time_zone, "start": s.start_ms, "end": s.end_ms, "state": s.state.value,
            "gap": p.dst_gap.value if p.dst_gap else None, "fold": p.dst_overlap.value if p.dst_overlap else None,
            "activated": activated_ms, "rev": activation_rev}


def with_plan_fields(s: Schedule, d: dict[str, Any]) -> Schedule:
    """`s` as it was planned under `d` (plan_fields of an earlier activation)."""
    pol = replace(s.policies, dst_gap=DstGap(d["gap"]) if d.get("gap") else None,
                  dst_overlap=DstOverlap(d["fold"]) if d.get("fold") else None)
    return replace(s, spec=str(d["spec"]), time_zone=str(d.get("tz", "UTC")), start_ms=d.get("start"),
                   end_ms=d.get("end"), state=ScheduleState(d.get("state", "active")), policies=pol)


def encode_schedule(s: Schedule, *, activated_ms: int, meta: ScheduleMeta | None = None) -> bytes:
    """`activated_ms`: when the current spec/state took effect; planned times before it are not owed."""
    p = s.policies
    d: dict[str, Any] = {
        "id": s.id, "tenant": s.tenant, "spec": s.spec, "tz": s.time_zone, "pool": s.worker_pool,
        "task": s.task_type, "payload": base64.b64encode(s.payload).decode(), "labels": s.labels,
        "state": s.state.value, "paused_reason": s.paused_reason, "start": s.start_ms, "end": s.end_ms,
        "activated": activated_ms,
        "pol": {"missed": p.missed_runs.value, "window": p.catchup_window_ms, "cap": p.catchup_cap,
                "overlap": p.overlap.value, "gap": p.dst_gap.value if p.dst_gap else None,
                "fold": p.dst_overlap.value if p.dst_overlap else None, "jitter": p.jitter_ms,
                "retry": _retry_to(p.retry), "timeout": p.execution_timeout_ms},
    }
    if meta is not None:
        d["meta"] = {"c": meta.created_ms, "u": meta.updated_ms, "rid": meta.request_id}
        if meta.activated_rev:
            d["meta"]["ar"] = meta.activated_rev
        if meta.history:
            d["meta"]["pv"] = list(meta.history)
    return json.dumps(d, separators=_SEP).encode()


def decode_schedule_meta(value: bytes) -> ScheduleMeta:
    return _meta_from(json.loads(value))


def decode_stored_schedule(value: bytes, version: int) -> tuple[Schedule, int, ScheduleMeta]:
    """decode_schedule and decode_schedule_meta from one parse: a claim decodes every schedule of its
    partition, and parsing each value twice was a third of that cost."""
    d = json.loads(value)
    s, activated = _schedule_from(d, version)
    return s, activated, _meta_from(d)


def _meta_from(d: dict[str, Any]) -> ScheduleMeta:
    m = d.get("meta") or {}
    pv = m.get("pv")
    # A single dict: written by a version that kept one previous activation.
    history = (pv,) if isinstance(pv, dict) else tuple(pv or ())
    return ScheduleMeta(int(m.get("c", 0)), int(m.get("u", 0)), str(m.get("rid", "")), int(m.get("ar", 0)),
                        history)


def decode_schedule(value: bytes, version: int) -> tuple[Schedule, int]:
    """(schedule with its etag version = the key's mod_revision, activated_ms)."""
    return _schedule_from(json.loads(value), version)


# Decoded policies shared between schedules with the same stored policies (frozen, so sharing is
# invisible): most schedules of a planner carry the defaults, and a Policies + RetryPolicy pair per
# schedule was about 260 B of a claim's ~1.7 KiB per schedule. Bounded: cleared when full.
_POLICIES: dict[tuple[Any, ...], Policies] = {}
_POLICIES_MAX = 4096


def _policies_from(pol: dict[str, Any]) -> Policies:
    try:
        key = tuple((k, tuple(v.items()) if isinstance(v, dict) else v) for k, v in pol.items())
        hit = _POLICIES.get(key)
    except TypeError:  # an unhashable value (not written by this codec): decode it unshared
        key, hit = (), None
    if hit is not None:
        return hit
    dp = Policies()
    policies = Policies(
        missed_runs=MissedRuns(pol.get("missed", dp.missed_runs.value)),
        catchup_window_ms=int(pol.get("window", dp.catchup_window_ms)),
        catchup_cap=int(pol.get("cap", dp.catchup_cap)),
        overlap=Overlap(pol.get("overlap", dp.overlap.value)),
        dst_gap=DstGap(pol["gap"]) if pol.get("gap") else None,
        dst_overlap=DstOverlap(pol["fold"]) if pol.get("fold") else None,
        jitter_ms=int(pol.get("jitter", 0)),
        retry=_retry_from(pol.get("retry", {})),
        execution_timeout_ms=int(pol.get("timeout", dp.execution_timeout_ms)),
    )
    if key:
        if len(_POLICIES) >= _POLICIES_MAX:
            _POLICIES.clear()
        _POLICIES[key] = policies
    return policies


def _schedule_from(d: dict[str, Any], version: int) -> tuple[Schedule, int]:
    # The strings many schedules repeat (tenant, spec, pool, task type, zone) are interned: one copy
    # per distinct value instead of one per schedule.
    s = Schedule(
        id=d["id"], tenant=sys.intern(d["tenant"]), spec=sys.intern(d["spec"]), worker_pool=sys.intern(d["pool"]),
        task_type=sys.intern(d["task"]), time_zone=sys.intern(d.get("tz", "UTC")),
        payload=base64.b64decode(d.get("payload", "")), labels=d.get("labels", {}),
        state=ScheduleState(d.get("state", "active")), start_ms=d.get("start"), end_ms=d.get("end"),
        policies=_policies_from(d.get("pol", {})), version=version, paused_reason=d.get("paused_reason", ""),
    )
    return s, int(d.get("activated", 0))


def _attempt_to(a: Attempt) -> dict[str, Any]:
    d: dict[str, Any] = {"n": a.attempt, "w": a.worker, "p": a.planner, "t": str(a.token), "d": a.dispatched_ms,
                         "dl": a.deadline_ms}
    if a.started_ms:
        d["s"] = a.started_ms
    if a.finished_ms:
        d["f"] = a.finished_ms
        d["ok"] = a.succeeded
    if a.error_class is not None:
        d["ec"] = a.error_class.value
    if a.message:
        d["m"] = a.message
    if a.trigger is not None:
        d["tr"] = a.trigger.value
    # Written only when set: a plain attempt keeps its size (one more field per dispatch: start-by).
    if a.start_by_ms:
        d["sb"] = a.start_by_ms
    if a.never_started:
        d["ns"] = 1
    if a.stdout_tail:
        d["so"] = a.stdout_tail
    if a.stderr_tail:
        d["se"] = a.stderr_tail
    if a.exit_code is not None:
        d["x"] = a.exit_code
    if a.stop_requested_ms:
        d["sr"] = a.stop_requested_ms
    if a.ran_ms:
        d["rn"] = a.ran_ms
    return d


def _attempt_from(d: dict[str, Any]) -> Attempt:
    return Attempt(int(d["n"]), d["w"], d["p"], FencingToken.parse(d["t"]), int(d["d"]), int(d["dl"]),
                   int(d.get("s", 0)), int(d.get("f", 0)), ErrorClass(d["ec"]) if d.get("ec") else None, d.get("m", ""),
                   bool(d.get("ok", False)), Trigger(d["tr"]) if d.get("tr") else None, int(d.get("sb", 0)),
                   bool(d.get("ns", 0)), d.get("so", ""), d.get("se", ""),
                   int(d["x"]) if d.get("x") is not None else None, int(d.get("sr", 0)),
                   int(d.get("rn", 0)))


def _encode_execution_slow(e: Execution) -> bytes:
    """The reference encoding: `encode_execution` must produce exactly these bytes (tested)."""
    d: dict[str, Any] = {
        "id": e.id, "sid": e.schedule_id, "ten": e.tenant, "pool": e.pool, "task": e.task_type,
        "pl": e.planned_ms, "due": e.due_ms, "tr": e.trigger.value, "retry": _retry_to(e.retry),
        "to": e.timeout_ms, "st": e.state.value, "n": e.attempt,
    }
    if e.attempts:
        d["at"] = [_attempt_to(a) for a in e.attempts]
    if e.next_attempt_ms:
        d["next"] = e.next_attempt_ms
    if e.skip_reason:
        d["why"] = e.skip_reason
    # Operator overrides, written only when set: scheduled records keep their size.
    if e.overlap is not None:
        d["ov"] = e.overlap.value
    if e.payload is not None:
        d["pay"] = base64.b64encode(e.payload).decode()
    if e.attempt_base:
        d["base"] = e.attempt_base
    if e.run_trigger is not None:
        d["rtr"] = e.run_trigger.value
    if e.dead_reason:
        d["dr"] = e.dead_reason
    if e.quota_deferred_ms:
        d["qd"] = e.quota_deferred_ms
    if e.reserved is not None:  # docs/keyspace.md, "Reserved first attempt"
        d["rv"] = str(e.reserved)
    return _dumps(d).encode()


# Every execution of a schedule shares its tenant, pool, task type, retry policy and timeout: their
# JSON is built once per schedule and spliced in. Encoding is on the path of every create and every
# transition (three per execution), and a dict + json.dumps per record was a tenth of a planner's CPU.
_str = json.encoder.encode_basestring_ascii  # what json.dumps uses for strings (ensure_ascii)
_Static = tuple[str, str, str, RetryPolicy, int]
_FRAGMENTS: dict[str, tuple[_Static, str, str]] = {}
_MAX_FRAGMENTS = 200_000  # bounded: a churn of schedule ids must not grow it forever


def _fragments(e: Execution) -> tuple[str, str]:
    static = (e.tenant, e.pool, e.task_type, e.retry, e.timeout_ms)
    hit = _FRAGMENTS.get(e.schedule_id)
    if hit is not None and hit[0] == static:
        return hit[1], hit[2]
    head = f',"sid":{_str(e.schedule_id)},"ten":{_str(e.tenant)},"pool":{_str(e.pool)},"task":{_str(e.task_type)}'
    tail = f',"retry":{_dumps(_retry_to(e.retry))},"to":{e.timeout_ms}'
    if len(_FRAGMENTS) >= _MAX_FRAGMENTS:
        _FRAGMENTS.clear()
    _FRAGMENTS[e.schedule_id] = (static, head, tail)
    return head, tail


def _attempt_json(a: Attempt) -> str:
    """`_dumps(_attempt_to(a))` without the dict and the encoder's walk (the same bytes: tested). Every
    transition re-encodes the record with its attempts: the dict + dumps was the larger part of encoding."""
    out = (f'{{"n":{a.attempt},"w":{_str(a.worker)},"p":{_str(a.planner)},"t":"{a.token}"'
           f',"d":{a.dispatched_ms},"dl":{a.deadline_ms}')
    if a.started_ms:
        out += f',"s":{a.started_ms}'
    if a.finished_ms:
        out += f',"f":{a.finished_ms},"ok":{"true" if a.succeeded else "false"}'
    if a.error_class is not None:
        out += f',"ec":"{a.error_class.value}"'
    if a.message:
        out += ',"m":' + _str(a.message)
    if a.trigger is not None:
        out += f',"tr":"{a.trigger.value}"'
    if a.start_by_ms:
        out += f',"sb":{a.start_by_ms}'
    if a.never_started:
        out += ',"ns":1'
    if a.stdout_tail:
        out += ',"so":' + _str(a.stdout_tail)
    if a.stderr_tail:
        out += ',"se":' + _str(a.stderr_tail)
    if a.exit_code is not None:
        out += f',"x":{a.exit_code}'
    if a.stop_requested_ms:
        out += f',"sr":{a.stop_requested_ms}'
    if a.ran_ms:
        out += f',"rn":{a.ran_ms}'
    return out + "}"


def encode_execution(e: Execution) -> bytes:
    head, tail = _fragments(e)
    out = (f'{{"id":{_str(e.id)}{head},"pl":{e.planned_ms},"due":{e.due_ms},"tr":"{e.trigger.value}"{tail}'
           f',"st":"{e.state.value}","n":{e.attempt}')
    if e.attempts:
        out += ',"at":[' + ",".join([_attempt_json(a) for a in e.attempts]) + "]"
    if e.next_attempt_ms:
        out += f',"next":{e.next_attempt_ms}'
    if e.skip_reason:
        out += ',"why":' + _str(e.skip_reason)
    # Operator overrides, written only when set (as in the reference encoding above).
    if e.overlap is not None:
        out += f',"ov":"{e.overlap.value}"'
    if e.payload is not None:
        out += ',"pay":"' + base64.b64encode(e.payload).decode() + '"'
    if e.attempt_base:
        out += f',"base":{e.attempt_base}'
    if e.run_trigger is not None:
        out += f',"rtr":"{e.run_trigger.value}"'
    if e.dead_reason:
        out += ',"dr":' + _str(e.dead_reason)
    if e.quota_deferred_ms:
        out += f',"qd":{e.quota_deferred_ms}'
    if e.reserved is not None:
        out += f',"rv":"{e.reserved}"'
    return (out + "}").encode()


_ST = b',"st":"'


def peek_state(value: bytes) -> ExecState:
    """The state of a stored execution without decoding the rest: a listing of thousands of records
    (claim, retention sweep) needs the full record only for the unfinished few. The top-level key is
    the only unescaped `,"st":"` in the JSON (quotes inside strings are escaped)."""
    i = value.find(_ST)
    if i < 0:
        return decode_execution(value).state
    i += len(_ST)
    return ExecState(value[i:value.index(b'"', i)].decode())


def decode_execution(value: bytes, mod_revision: int = 0) -> Execution:
    d = json.loads(value)
    return Execution(
        id=d["id"], schedule_id=d["sid"], tenant=d["ten"], pool=d["pool"], task_type=d["task"],
        planned_ms=int(d["pl"]), due_ms=int(d["due"]), trigger=Trigger(d.get("tr", "scheduled")),
        retry=_retry_from(d.get("retry", {})), timeout_ms=int(d["to"]), state=ExecState(d["st"]),
        attempt=int(d.get("n", 0)), attempts=tuple(_attempt_from(a) for a in d.get("at", ())),
        next_attempt_ms=int(d.get("next", 0)), skip_reason=d.get("why", ""),
        overlap=Overlap(d["ov"]) if d.get("ov") else None,
        payload=base64.b64decode(d["pay"]) if "pay" in d else None, attempt_base=int(d.get("base", 0)),
        run_trigger=Trigger(d["rtr"]) if d.get("rtr") else None, dead_reason=d.get("dr", ""),
        quota_deferred_ms=int(d.get("qd", 0)),
        reserved=FencingToken.parse(d["rv"], "rv") if d.get("rv") else None, mod_revision=mod_revision,
    )
