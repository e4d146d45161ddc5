from __future__ import annotations

import asyncio
import threading
import warnings
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest

from scheduler.client import SchedulerClient
from tests.client.fake_server import FakeApi, start_fake


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeApi, str]]:
    api = FakeApi()
    server, address = await start_fake(api)
    try:
        yield api, address
    finally:
        await server.stop(grace=None)


@pytest.fixture
async def client(fake: tuple[FakeApi, str]) -> AsyncIterator[SchedulerClient]:
    async with SchedulerClient(fake[1], timeout=5.0) as c:
        yield c


@pytest.fixture
def fake_server_thread() -> Iterator[str]:
    """The fake on its own loop in a thread, for blocking callers (the sync wrapper, subprocesses)."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict[str, object] = {}

    async def main() -> None:
        server, address = await start_fake(FakeApi())
        box["server"], box["address"] = server, address
        started.set()
        await server.wait_for_termination()

    t = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    t.start()
    assert started.wait(10)
    try:
        yield str(box["address"])
    finally:
        server = box["server"]
        assert isinstance(server, grpc.aio.Server)
        # grpc.aio on a second thread's loop, in a process whose main loop also runs grpc.aio, has
        # been seen to hang its stop (once in ~10 runs). The test has passed by then: warn, and leave
        # the daemon thread to the process exit rather than fail an unrelated assertion.
        try:
            asyncio.run_coroutine_threadsafe(server.stop(grace=None), loop).result(10)
        except TimeoutError:
            warnings.warn("fake API server thread did not stop within 10 s", stacklevel=1)
            return
        t.join(10)
        loop.close()
