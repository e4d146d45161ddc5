"""The set of planner streams a worker keeps: one per planner, from the configured seeds, then from
DiscoverPlanners answers and Welcome messages."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

import grpc

from scheduler._gen.scheduler.v1 import cluster_pb2 as cpb
from scheduler._gen.scheduler.v1 import worker_service_pb2 as wpb
from scheduler.worker.settings import WorkerSettings
from scheduler.worker.stream import PlannerStream, StreamOwner

log = logging.getLogger("scheduler.worker")


class PlannerSet:
    def __init__(self, owner: StreamOwner, settings: WorkerSettings) -> None:
        self.streams: dict[str, PlannerStream] = {}  # by address
        self._owner = owner
        self._settings = settings
        self._seeds = set(settings.planners)
        self._aliases: set[str] = set()  # addresses that turned out to reach an already-connected planner
        self._retired: list[PlannerStream] = []  # removed streams, closed for good in close()
        self._closed = False

    @property
    def connected(self) -> list[str]:
        return [a for a, s in self.streams.items() if s.connected]

    def start(self) -> None:
        for address in self._settings.planners:
            self.add(address)

    def add(self, address: str) -> None:
        if address in self.streams or address in self._aliases or self._closed:
            return
        stream = PlannerStream(address, self._owner, self._settings)
        self.streams[address] = stream
        stream.start()

    def remove(self, address: str) -> None:
        stream = self.streams.pop(address, None)
        if stream is not None:
            self._retired.append(stream)
            stream.half_close()  # the planner ends the call; no new session is opened
            stream.stop_redialling()

    def is_duplicate(self, stream: PlannerStream) -> bool:
        """Whether `stream` (just welcomed) reaches a planner another stream already serves; if so one
        of the two is removed. Two streams to one planner would double its credits and heartbeats.
        A configured address is kept over a discovered one, else the stream that was there first.
        Returns True when `stream` itself was removed."""
        twin = next((s for s in self.streams.values() if s is not stream and s.connected
                     and stream.planner_id and s.planner_id == stream.planner_id), None)
        if twin is None:
            return False
        drop = twin if stream.address in self._seeds and twin.address not in self._seeds else stream
        keep = stream if drop is twin else twin
        log.info("planner reached twice; dropping one address",
                 extra={"planner_id": stream.planner_id, "kept": keep.address, "dropped": drop.address})
        self._aliases.add(drop.address)
        self.remove(drop.address)
        return drop is stream

    def learn(self, planners: Iterable[cpb.PlannerInfo]) -> None:
        for p in planners:
            if not p.api_address:
                continue
            if p.liveness == cpb.PLANNER_LIVENESS_DOWN:
                stream = self.streams.get(p.api_address)
                if stream is not None and not stream.connected and p.api_address not in self._seeds:
                    self.remove(p.api_address)  # stop dialling a planner the cluster calls down
            else:
                self.add(p.api_address)

    async def discover(self) -> bool:
        """Ask any reachable planner for the full list and dial the ones not dialled yet."""
        for address in [*self._settings.planners, *(a for a in self.streams if a not in self._seeds)]:
            stream = self.streams.get(address)
            if stream is None:
                continue
            try:
                resp: Any = await stream.stub.DiscoverPlanners(wpb.DiscoverPlannersRequest(),
                                                               timeout=self._settings.welcome_timeout)
            except grpc.aio.AioRpcError as e:
                log.debug("discovery failed", extra={"planner": address, "code": e.code().name})
                continue
            self.learn(resp.planners)
            return True
        return False

    async def discover_forever(self) -> None:
        while True:
            found = await self.discover()
            await asyncio.sleep(self._settings.discovery_interval if found else self._settings.reconnect_backoff_max)

    async def close(self) -> None:
        self._closed = True
        await asyncio.gather(*(s.close(graceful_timeout=0.5) for s in [*self.streams.values(), *self._retired]),
                             return_exceptions=True)
