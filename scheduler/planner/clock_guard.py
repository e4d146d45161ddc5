"""The clock-skew guard of one planner: probe the peers, judge, stand down or come back, and bound the
wall time the partition loops plan with (docs/time.md, "Clock skew"; decisions in planner/skew.py).

Every `clock_probe_interval` the guard asks each live peer (the members/ cache of the ownership layer)
for its wall time with AdminService.GetTime, Cristian's method: a peer's clock at the midpoint of the
call is `server_time`, the midpoint is measured on this process's *monotonic* clock, so each answer
is kept as `peer wall - my monotonic`. This planner's own wall clock is read once per round, which
makes the offsets of one round consistent even if the wall clock steps in the middle of it. An answer
slower than the round-trip bound (`probe_rtt_bound`) is discarded: its error could be half of it.

Eligibility goes through the ownership layer's `eligible` hook (False for this planner while skewed,
and before its first round), and is published in the member record (`suspended: clock_skew`) so that
the others take over its share. `GuardedClock` is the clock the partition loops get: this process's
wall clock, but held within `max_clock_skew` of the majority's as carried forward on the monotonic
clock from the last round (skew.bounded_now), which bounds what a wall-clock jump can do before the
next round trips the guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from scheduler._gen.scheduler.v1 import admin_service_pb2 as apb
from scheduler._gen.scheduler.v1 import admin_service_pb2_grpc as agrpc
from scheduler.clock import Clock
from scheduler.planner.ownership import MemberInfo, Ownership
from scheduler.planner.settings import PlannerSettings
from scheduler.planner.skew import STABLE_ROUNDS, Anchor, Hysteresis, Verdict, bounded_now, judge
from scheduler.status import ClockStatus
from scheduler.tls import PLAINTEXT, Dialer

log = logging.getLogger("scheduler.planner.clock")

SUSPENDED_REASON = "clock_skew"
ANCHOR_ROUNDS = 10  # the majority's clock is carried forward at most this many probe intervals


class ClockGuard:
    def __init__(self, *, node_id: str, clock: Clock, ownership: Ownership, settings: PlannerSettings,
                 dial: Dialer = PLAINTEXT) -> None:
        self.node_id, self.clock, self.own, self.s = node_id, clock, ownership, settings
        self.dial = dial
        self.enabled = not settings.unsafe_disable_clock_guard
        self.skew_ms = round(settings.max_clock_skew * 1000)
        self.hysteresis = Hysteresis(stable_s=STABLE_ROUNDS * settings.clock_probe_interval)
        self.rounds = 0
        self.trips = 0
        self.verdict: Verdict | None = None
        self.peer_offsets: dict[str, int | None] = {}
        self.anchor: Anchor | None = None
        # node -> (address, TLS files generation, channel): a channel is re-made when either changed
        self._channels: dict[str, tuple[str, int, grpc.aio.Channel]] = {}
        self.peer_metadata: tuple[tuple[str, str], ...] = ()  # this planner's bearer token (auth on)

    # ---- what the node reads ----------------------------------------------------------------------

    def eligible(self, m: MemberInfo) -> bool:
        """The ownership layer's `eligible` hook, for this planner only (peers publish their own say)."""
        if m.node_id != self.node_id or not self.enabled:
            return True
        return self.rounds > 0 and self.hysteresis.eligible

    def bounded_wall_ms(self) -> int:
        wall, mono = self.clock.wall_ms(), self.clock.monotonic()
        anchor = self.anchor
        if not self.enabled or anchor is None or mono - anchor.mono > ANCHOR_ROUNDS * self.s.clock_probe_interval:
            return wall
        return bounded_now(wall, anchor, mono, self.skew_ms)

    def state(self) -> ClockStatus:
        v = self.verdict
        return ClockStatus(eligible=(self.rounds > 0 and self.hysteresis.eligible) or not self.enabled,
                           offset_ms=v.consensus_ms if v else None, peer_offsets_ms=dict(self.peer_offsets),
                           trips=self.trips)

    # ---- the loop -----------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self.own.members.synced.wait()
            while True:
                started = self.clock.monotonic()
                try:
                    await self.round()
                except (grpc.RpcError, OSError, ValueError) as e:  # a bad address in a member record
                    log.warning("clock probe round failed: %s", e)
                await asyncio.sleep(max(0.0, self.s.clock_probe_interval - (self.clock.monotonic() - started)))
        finally:
            for *_, ch in self._channels.values():
                with contextlib.suppress(Exception):
                    await ch.close(None)
            self._channels.clear()

    def _peers(self) -> list[MemberInfo]:
        out = []
        for kv in self.own.members.items.values():
            m = MemberInfo.decode(kv.value)
            if m.node_id != self.node_id:
                out.append(m)
        return out

    async def round(self) -> Verdict:
        peers = self._peers()
        await self._forget_gone({m.node_id for m in peers})
        # This clock once per round, against the monotonic clock: every offset of the round is taken
        # against the same reading, so a wall-clock step in mid-round cannot split the round.
        mine = self.clock.wall_ms() - round(self.clock.monotonic() * 1000)
        answers = await asyncio.gather(*(self._probe(m) for m in peers))
        offsets = {m.node_id: None if a is None else mine - a for m, a in zip(peers, answers, strict=True)}
        v = judge(offsets, self.skew_ms)
        mono = self.clock.monotonic()
        self.verdict, self.peer_offsets = v, offsets
        if v.judged and v.consensus_ms is not None:
            self.anchor = Anchor(mine - v.consensus_ms + round(mono * 1000), mono)
        first = self.rounds == 0
        self.rounds += 1
        changed = self.hysteresis.feed(v, mono) if self.enabled else False
        if changed or first:
            self._log_change(v, first)
            self.own.wake()
        if self.enabled:
            await self.own.set_suspended("" if self.hysteresis.eligible else SUSPENDED_REASON)
        return v

    def _log_change(self, v: Verdict, first: bool) -> None:
        fields = {"consensus_offset_ms": v.consensus_ms, "max_clock_skew_ms": self.skew_ms, "peers": v.peers,
                  "answered": v.answered, "majority": v.majority,
                  "peer_offsets_ms": {k: o for k, o in sorted(self.peer_offsets.items())}}
        if not self.hysteresis.eligible:
            self.trips += 1
            log.warning("clock skew: this planner's clock is %+d ms from the majority of its peers (bound %d ms): "
                        "releasing every partition and claiming none until it is back in bounds",
                        v.consensus_ms or 0, self.skew_ms, extra={"event": "clock_skew", **fields})
        elif not first:
            log.warning("clock back in bounds for %d probe rounds: eligible to own partitions again",
                        STABLE_ROUNDS, extra={"event": "clock_skew_cleared", **fields})
        else:
            log.info("first clock probe round", extra={"event": "clock_probe", "judged": v.judged, **fields})

    async def _probe(self, m: MemberInfo) -> int | None:
        """The peer's wall clock minus this process's monotonic clock (ms) at the call's midpoint, or None
        when it did not answer within the round-trip bound."""
        if not m.api_address:
            return None
        ch = self._channel(m)
        bound = self.s.probe_rtt_bound
        t0 = self.clock.monotonic()
        try:
            r: apb.GetTimeResponse = await agrpc.AdminServiceStub(ch).GetTime(apb.GetTimeRequest(), timeout=bound,
                                                                                metadata=self.peer_metadata)
        except (grpc.RpcError, TimeoutError, OSError) as e:
            log.debug("clock probe of %s failed: %s", m.node_id, e)
            return None
        t1 = self.clock.monotonic()
        if t1 - t0 > bound:
            return None
        return r.server_time.ToMilliseconds() - round((t0 + t1) / 2 * 1000)

    def _channel(self, m: MemberInfo) -> grpc.aio.Channel:
        have = self._channels.get(m.node_id)
        generation = self.dial.generation()  # rotated TLS files: the next probes dial with the new ones
        if have is not None and have[:2] == (m.api_address, generation):
            return have[2]
        if have is not None:
            asyncio.get_running_loop().create_task(have[2].close(None))
        ch = self.dial.aio_channel(m.api_address)
        self._channels[m.node_id] = (m.api_address, generation, ch)
        return ch

    async def _forget_gone(self, live: set[str]) -> None:
        for nid in [n for n in self._channels if n not in live]:
            _, _, ch = self._channels.pop(nid)
            with contextlib.suppress(Exception):
                await ch.close(None)


class GuardedClock:
    """The partition loops' clock: wall time bounded by the guard, monotonic time as it is."""

    def __init__(self, base: Clock, guard: ClockGuard) -> None:
        self._base, self._guard = base, guard

    def wall_ms(self) -> int:
        return self._guard.bounded_wall_ms()

    def monotonic(self) -> float:
        return self._base.monotonic()
