"""A loopback TCP proxy the test can cut: every open connection is aborted at once (both sides see the
connection reset), new ones are still accepted. A real network blip between a worker and a planner."""

from __future__ import annotations

import asyncio
import contextlib


class TcpProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.accepted = 0
        self._pairs: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            w.transport.abort()
            return
        self.accepted += 1
        self._pairs.append((w, uw))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(r, uw), pipe(ur, w), return_exceptions=True)

    def cut(self) -> int:
        """Abort every open connection; returns how many."""
        pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            a.transport.abort()
            b.transport.abort()
        return len(pairs)

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
