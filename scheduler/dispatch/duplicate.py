"""TEST ONLY: duplicate delivery of assignments (drill fault F9, docs/drills.md).

A network that replays a message delivers one assignment to a worker twice. Below gRPC that cannot be
made (repeating HTTP/2 frames is a protocol or HPACK error, not a second request: chaos/proxy.py), so
the planner's own assignment stream does it: while switched on, each assignment it sends is sent a
second time, alone, 0 to `delay_ms` later, with chance `probability`. The worker must run it once
(worker/worker.py dedupes by execution id and attempt); the drill's effect sink counts the effects.

Switched at runtime by a control file (the planner setting `unsafe_duplicate_delivery_file`, refused
outside test mode like every `unsafe_*` switch): the file present means on, with its JSON parameters
(`{"probability": 0.1, "delay_ms": 2000, "seed": 7}`); absent means off. A file, not a signal or an
RPC: it is a state rather than a toggle (a lost or repeated signal cannot flip it the wrong way), it
carries the parameters, a planner restarted during the drill reads the same state, it works the same
for planners in network namespaces, and it needs no change to the product's API or protobufs. The
planner polls it every `POLL_S` and answers in `<file>.state` (JSON: on, duplicated, skipped,
pending, dispatched), which the nemesis reads to record how many assignments were duplicated.

A duplicate takes one of the stream's credits, as any assignment does: a worker counts each
assignment it receives against its credits and frees the slot of one it ignores, so the two sides'
books stay equal. With no credit left the duplicate is skipped (counted, never sent beyond credit).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.dispatch.conn import Conn

__all__ = ["POLL_S", "DuplicateDelivery", "DuplicateParams"]

log = logging.getLogger(__name__)

POLL_S = 0.1  # how often the control file is read: the fault window's edges are this sharp
MAX_DELAY_MS = 10_000


@dataclass(frozen=True)
class DuplicateParams:
    probability: float
    delay_ms: int
    seed: int | None = None

    @staticmethod
    def parse(text: str) -> DuplicateParams:
        d = json.loads(text or "{}")
        p = DuplicateParams(float(d.get("probability", 0.1)), int(d.get("delay_ms", 2000)),
                            None if d.get("seed") is None else int(d["seed"]))
        if not 0.0 <= p.probability <= 1.0 or not 0 <= p.delay_ms <= MAX_DELAY_MS:
            raise ValueError(f"probability {p.probability} must be in [0, 1] and delay_ms {p.delay_ms} in "
                             f"0-{MAX_DELAY_MS}")
        return p


# Sends one assignment again on a stream; False when it could not (the stream ended, or has no credit).
Resend = Callable[[Conn, wpb.Assignment], bool]


class DuplicateDelivery:
    def __init__(self, path: str | Path, resend: Resend) -> None:
        self.path = Path(path)
        self.state_path = self.path.with_name(self.path.name + ".state")
        self._resend = resend
        self.params: DuplicateParams | None = None  # None: off
        self._rng = random.Random()
        self._raw: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.TimerHandle] = {}  # duplicates waiting for their delay
        self._ids = itertools.count()
        self.dispatched = 0  # assignments sent while on (what the fraction is of)
        self.duplicated = 0  # duplicates put on a stream
        self.skipped = 0  # chosen, but the stream had ended or had no credit when the delay was up
        self._written: str | None = None

    @property
    def on(self) -> bool:
        return self.params is not None

    def start(self) -> None:
        """Start polling the control file (idempotent; needs a running loop)."""
        if self._task is None or self._task.done():
            self.poll()
            self._task = asyncio.get_running_loop().create_task(self._poll_forever(), name="duplicate-delivery")

    async def close(self) -> None:
        for h in self._pending.values():
            h.cancel()
        self._pending.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            self.poll()

    def poll(self) -> None:
        """Read the control file; write the state file when anything changed."""
        try:
            raw: str | None = self.path.read_text()
        except FileNotFoundError:
            raw = None
        except OSError as e:  # unreadable: keep the last state, say why once per change
            raw = self._raw
            log.warning("duplicate delivery control file unreadable", extra={"path": str(self.path), "error": str(e)})
        if raw != self._raw:
            self._raw = raw
            try:
                self.params = None if raw is None else DuplicateParams.parse(raw)
            except (ValueError, TypeError) as e:
                self.params = None
                log.warning("duplicate delivery control file refused", extra={"path": str(self.path),
                                                                              "error": str(e)})
            if self.params is not None and self.params.seed is not None:
                self._rng.seed(self.params.seed)
            # WARNING, not INFO: a planner that duplicates its deliveries must never go unnoticed in a log.
            log.warning("TEST ONLY duplicate delivery " + ("on" if self.on else "off"),
                        extra={"event": "duplicate_delivery", "on": self.on, "duplicated": self.duplicated,
                               "probability": self.params.probability if self.params else 0.0,
                               "delay_ms": self.params.delay_ms if self.params else 0})
        self._write_state()

    def _write_state(self) -> None:
        state = json.dumps({"on": self.on, "dispatched": self.dispatched, "duplicated": self.duplicated,
                            "skipped": self.skipped, "pending": len(self._pending), "pid": os.getpid()})
        if state == self._written:
            return
        tmp = self.state_path.with_name(self.state_path.name + f".{os.getpid()}.tmp")
        try:
            tmp.write_text(state)
            tmp.replace(self.state_path)  # atomic: the nemesis never reads half a file
            self._written = state
        except OSError as e:
            log.warning("duplicate delivery state not written", extra={"path": str(self.state_path), "error": str(e)})

    def sent(self, c: Conn, batch: list[wpb.Assignment]) -> None:
        """`batch` went out on `c`: pick this window's share of it to send again later."""
        p = self.params
        if p is None:
            return
        self.dispatched += len(batch)
        loop = asyncio.get_running_loop()
        for a in batch:
            if self._rng.random() < p.probability:
                copy = wpb.Assignment()
                copy.CopyFrom(a)  # what was sent, byte for byte, whatever happens to the original later
                delay = self._rng.uniform(0.0, p.delay_ms / 1000)
                key = next(self._ids)
                self._pending[key] = loop.call_later(delay, self._fire, key, c, copy)

    def _fire(self, key: int, c: Conn, copy: wpb.Assignment) -> None:
        self._pending.pop(key, None)
        if self._resend(c, copy):
            self.duplicated += 1
        else:
            self.skipped += 1
