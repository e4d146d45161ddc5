"""Sharing one worker's slots between its planner streams (pure bookkeeping; no I/O, time passed in).

The invariant: busy + sum(unused credits of every stream) <= capacity, so the planners together can
never make the worker run more than `concurrency` attempts, whatever they do with their credits.

Credits cannot be taken back on a live stream (the protocol has no revoke), so the book grants them
where they will be used:
- every stream first gets one "probe" credit, so any planner can start sending work;
- a stream that uses credits asks for more: each assignment received adds two to its `want` (one to
  replace the credit it used, one to grow), so a busy planner's window doubles every round trip;
- a stream that has used every credit it held asks at once for its fair share (capacity / streams):
  its planner has more work than credits. A planner that has just taken over partitions is handed
  their runs all at once; doubling from its probe took 5-6 round trips while the other streams, busy
  for longer, took the slots freed meanwhile (the smoke drill's runs after a rebalance started up to
  3.1 s late on CI, 1.5 s here; replayed in `tests/worker/test_credit_ramp.py`);
- free slots go first to the streams holding the fewest unused credits, then to the one granted
  least recently, so planners with work share the slots round-robin;
- a stream that has received nothing for `idle_after` seconds wants no more than its probe back.
Credits parked on an idle planner while another planner starves are reclaimed by re-opening the idle
stream (`reclaim()`): closing a stream is the only way the protocol returns credits. A stream that
still sends now and then but holds far more than it used in the last `idle_after` (the fair share it
asked for in a burst, then a trickle) counts as idle for this.
"""

from __future__ import annotations

from dataclasses import dataclass

STARVED_FOR = 0.5  # seconds a stream must have been starved before an idle one is re-opened for it


@dataclass
class _Line:
    opened_at: float
    unused: int = 0  # granted on this stream and not yet used by an assignment
    want: int = 1  # credits to grant when slots are free; starts with the probe
    last_used: float | None = None  # monotonic time of the last assignment received
    last_grant: int = -1  # sequence number of the last grant, for round-robin
    closing: bool = False  # we half-closed the stream: grant nothing more, but honour what it holds
    used: int = 0  # assignments received since `used_from`
    used_from: float = 0.0  # start of the current `idle_after` count
    used_before: int = -1  # ... and in the count before it (-1: none ended yet)
    starved_since: float | None = None  # when `reclaim` first saw it starved (None: not starved then)


