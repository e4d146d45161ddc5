"""The `/metrics` endpoint, served by aiohttp on the process's own event loop.

On the loop rather than prometheus_client's threaded server: the collectors read live asyncio-owned
state (owned partitions, queues, streams), which must not change under them mid-scrape, and the
hot-path counters (`core.py`) are plain ints that only the loop thread touches.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry


class MetricsServer:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port; returns the bound port. OSError if it cannot listen."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        server = site._server  # aiohttp exposes the bound sockets only here
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else port
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
