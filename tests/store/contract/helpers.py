"""Small helpers shared by the contract tests (backend-neutral: they only use the `KV` interface)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TypeVar

from scheduler.store.etcd import (
    DeleteResult,
    LeaseNotFound,
    OpResult,
    PutResult,
    RangeResult,
    TxnResult,
    WatchBatch,
    WatchEvent,
)
from scheduler.store.kv import KV, Keeper, WatchStream

R = TypeVar("R", RangeResult, PutResult, DeleteResult, TxnResult)


def b(text: str) -> bytes:
    return text.encode()


def as_(kind: type[R], result: OpResult) -> R:
    """A txn response narrowed to the kind the test expects (fails the test otherwise)."""
    assert isinstance(result, kind), f"expected {kind.__name__}, got {result!r}"
    return result


async def next_events(watch: WatchStream, n: int, within: float = 5.0) -> list[WatchEvent]:
    """The next n events (progress notifications skipped). Fails if fewer come within `within`."""
    got: list[WatchEvent] = []

    async def collect() -> None:
        while len(got) < n:
            batch = await anext(watch)
            got.extend(batch.events)

    await asyncio.wait_for(collect(), within)
    return got


async def next_progress(watch: WatchStream, within: float = 5.0) -> WatchBatch:
    async def find() -> WatchBatch:
        while True:
            batch = await anext(watch)
            if batch.is_progress:
                return batch

    return await asyncio.wait_for(find(), within)


async def nothing_within(watch: WatchStream, seconds: float) -> list[WatchBatch]:
    """Batches that arrive within `seconds` (used to show that nothing more does)."""
    got: list[WatchBatch] = []

    async def collect() -> None:
        while True:
            got.append(await anext(watch))

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(collect(), seconds)
    return got


async def revoke_quietly(kv: KV, lease_id: int) -> None:
    """Clean-up: revoke unless it is gone already."""
    with contextlib.suppress(LeaseNotFound):
        await kv.lease_revoke(lease_id)


def acked(keeper: Keeper) -> Keeper:
    """`last_ack` is part of the Keeper interface now; kept so the tests read the same."""
    return keeper