class CreditBook:
    def __init__(self, capacity: int, idle_after: float) -> None:
        self.capacity = capacity
        self.idle_after = idle_after
        self.busy = 0  # attempts received and not finished (pending or running)
        self.draining = False  # grant nothing more
        self._lines: dict[str, _Line] = {}
        self._seq = 0

    @property
    def free(self) -> int:
        return self.capacity - self.busy - sum(line.unused for line in self._lines.values())

    def unused(self, key: str) -> int:
        line = self._lines.get(key)
        return line.unused if line else 0

    def open(self, key: str, now: float) -> None:
        """A stream got its Welcome: it holds no credits yet (credits never carry over streams)."""
        self._lines[key] = _Line(opened_at=now, used_from=now)

    def quiesce(self, key: str) -> None:
        """We are ending the stream: it gets no more credits, and its unused ones stay counted until
        the planner has closed its side (it may still use them on the way)."""
        line = self._lines.get(key)
        if line is not None:
            line.closing = True

    def close(self, key: str) -> None:
        """The stream ended: the planner forgets its credits, so they are free again."""
        self._lines.pop(key, None)

    def received(self, key: str, n: int, now: float) -> int:
        """`n` assignments arrived on `key`; returns how many were within its credits (the rest break
        the protocol and must be refused without running)."""
        line = self._lines.get(key)
        if line is None:
            return 0
        ok = min(n, line.unused)
        line.unused -= ok
        self.busy += ok
        line.want = min(self.capacity, line.want + 2 * ok)
        if ok and line.unused == 0:  # it sent all it could: its planner has more work than credits
            line.want = max(line.want, self._share())
        line.last_used = now
        self._count(line, ok, now)
        return ok

    def _share(self) -> int:
        return max(1, self.capacity // max(1, sum(1 for line in self._lines.values() if not line.closing)))

    def _count(self, line: _Line, n: int, now: float) -> None:
        if now - line.used_from >= self.idle_after:
            # A count ended: a gap of more than one count is a count of nothing.
            line.used_before = line.used if now - line.used_from < 2 * self.idle_after else 0
            line.used, line.used_from = 0, now
        line.used += n

    def _parked(self, line: _Line, now: float) -> bool:
        """Holding credits it does not use: nothing received for `idle_after`, or far more unused than
        it received lately: in the last whole `idle_after`, or in the current one if more (so a stream that
        trickles keeps no fair share, and one that has just started a burst keeps its credits)."""
        if line.last_used is None or now - line.last_used >= self.idle_after:
            return True
        self._count(line, 0, now)
        # Judged on what it used lately: the last whole count, or the current one when that is more. On the
        # last whole count alone, a planner that has just begun sending again after a quiet count (a new
        # owner's first runs after an etcd quorum loss: `used_before` is 0) read as a trickle and was re-opened
        # 0.2 s into its burst, dropping the answers to the starts it was recording (game day gd-s17a: +3 s).
        recent = max(line.used_before, line.used)
        return line.used_before >= 0 and line.unused > 2 * recent + 1

    def finished(self, n: int = 1) -> None:
        """`n` attempts ended (or were handed back, or were duplicates): their slots are free."""
        self.busy -= n
        assert self.busy >= 0, "more attempts finished than were received"

    def allocate(self, now: float) -> dict[str, int]:
        """Grant free slots; returns the credits to send per stream."""
        if self.draining:
            return {}
        for line in self._lines.values():
            if line.last_used is not None and now - line.last_used >= self.idle_after:
                line.want = min(line.want, 1 if line.unused == 0 else 0)
        grants: dict[str, int] = {}
        free = self.free
        while free > 0:
            wanting = [(line.unused, line.last_grant, key)
                       for key, line in self._lines.items() if line.want > 0 and not line.closing]
            if not wanting:
                break
            _, _, key = min(wanting)
            line = self._lines[key]
            line.unused += 1
            line.want -= 1
            line.last_grant = self._seq
            self._seq += 1
            grants[key] = grants.get(key, 0) + 1
            free -= 1
        return grants

    def reclaim(self, now: float) -> str | None:
        """A stream to re-open because it sits on credits while another stream is starved (wants
        credits, holds none, and no slot is free). Only idle streams are chosen, and a stream is left
        alone for `idle_after` after it opened, so this cannot churn."""
        if self.draining or self.free > 0:
            for line in self._lines.values():
                line.starved_since = None
            return None
        starved = []
        for k, line in self._lines.items():
            if line.want > 0 and line.unused == 0 and not line.closing:
                starved.append(k)
                if line.starved_since is None:
                    line.starved_since = now
            else:
                line.starved_since = None
        # Starved for a while, not just now: when every planner's runs come due at one instant (a burst
        # after a quiet spell), one stream uses its credits up a few milliseconds before the others begin
        # to use theirs, and those others are idle by every other measure. Re-opening one of them then
        # broke a planner's stream in the middle of its burst (bench_burst: 775 runs dispatched on it were
        # orphaned and given up 47 s later).
        if not any(now - (self._lines[k].starved_since or now) >= STARVED_FOR for k in starved):
            return None
        idle = [
            (line.unused, key)
            for key, line in self._lines.items()
            if key not in starved
            and not line.closing
            and line.unused > 0
            and now - line.opened_at >= self.idle_after
            and self._parked(line, now)
        ]
        return max(idle)[1] if idle else None
