"""The http executor against a real aiohttp server on 127.0.0.1: status classes, Retry-After, headers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from chaos.infra.ports import unused_port
from scheduler.clock import FakeClock
from scheduler.worker import PermanentError, TransientError
from scheduler.worker.executors.http import HttpExecutor, retry_after_s
from tests.worker.conftest import make_ctx


class Sink:
    """Records requests; the path picks the answer."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], Any]] = []
        self.base = ""
        self.release = asyncio.Event()  # ends the /slow handler at teardown

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.path, dict(request.headers), await request.json()))
        path = request.path
        if path == "/ok":
            return web.json_response({"ok": True}, status=202)
        if path == "/429":
            return web.Response(status=429, text="slow down", headers={"Retry-After": "7"})
        if path == "/503":
            date = "Wed, 21 Oct 2015 07:28:30 GMT"
            return web.Response(status=503, text="maintenance", headers={"Retry-After": date})
        if path == "/404":
            return web.Response(status=404, text="no such hook")
        if path == "/408":
            return web.Response(status=408)
        if path == "/302":
            raise web.HTTPFound("/ok")
        if path == "/slow":
            await self.release.wait()
        return web.Response(status=500)


@pytest.fixture
async def sink() -> AsyncIterator[Sink]:
    s = Sink()
    app = web.Application()
    app.router.add_post("/{tail:.*}", s.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    s.base = f"http://127.0.0.1:{port}"
    yield s
    s.release.set()
    await runner.cleanup()


@pytest.fixture
async def http() -> AsyncIterator[HttpExecutor]:
    # 2015-10-21T07:28:00Z: the 503's Retry-After date is 30 s later.
    ex = HttpExecutor(default_timeout=5, clock=FakeClock(wall_ms=1_445_412_480_000))
    yield ex
    await ex.aclose()


def _payload(url: str, **kw: Any) -> bytes:
    return json.dumps({"url": url, **kw}).encode()


async def test_success_posts_json_with_identity_headers(sink: Sink, http: HttpExecutor) -> None:
    body = {"invoice": 42, "items": [1, 2]}
    headers = {"Authorization": "Bearer t", "idempotency-key": "forged", "X-Custom": "yes"}
    await http(make_ctx(), _payload(f"{sink.base}/ok", body=body, headers=headers))
    ((path, got, received),) = sink.requests
    assert path == "/ok" and received == body
    assert got["Idempotency-Key"] == "nightly@2026-03-08T07:00:00.000Z"
    assert got["X-Fencing-Token"] == "12:9001"
    assert got["X-Scheduled-At"] == "2026-03-08T07:00:00.000Z"
    assert got["X-Attempt"] == "3"
    assert got["Content-Type"] == "application/json"
    assert got["Authorization"] == "Bearer t" and got["X-Custom"] == "yes"
    assert got["User-Agent"].startswith("sched-worker/")


async def test_429_is_transient_with_retry_after_seconds(sink: Sink, http: HttpExecutor) -> None:
    with pytest.raises(TransientError, match=r"HTTP 429.*slow down") as info:
        await http(make_ctx(), _payload(f"{sink.base}/429"))
    assert info.value.retry_after == 7


async def test_503_is_transient_with_retry_after_date(sink: Sink, http: HttpExecutor) -> None:
    with pytest.raises(TransientError, match="HTTP 503") as info:
        await http(make_ctx(), _payload(f"{sink.base}/503"))
    assert info.value.retry_after == 30


@pytest.mark.parametrize("path", ["/500", "/408"])
async def test_other_retryable_statuses(sink: Sink, http: HttpExecutor, path: str) -> None:
    with pytest.raises(TransientError) as info:
        await http(make_ctx(), _payload(f"{sink.base}{path}"))
    assert info.value.retry_after is None


@pytest.mark.parametrize(("path", "status"), [("/404", "HTTP 404.*no such hook"), ("/302", "HTTP 302")])
async def test_4xx_and_redirects_are_permanent(sink: Sink, http: HttpExecutor, path: str, status: str) -> None:
    with pytest.raises(PermanentError, match=status):
        await http(make_ctx(), _payload(f"{sink.base}{path}"))
    assert [p for p, _, _ in sink.requests] == [path], "a redirect is not followed"


async def test_timeout_is_transient(sink: Sink, http: HttpExecutor) -> None:
    with pytest.raises(TransientError, match=r"within 0\.2 s"):
        await http(make_ctx(), _payload(f"{sink.base}/slow", timeout_s=0.2))


async def test_worker_deadline_bounds_the_request(sink: Sink, http: HttpExecutor) -> None:
    with pytest.raises(TransientError, match="no response"):
        await http(make_ctx(timeout=0.2), _payload(f"{sink.base}/slow", timeout_s=30))


async def test_connection_refused_is_transient(http: HttpExecutor) -> None:
    with unused_port() as port, pytest.raises(TransientError, match="ClientConnectorError"):  # refused
        await http(make_ctx(), _payload(f"http://127.0.0.1:{port}/x"))


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (b'{"body": 1}', "payload.url: required"),
        (b'{"url": "ftp://x/y"}', "payload.url: 'ftp://x/y' must be an absolute"),
        (b'{"url": "/relative"}', "payload.url:"),
        (b'{"url": "http://x", "headers": {"A": 1}}', "payload.headers.A: must be a string"),
        (b'{"url": "http://x", "timeout_s": -1}', "payload.timeout_s:"),
        (b'{"url": "http://x", "method": "GET"}', "payload.method: unknown field"),
    ],
)
async def test_invalid_payload_is_permanent(http: HttpExecutor, payload: bytes, field: str) -> None:
    with pytest.raises(PermanentError) as info:
        await http(make_ctx(), payload)
    assert str(info.value).startswith(field)


