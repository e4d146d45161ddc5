"""Shared CLI plumbing: exit codes, error printing, time formatting, checks of flag values.

Light on purpose (no grpc, no protobuf): `schedctl preview` uses it too (docs/cli.md, "Start time").
"""

from __future__ import annotations

import re
import sys
from enum import IntEnum

from scheduler.errors import InvalidArgument
from scheduler.model import parse_rfc3339
from scheduler.timeplan.plan import from_ms

# The largest values of the proto's unsigned fields. argparse's `type=int` takes any integer, and protobuf
# raises ValueError (a traceback, exit 1) for one its field cannot hold, so flags are checked against these.
UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1

# The fraction of an RFC3339 time's seconds. Dates and offsets hold no `.` or `,`, so the first match is it.
_FRACTION = re.compile(r"[.,](\d+)")


class Exit(IntEnum):
    OK = 0
    FAILURE = 1  # the operation ran and failed
    INVALID = 2  # bad input: flags, spec, file (argparse uses 2 for usage errors too)
    NOT_FOUND = 3
    CONFLICT = 4  # already exists / version mismatch
    UNAVAILABLE = 5  # server or etcd unreachable: retrying may help
    TIMEOUT = 6  # a wait ran out (`region switchover`: the policy changed, the move is not complete)
    UNAUTHENTICATED = 7  # no credentials, or refused ones (a bad, expired or foreign token)
    PERMISSION_DENIED = 8  # known caller, but its roles do not allow the call


def fail_invalid(err: InvalidArgument) -> int:
    print(f"schedctl: {err}", file=sys.stderr)
    return Exit.INVALID


def rfc3339(ms: int) -> str:
    """UTC, `Z` suffix, milliseconds only when non-zero (planned times are usually whole seconds)."""
    dt = from_ms(ms)
    base = dt.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{ms % 1000:03d}Z" if ms % 1000 else f"{base}Z"


def check_count(flag: str, value: int | None, *, most: int | None = None,
                negative: str = "must not be negative") -> None:
    """Refuse a negative whole-number flag, or one over `most` (what the proto field holds), naming the flag.
    `negative` says what to give instead (`0 (all) or positive` for a --limit)."""
    if value is None:
        return
    if value < 0:
        raise InvalidArgument(flag, f"is {value}; {negative}")
    if most is not None and value > most:
        raise InvalidArgument(flag, f"is {value}; at most {most}")


def check_limit(value: int) -> None:
    """A list's --limit: 0 means all. A negative one is no count: the lists printed no row (exec list, skips,
    dlq list) or one (schedule list) with exit 0, an operator's typo read as "nothing there"."""
    check_count("--limit", value, negative="must be 0 (all) or positive")


def check_version(expected_version: int | None) -> None:
    """--expected-version goes into a uint64: one it cannot hold raised ValueError in protobuf (a traceback)."""
    check_count("--expected-version", expected_version, most=UINT64_MAX)


def has_sub_ms(text: str) -> bool:
    """Whether RFC3339 `text` has a non-zero digit past the milliseconds (`...:00.0009Z`). Read from the text:
    datetime keeps microseconds only, so `.0000001` would look whole there."""
    m = _FRACTION.search(text)
    return m is not None and m[1][3:].strip("0") != ""


def parse_instant(text: str, field: str) -> int:
    """An RFC3339 instant from the command line -> epoch ms, `field` named in errors. Every instant the CLI
    sends has millisecond precision, and the API refuses a sub-millisecond part of a planned time
    (INVALID_ARGUMENT): truncating it here instead made `rerun ID ...:00.0009Z` rerun `...:00.000Z`, a run the
    operator did not name. So it is refused for every instant argument alike (one rule, not one per verb)."""
    ms = parse_rfc3339(text, field)
    if has_sub_ms(text):
        raise InvalidArgument(field, f"{text!r} has a sub-millisecond part; instants have millisecond precision")
    return ms


def check_execution_id(text: str, field: str = "execution_id") -> str:
    """An execution id's planned time with a sub-millisecond part, refused as `parse_instant` refuses one (the
    server refuses the id too, as not canonical; this says why, before any call). Other checks: the server's."""
    _, at, when = text.rpartition("@")
    if at and has_sub_ms(when):
        raise InvalidArgument(field, f"time {when!r} has a sub-millisecond part; execution ids have millisecond "
                                     "precision (<schedule_id>@2026-11-29T10:00:00.000Z)")
    return text
