"""What the API edge needs from the operations behind it (scheduler/api/operations.py implements
it): trigger, rerun, backfill, cancel, dead-letter replay/discard. A Protocol, so the service
type-checks and is unit-tested against a fake independently of that implementation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from scheduler.execution import Execution
from scheduler.timeplan import Overlap


class BackfillCountsLike(Protocol):
    @property
    def planned(self) -> int: ...
    @property
    def created(self) -> int: ...
    @property
    def existing(self) -> int: ...
    @property
    def skipped(self) -> int: ...
    @property
    def processed_until_ms(self) -> int | None: ...
    @property
    def done(self) -> bool: ...


class OperationsPort(Protocol):
    async def trigger(self, schedule_id: str, at_ms: int | None, overlap: Overlap | None) -> Execution: ...

    async def rerun(self, schedule_id: str, planned_ms: int) -> Execution: ...

    def backfill(self, schedule_id: str, start_ms: int, end_ms: int, overlap: Overlap | None,
                 dry_run: bool) -> AsyncIterator[BackfillCountsLike]: ...

    async def cancel_execution(self, execution_id: str, reason: str = ...) -> Execution: ...

    async def cancel_running(self, schedule_id: str, reason: str) -> int: ...

    async def replay_dead_letter(self, execution_id: str, reason: str = ...,
                                 use_current_schedule: bool = ...) -> Execution: ...

    async def discard_dead_letter(self, execution_id: str, reason: str = ...) -> Execution: ...