@pytest.mark.parametrize(
    ("header", "expected"),
    [("120", 120.0), ("Wed, 21 Oct 2015 07:28:30 GMT", 30.0), ("Wed, 21 Oct 2015 07:00:00 GMT", 0.0),
     ("soon", None), ("", None), (None, None)],
)
def test_retry_after_parsing(header: str | None, expected: float | None) -> None:
    assert retry_after_s(header, 1_445_412_480_000) == expected


async def test_a_stop_abandons_the_request_at_once(sink: Sink, http: HttpExecutor) -> None:
    """A planner's Cancel sets ctx.cancel_event: the request is abandoned then, not when the worker cancels
    the handler's task `cancel_grace` (5 s) later. Fails on the old executor: it waited for the response,
    so the wait below timed out."""
    ctx = make_ctx()
    task = asyncio.create_task(http(ctx, _payload(f"{sink.base}/slow", timeout_s=30)))
    while not sink.requests:
        await asyncio.sleep(0.01)
    loop = asyncio.get_running_loop()
    asked = loop.time()
    ctx.cancel_reason = "overlap"
    ctx.cancel_event.set()
    with pytest.raises(TransientError, match="abandoned: overlap"):
        await asyncio.wait_for(task, 2.0)
    assert loop.time() - asked < 2.0


async def test_a_cancelled_http_attempt_is_cancelled_well_before_the_grace(sink: Sink, http: HttpExecutor) -> None:
    """Through the worker's Attempt with the default 5 s grace: the outcome is CANCELLED (the stop decides
    it), in well under the grace, with no unretrieved exception logged."""
    from scheduler.worker.attempt import Attempt, Status, Stop

    seen: list[dict[str, object]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    a = Attempt(make_ctx(), _payload(f"{sink.base}/slow", timeout_s=30), http, "p", timeout=60)
    run = asyncio.create_task(a.run())
    while not sink.requests:
        await asyncio.sleep(0.01)
    asked = loop.time()
    a.request_stop(Stop.CANCEL, grace=5.0, message="overlap")
    outcome = await asyncio.wait_for(run, 4.0)
    assert outcome.status is Status.CANCELLED
    assert loop.time() - asked < 2.0
    import gc

    gc.collect()
    await asyncio.sleep(0)
    assert not seen, seen
