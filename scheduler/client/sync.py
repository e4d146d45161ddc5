"""`SyncSchedulerClient`: the async client behind blocking calls, for scripts and notebooks.

It owns a private event loop (asyncio.Runner) that every call runs on, because a grpc.aio channel
is bound to the loop it was made on. Do not use it from inside a running event loop: use
`SchedulerClient` there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Iterator
from typing import Any, TypeVar

from scheduler.client.client import SchedulerClient
from scheduler.client.retry import RetryPolicy
from scheduler.client.settings import DEFAULT_SERVER
from scheduler.tls import ClientTls

T = TypeVar("T")


async def _wrap(aw: Awaitable[T]) -> T:
    return await aw


class SyncSchedulerClient:
    def __init__(self, address: str = DEFAULT_SERVER, *, timeout: float = 10.0,
                 retry: RetryPolicy | None = None, tls: ClientTls | None = None, token: str | None = None) -> None:
        self._runner = asyncio.Runner()
        # The channel must be created on the runner's loop.
        self._client: SchedulerClient = self._run(self._make(address, timeout, retry, tls, token))

    @staticmethod
    async def _make(address: str, timeout: float, retry: RetryPolicy | None,
                    tls: ClientTls | None, token: str | None) -> SchedulerClient:
        return SchedulerClient(address, timeout=timeout, retry=retry, tls=tls, token=token)

    def _run(self, aw: Awaitable[T]) -> T:
        return self._runner.run(_wrap(aw))

    def __enter__(self) -> SyncSchedulerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self._run(self._client.close())
        finally:
            self._runner.close()

    def create_schedule(self, schedule: Any, **kw: Any) -> Any:
        return self._run(self._client.create_schedule(schedule, **kw))

    def batch_create_schedules(self, schedules: Any, **kw: Any) -> list[Any]:
        return self._run(self._client.batch_create_schedules(schedules, **kw))

    def get_schedule(self, schedule_id: str, **kw: Any) -> Any:
        return self._run(self._client.get_schedule(schedule_id, **kw))

    def update_schedule(self, schedule: Any, **kw: Any) -> Any:
        return self._run(self._client.update_schedule(schedule, **kw))

    def delete_schedule(self, schedule_id: str, **kw: Any) -> bool:
        return bool(self._run(self._client.delete_schedule(schedule_id, **kw)))

    def list_schedules(self, **kw: Any) -> Any:
        return self._run(self._client.list_schedules(**kw))

    def pause_schedule(self, schedule_id: str, **kw: Any) -> Any:
        return self._run(self._client.pause_schedule(schedule_id, **kw))

    def resume_schedule(self, schedule_id: str, **kw: Any) -> Any:
        return self._run(self._client.resume_schedule(schedule_id, **kw))

    def trigger_schedule(self, schedule_id: str, **kw: Any) -> Any:
        return self._run(self._client.trigger_schedule(schedule_id, **kw))

    def rerun_execution(self, schedule_id: str, planned_at: Any, **kw: Any) -> Any:
        return self._run(self._client.rerun_execution(schedule_id, planned_at, **kw))

    def backfill(self, schedule_id: str, start: Any, end: Any, **kw: Any) -> Iterator[Any]:
        """Progress messages, one per `next()`; closing the iterator early cancels the call."""
        stream: AsyncGenerator[Any, None] = self._client.backfill(  # type: ignore[assignment]
           schedule_id, start, end, **kw)
        try:
            while True:
                try:
                    yield self._run(stream.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._run(stream.aclose())

    def preview_schedule(self, **kw: Any) -> list[Any]:
        return self._run(self._client.preview_schedule(**kw))

    def get_execution(self, execution_id: str, **kw: Any) -> Any:
        return self._run(self._client.get_execution(execution_id, **kw))

    def list_executions(self, **kw: Any) -> Any:
        return self._run(self._client.list_executions(**kw))

    def list_skips(self, schedule_id: str, **kw: Any) -> Any:
        return self._run(self._client.list_skips(schedule_id, **kw))

    def cancel_execution(self, execution_id: str, **kw: Any) -> Any:
        return self._run(self._client.cancel_execution(execution_id, **kw))

    def list_dead_letters(self, **kw: Any) -> Any:
        return self._run(self._client.list_dead_letters(**kw))

    def replay_dead_letter(self, execution_id: str, **kw: Any) -> Any:
        return self._run(self._client.replay_dead_letter(execution_id, **kw))

    def discard_dead_letter(self, execution_id: str, **kw: Any) -> Any:
        return self._run(self._client.discard_dead_letter(execution_id, **kw))

    def cluster_status(self, **kw: Any) -> Any:
        return self._run(self._client.cluster_status(**kw))

    def switchover(self, target_region: str, **kw: Any) -> Any:
        return self._run(self._client.switchover(target_region, **kw))

    def drain_planner(self, node_id: str, **kw: Any) -> Any:
        return self._run(self._client.drain_planner(node_id, **kw))

    def undrain_planner(self, node_id: str, **kw: Any) -> Any:
        return self._run(self._client.undrain_planner(node_id, **kw))

    def get_time(self, **kw: Any) -> Any:
        return self._run(self._client.get_time(**kw))

    def set_tenant_quota(self, tenant: str | None, **kw: Any) -> Any:
        return self._run(self._client.set_tenant_quota(tenant, **kw))

    def get_tenant_quota(self, tenant: str | None, **kw: Any) -> Any:
        return self._run(self._client.get_tenant_quota(tenant, **kw))

    def list_tenant_quotas(self, **kw: Any) -> tuple[list[Any], Any | None]:
        return self._run(self._client.list_tenant_quotas(**kw))

    def delete_tenant_quota(self, tenant: str | None, **kw: Any) -> bool:
        return self._run(self._client.delete_tenant_quota(tenant, **kw))
