"""Checks on request fields that are not a whole Schedule (model.validate_schedule covers those).

Each raises InvalidArgument naming the request field, so the client sees it in BadRequest.
"""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp

from scheduler.errors import InvalidArgument
from scheduler.ids import MAX_ID_LEN, MAX_PLANNED_MS, check_name
from scheduler.model import MAX_NAME_LEN

MAX_REASON_BYTES = 1024
MAX_REQUEST_ID_LEN = 128


def schedule_id(value: str, field: str = "id") -> str:
    check_name(value, field)
    return value


def optional_name(value: str, field: str) -> str:
    """A filter that may be empty (tenant, task type, schedule id in a list request)."""
    if value:
        check_name(value, field, MAX_ID_LEN if field.endswith("schedule_id") else MAX_NAME_LEN)
    return value


def reason(value: str, field: str = "reason") -> str:
    n = len(value.encode())
    if n > MAX_REASON_BYTES:
        raise InvalidArgument(field, f"is {n} bytes; the limit is {MAX_REASON_BYTES}")
    return value


def request_id(value: str) -> str:
    if len(value) > MAX_REQUEST_ID_LEN:
        raise InvalidArgument("request_id", f"is {len(value)} characters; the limit is {MAX_REQUEST_ID_LEN}")
    return value


# Timestamps the server accepts: years 1970-9999 (etcd keys hold 13-digit epoch milliseconds).
MAX_MS = MAX_PLANNED_MS


def timestamp_ms(t: Timestamp, field: str, *, exact: bool = True) -> int:
    """Epoch milliseconds of `t`; `exact`: a sub-millisecond part is refused (planned times)."""
    if t.nanos < 0 or t.nanos >= 1_000_000_000:
        raise InvalidArgument(field, f"nanos {t.nanos} is outside 0-999999999")
    if exact and t.nanos % 1_000_000:
        raise InvalidArgument(field, "has a sub-millisecond part; planned times have millisecond precision")
    ms = t.seconds * 1000 + t.nanos // 1_000_000
    if not 0 <= ms <= MAX_MS:
        raise InvalidArgument(field, "is outside 1970-01-01 .. 9999-12-31")
    return ms
