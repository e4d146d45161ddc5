"""The `http` executor: POST JSON to a webhook, with the execution's identity in the headers.

Payload (JSON): {"url": "https://hooks.example/run", "body": {...any JSON...},
                 "headers": {"Authorization": "Bearer ..."}, "timeout_s": 10}

Headers sent: Content-Type: application/json, Idempotency-Key (the execution id), X-Fencing-Token
(`<partition>:<revision>`), X-Scheduled-At (planned time, RFC 3339 UTC), X-Attempt; they win over
payload headers of the same name. Outcome: 2xx success; 408, 429, 5xx, timeouts and connection errors
transient (Retry-After honoured); other 4xx permanent; 1xx/3xx permanent (redirects are not followed:
a webhook URL that moved is a configuration error, and a POST must not silently turn into a GET).
"""

from __future__ import annotations

import asyncio
import json
from email.utils import parsedate_to_datetime

import aiohttp
from yarl import URL

from scheduler import __version__
from scheduler.clock import SYSTEM_CLOCK, Clock
from scheduler.timeplan.plan import to_ms
from scheduler.worker.context import ExecutionContext, stopped_first
from scheduler.worker.errors import PermanentError, TransientError
from scheduler.worker.executors import payload as pl

_FIELDS = frozenset({"url", "body", "headers", "timeout_s"})
_BODY_BYTES = 1024  # of the response, quoted in the error message
_TRANSIENT_4XX = frozenset({408, 429})


def identity_headers(ctx: ExecutionContext) -> dict[str, str]:
    return {
        "Idempotency-Key": ctx.idempotency_key,
        "X-Fencing-Token": str(ctx.fencing_token),
        "X-Scheduled-At": ctx.planned_at_rfc3339,
        "X-Attempt": str(ctx.attempt),
    }


def retry_after_s(value: str | None, now_ms: int) -> float | None:
    """Retry-After as seconds from now: delta-seconds or an HTTP date. Unparseable: no hint."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (to_ms(when) - now_ms) / 1000)


class HttpExecutor:
    def __init__(self, default_timeout: float = 30.0, clock: Clock = SYSTEM_CLOCK) -> None:
        self.default_timeout = default_timeout
        self.clock = clock
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Created on first use: a ClientSession belongs to the running event loop.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers={"User-Agent": f"sched-worker/{__version__}"})
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _post(self, url: URL, body: bytes, headers: dict[str, str],
                    limit: float | None) -> tuple[int, str, float | None]:
        """One POST: (status, the start of the response body, Retry-After in seconds)."""
        try:
            async with self._client().post(url, data=body, headers=headers, allow_redirects=False,
                                           timeout=aiohttp.ClientTimeout(total=limit)) as resp:
                text = (await resp.content.read(_BODY_BYTES)).decode(errors="replace").strip()
                return resp.status, text, retry_after_s(resp.headers.get("Retry-After"), self.clock.wall_ms())
        except TimeoutError:  # aiohttp's own timeout errors are TimeoutError subclasses too
            raise TransientError(f"no response from {url.host} within {limit:g} s") from None
        except aiohttp.ClientError as e:
            raise TransientError(f"{type(e).__name__}: {e}") from None

    async def __call__(self, ctx: ExecutionContext, payload: bytes) -> None:
        data = pl.json_object(payload, _FIELDS)
        url = URL(pl.required_str(data, "url"))
        if url.scheme not in ("http", "https") or not url.host:
            raise pl.bad("url", f"{str(url)!r} must be an absolute http:// or https:// URL")
        reserved = {h.lower() for h in identity_headers(ctx)} | {"content-type"}
        headers = {k: v for k, v in pl.str_map(data, "headers").items() if k.lower() not in reserved}
        headers.update(identity_headers(ctx))
        headers["Content-Type"] = "application/json"
        limit = pl.min_timeout(pl.timeout_s(data) or self.default_timeout, ctx.remaining())
        body = json.dumps(data.get("body")).encode()
        # A stop (a Cancel, an orphaned attempt's stop, a drain) abandons the request the moment it is
        # asked for: the stop decides the attempt's outcome whatever the response says (worker/attempt.py),
        # so waiting for one only held the attempt `cancel_grace` (5 s) longer, and with it a
        # `cancel_other` schedule's next run, which waits for the run it cancelled to end.
        request = asyncio.ensure_future(self._post(url, body, headers, limit))
        if await stopped_first(ctx, request):
            raise TransientError(f"request to {url.host} abandoned: {ctx.cancel_reason or 'stopped'}")
        status, text, retry_after = request.result()
        if 200 <= status < 300:
            return
        detail = f"HTTP {status} from {url.host}" + (f": {text}" if text else "")
        if status in _TRANSIENT_4XX or status >= 500:
            raise TransientError(detail, retry_after=retry_after)
        raise PermanentError(detail)
