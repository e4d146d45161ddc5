"""Shared CLI plumbing: exit codes, error printing, time formatting."""

from __future__ import annotations

import sys
from enum import IntEnum

from scheduler.errors import InvalidArgument
from scheduler.timeplan.plan import from_ms


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
