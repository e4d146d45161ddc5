"""Which calls are retried, how often, and how long a call may take in all.

Only reads are retried, and only on UNAVAILABLE (the server was not reached or is restarting): a
write that failed that way may have been applied (DESIGN.md: outcome unknown), so retrying it
blindly could act twice; the caller re-reads instead. Everything else (DEADLINE_EXCEEDED included)
is the server's answer and is surfaced as is.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import grpc

READS = frozenset({
    "GetSchedule", "ListSchedules", "PreviewSchedule", "GetExecution", "ListExecutions", "ListSkips",
    "ListDeadLetters",
    "GetClusterStatus", "GetTime", "ListAuditEvents", "GetTenantQuota", "ListTenantQuotas",
})
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 4  # first try included
    initial_backoff: float = 0.1  # seconds; doubled each time, full jitter
    max_backoff: float = 2.0

    def backoff(self, attempt: int) -> float:
        """Sleep before try `attempt + 1` (attempt counts from 1): full jitter, so clients that lost
        the same server do not come back in step."""
        return random.uniform(0, min(self.max_backoff, self.initial_backoff * 2 ** (attempt - 1)))


NO_RETRY = RetryPolicy(max_attempts=1)
