"""Stable hashes for Jenkins-style `H` fields and for deterministic jitter.

These values are a compatibility contract: a schedule must fire at the same hashed minute and with the
same jitter in every process, on every version, forever. Python's `hash()` is salted per process, so
it is never used. The definition, pinned by tests with literal values:

    stable_u64(text) = first 8 bytes (big-endian) of SHA-256(text encoded as UTF-8)

    H in field F of schedule S:   stable_u64(S + "\\x00H\\x00" + F)
        F = second | minute | hour | day_of_month | month | day_of_week | every (the `@every ... phase H`)
    jitter of S at planned ms T:  stable_u64(S + "\\x00J\\x00" + str(T)) % (jitter_ms + 1)
"""

from __future__ import annotations

import hashlib
import re


def stable_u64(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def field_hash(schedule_id: str, field: str) -> int:
    return stable_u64(f"{schedule_id}\x00H\x00{field}")


def jitter_ms(schedule_id: str, planned_ms: int, max_jitter_ms: int) -> int:
    """A delay in [0, max_jitter_ms] that is the same for every replay of (schedule, planned time)."""
    if max_jitter_ms <= 0:
        return 0
    return stable_u64(f"{schedule_id}\x00J\x00{planned_ms}") % (max_jitter_ms + 1)


# A hashed field: a cron field or list item starting with H (`H`, `H/15`, `H(0-29)`, `0,H`), or the phase of
# `@every 1h phase H`. No other token starts with H (month and weekday names do not, macros start with @).
_USES_H = re.compile(r"(?:^|[\s,])H")


def uses_hash(spec: str) -> bool:
    """Whether `spec` has a field hashed from the schedule id (`H`): planning it needs the id."""
    return _USES_H.search(spec) is not None
