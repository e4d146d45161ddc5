"""Domain objects: plain frozen dataclasses, validated on construction by `validate_schedule`.

Conversion to and from protobuf lives at the gRPC edge only (scheduler/api/); nothing below floor 3
imports generated code.

Limits (documented in docs/time.md and enforced here, so a bad request never reaches etcd):
  schedule id   1-128 chars of [A-Za-z0-9._:-], starting with a letter or digit
  tenant        1-64 chars, same charset
  pool, task    1-64 chars, same charset
  payload       at most 64 KiB (it rides in every assignment; etcd's request limit is 1.5 MiB per txn)
  labels        at most 32; keys 1-63 chars [A-Za-z0-9._/-]; values at most 256 chars
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from functools import lru_cache

from scheduler.errors import InvalidArgument
from scheduler.ids import MAX_ID_LEN, check_name
from scheduler.timeplan import DstGap, DstOverlap, MissedRuns, Overlap, Plan, parse_spec
from scheduler.timeplan.plan import MAX_MS as PLAN_MAX_MS
from scheduler.timeplan.plan import format_duration_ms, format_instant, from_ms
from scheduler.timeplan.zone import check_zone_name

LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
MAX_NAME_LEN = 64
MAX_PAYLOAD_BYTES = 64 * 1024
MAX_LABELS = 32
MAX_LABEL_KEY_LEN = 63
MAX_LABEL_VALUE_LEN = 256
MAX_ATTEMPTS_LIMIT = 100
DAY_MS = 86_400_000


class ScheduleState(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 3  # total attempts, the first included
    initial_backoff_ms: int = 1_000
    max_backoff_ms: int = 60_000
    multiplier: float = 2.0
    max_unknown_attempts: int = 2  # attempts for errors of unknown class (bounded, then dead letter)


@dataclass(frozen=True, slots=True)
class Policies:
    missed_runs: MissedRuns = MissedRuns.LATEST
    catchup_window_ms: int = 3_600_000  # missed times older than now - window are skipped, never run
    catchup_cap: int = 10
    overlap: Overlap = Overlap.SKIP
    dst_gap: DstGap | None = None  # None: cronie default for the spec (see timeplan.plan)
    dst_overlap: DstOverlap | None = None
    jitter_ms: int = 0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    execution_timeout_ms: int = 300_000


@dataclass(frozen=True, slots=True)
class Schedule:
    id: str
    tenant: str
    spec: str
    worker_pool: str
    task_type: str
    time_zone: str = "UTC"
    payload: bytes = b""
    labels: dict[str, str] = field(default_factory=dict)
    state: ScheduleState = ScheduleState.ACTIVE
    start_ms: int | None = None  # planned times before this are not run (inclusive bound)
    end_ms: int | None = None  # planned times after this are not run (inclusive bound)
    policies: Policies = field(default_factory=Policies)
    version: int = 0  # etag for optimistic concurrency; 0 = not stored yet
    paused_reason: str = ""

    def plan(self) -> Plan:
        """The compiled plan, shared by every schedule with the same spec, zone, DST policies and bounds
        (plans are immutable): a planner holding 500,000 schedules of a few specs holds a few plans."""
        p = self.policies
        return plan_for(self.spec, self.id, self.time_zone, p.dst_gap, p.dst_overlap, self.start_ms, self.end_ms)


def plan_for(spec: str, schedule_id: str, tz: str, dst_gap: DstGap | None, dst_overlap: DstOverlap | None,
             start_ms: int | None = None, end_ms: int | None = None) -> Plan:
    """The shared compiled plan of a schedule's spec (`Schedule.plan`; also a skip record's recorded spec)."""
    # The id only shapes a plan through `H` fields and the phase of `@every` (timeplan.parse_spec);
    # any other spec compiles to the same plan whatever the id.
    key_id = schedule_id if "H" in spec or "@" in spec else ""
    return shared_plan(spec, key_id, tz, dst_gap, dst_overlap, start_ms, end_ms)


@lru_cache(maxsize=4096)
def shared_plan(spec: str, schedule_id: str, tz: str, dst_gap: DstGap | None, dst_overlap: DstOverlap | None,
                start_ms: int | None, end_ms: int | None) -> Plan:
    """parse_spec, cached (errors are not cached: they are raised again on every call)."""
    return parse_spec(spec, schedule_id=schedule_id, tz=tz, dst_gap=dst_gap, dst_overlap=dst_overlap,
                      start_ms=start_ms, end_ms=end_ms)


def parse_rfc3339(text: str, field_name: str) -> int:
    """RFC3339 / ISO-8601 with an explicit offset (`Z` or `+02:00`) -> UTC epoch ms."""
    try:
        dt = datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError:
        raise InvalidArgument(field_name, f"{text!r} is not an RFC3339 time like 2026-01-31T09:00:00Z") from None
    if dt.tzinfo is None:
        raise InvalidArgument(field_name, f"{text!r} has no UTC offset; add Z or +HH:MM")
    return (dt.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)) // _ONE_MS


def _check_policies(p: Policies) -> None:
    if not 0 <= p.catchup_window_ms <= 366 * DAY_MS:
        raise InvalidArgument("policies.missed_runs.catchup_window",
                              f"is {format_duration_ms(p.catchup_window_ms)}; must be between 0 and 366d")
    if not 1 <= p.catchup_cap <= 10_000:
        raise InvalidArgument("policies.missed_runs.catchup_cap", f"{p.catchup_cap} is outside 1-10000")
    if not 0 <= p.jitter_ms <= DAY_MS:
        raise InvalidArgument("policies.jitter", f"is {format_duration_ms(p.jitter_ms)}; must be between 0 and 24h")
    if not 1_000 <= p.execution_timeout_ms <= 7 * DAY_MS:
        raise InvalidArgument("policies.execution_timeout",
                              f"is {format_duration_ms(p.execution_timeout_ms)}; must be between 1s and 7d")
    r = p.retry
    if not 1 <= r.max_attempts <= MAX_ATTEMPTS_LIMIT:
        raise InvalidArgument("policies.retry.max_attempts", f"{r.max_attempts} is outside 1-{MAX_ATTEMPTS_LIMIT}")
    if not 1 <= r.max_unknown_attempts <= r.max_attempts:
        raise InvalidArgument("policies.retry.max_unknown_attempts",
                              f"{r.max_unknown_attempts} is outside 1-max_attempts ({r.max_attempts})")
    if not 0 < r.initial_backoff_ms <= r.max_backoff_ms <= DAY_MS:
        raise InvalidArgument(
            "policies.retry.initial_backoff",
            f"needs 0 < initial_backoff <= max_backoff <= 24h (initial_backoff "
            f"{format_duration_ms(r.initial_backoff_ms)}, max_backoff {format_duration_ms(r.max_backoff_ms)})"
        )
    if not 1.0 <= r.multiplier <= 10.0:
        raise InvalidArgument("policies.retry.backoff_multiplier", f"{r.multiplier} is outside 1-10")


def validate_schedule(s: Schedule) -> Plan:
    """Raise InvalidArgument naming the first bad field; return the compiled plan on success."""
    check_name(s.id, "id", MAX_ID_LEN)
    check_name(s.tenant, "tenant", MAX_NAME_LEN)
    check_name(s.worker_pool, "worker_pool", MAX_NAME_LEN)
    check_name(s.task_type, "task_type", MAX_NAME_LEN)
    if len(s.payload) > MAX_PAYLOAD_BYTES:
        raise InvalidArgument("payload", f"is {len(s.payload)} bytes; the limit is {MAX_PAYLOAD_BYTES}")
    if len(s.labels) > MAX_LABELS:
        raise InvalidArgument("labels", f"has {len(s.labels)} entries; the limit is {MAX_LABELS}")
    for k, v in s.labels.items():
        if not k or len(k) > MAX_LABEL_KEY_LEN or not LABEL_KEY_RE.match(k):
            raise InvalidArgument(f"labels[{k!r}]", f"key must be 1-{MAX_LABEL_KEY_LEN} chars of A-Z a-z 0-9 . _ / -")
        if len(v) > MAX_LABEL_VALUE_LEN:
            raise InvalidArgument(f"labels[{k!r}]", f"value is longer than {MAX_LABEL_VALUE_LEN} characters")
    _check_policies(s.policies)
    if s.start_ms is not None and s.end_ms is not None and s.start_ms > s.end_ms:
        raise InvalidArgument("end_at", "is before start_at")
    check_zone_name(s.time_zone)
    plan = s.plan()  # validates spec and time zone
    if s.start_ms is not None and s.start_ms >= PLAN_MAX_MS:
        raise InvalidArgument("start_at", f"is after the planning window's end, {format_instant(PLAN_MAX_MS)}")
    if plan.next_after_ms(plan.start_ms - 1) is None:
        raise InvalidArgument("spec", "never fires between start_at and end_at")
    return plan


_ONE_MS = from_ms(1) - from_ms(0)
