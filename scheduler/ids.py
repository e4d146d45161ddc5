"""Execution ids and fencing tokens: their one type each, built and parsed here only (DESIGN.md,
"Execution identity", "Ownership and fencing").

- **Execution id** `<schedule id>@<planned time>`, the planned time as 24 characters of UTC with
  milliseconds (`2026-12-01T12:00:00.000Z`). It is the idempotency key everywhere (etcd values, the
  worker's handler, HTTP `Idempotency-Key`, logs), so its text is a compatibility contract: never
  change it. `@` cannot occur in a schedule id, so the id splits back unambiguously, and within one
  schedule the ids sort as their planned times do (fixed width, years 1970-9999).
- **Fencing token** `<partition>:<revision>`: the partition's claim revision the attempt was
  dispatched under (the create_revision of `/owners/<partition>`). Protobuf carries it as a message
  (`FencingToken{partition, revision}`); the text is what etcd records, logs, the HTTP executor's
  `X-Fencing-Token` and the shell executor's `SCHED_FENCING_TOKEN` hold.

Dependency-free (only the error root), so the worker SDK and the client may import it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from scheduler.errors import InvalidArgument

# Schedule ids (model.validate_schedule checks them with the other names, which share the charset).
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*\Z")  # \Z, not $: "$" also matches before a final newline
MAX_ID_LEN = 128
PLANNED_LEN = 24  # len("2026-12-01T12:00:00.000Z")
MAX_EXECUTION_ID_LEN = MAX_ID_LEN + 1 + PLANNED_LEN

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)
_FORMATTED: dict[int, str] = {}  # second -> "YYYY-MM-DDTHH:MM:SS.": schedules share their planned seconds


# The last instant an execution id may name, 9999-12-31T23:59:59.999Z (etcd keys hold 13-digit epoch ms); the API's
# instants share it (api/inputs.py).
MAX_PLANNED_MS = 253_402_300_799_999


def format_rfc3339_ms(ms: int) -> str:
    """Epoch ms -> `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC), the planned-time part of an execution id."""
    sec, milli = divmod(ms, 1000)
    head = _FORMATTED.get(sec)
    if head is None:
        if len(_FORMATTED) >= 4096:
            _FORMATTED.clear()
        head = _FORMATTED[sec] = (_EPOCH + timedelta(seconds=sec)).strftime("%Y-%m-%dT%H:%M:%S.")
    return f"{head}{milli:03d}Z"


def execution_id(schedule_id: str, planned_ms: int) -> str:
    """`str(ExecutionId(schedule_id, planned_ms))` without building the object (materialization's hot path)."""
    return f"{schedule_id}@{format_rfc3339_ms(planned_ms)}"


def schedule_of(execution_id: str) -> str:
    """The schedule id of an execution id this process built or `ExecutionId.parse` accepted (no checks:
    text from the wire goes through `parse`, or is only looked up, where a miss is harmless)."""
    return execution_id.rpartition("@")[0]


@dataclass(frozen=True, slots=True, order=True)
class ExecutionId:
    """One planned time of one schedule. Orders as (schedule id, planned time), like its text and its
    etcd keys (`Keyspace.execution`, `Keyspace.dead_letter`)."""

    schedule_id: str
    planned_ms: int

    def __str__(self) -> str:
        return execution_id(self.schedule_id, self.planned_ms)

    @classmethod
    def parse(cls, text: str, field: str = "execution_id") -> ExecutionId:
        """Only the canonical form; InvalidArgument naming `field` (the request field) and what is wrong."""
        if not text:
            raise InvalidArgument(field, "is required")
        if len(text) > MAX_EXECUTION_ID_LEN:
            raise InvalidArgument(field, f"is {len(text)} characters; the limit is {MAX_EXECUTION_ID_LEN}")
        sid, at, when = text.rpartition("@")
        if not at:
            raise InvalidArgument(field, "must look like <schedule_id>@2026-11-29T10:00:00.000Z")
        check_name(sid, field)
        try:
            dt = datetime.fromisoformat(when.replace("z", "Z"))
        except ValueError:
            dt = None
        if dt is None or dt.tzinfo is None:
            raise InvalidArgument(field, f"time {when[:40]!r} is not like 2026-11-29T10:00:00.000Z")
        ms = (dt.astimezone(UTC) - _EPOCH) // _ONE_MS
        if not 0 <= ms <= MAX_PLANNED_MS:  # no execution has one: NOT_FOUND would hide the typo (an audit)
            raise InvalidArgument(field, f"time {when!r} is outside 1970-01-01 .. 9999-12-31")
        if format_rfc3339_ms(ms) != when:
            raise InvalidArgument(field, f"time {when!r} is not canonical; expected {format_rfc3339_ms(ms)}")
        return cls(sid, ms)


def check_name(value: str, field: str, max_len: int = MAX_ID_LEN) -> None:
    """InvalidArgument naming `field` unless `value` is a valid schedule id (or, with a shorter
    `max_len`, another name of the same charset: tenant, pool, task type)."""
    if not value:
        raise InvalidArgument(field, "is required")
    if len(value) > max_len:
        raise InvalidArgument(field, f"is {len(value)} characters; the limit is {max_len}")
    if not ID_RE.match(value):
        raise InvalidArgument(field, f"{value[:80]!r} may only contain A-Z a-z 0-9 . _ : - and must start alphanumeric")


_TOKEN_RE = re.compile(r"(\d+):(\d+)", re.ASCII)
_TOKENS: dict[str, FencingToken] = {}  # text -> token: one per partition claim, decoded with every record


@dataclass(frozen=True, slots=True)
class FencingToken:
    """Partition ownership the attempt was dispatched under. Pass `str(token)` (`<partition>:<revision>`)
    to side effects: a sink that remembers the highest revision per partition can refuse a stale
    planner's work. Compare only tokens of the same partition."""

    partition: int
    revision: int

    def __str__(self) -> str:
        return f"{self.partition}:{self.revision}"

    @classmethod
    def parse(cls, text: str, field: str = "fencing_token") -> FencingToken:
        """`<partition>:<revision>` (decimal) -> the token; InvalidArgument naming `field` otherwise."""
        t = _TOKENS.get(text)
        if t is None:
            m = _TOKEN_RE.fullmatch(text)
            if m is None:
                raise InvalidArgument(field, f"{text[:40]!r} is not <partition>:<revision>")
            if len(_TOKENS) >= 65_536:
                _TOKENS.clear()
            t = _TOKENS[text] = cls(int(m[1]), int(m[2]))
        return t
