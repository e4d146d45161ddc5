"""The clock-skew guard's decisions, pure (DESIGN.md, Time: "Clock skew").

A planner probes each live peer's wall clock (Cristian's method, scheduler/planner/clock_guard.py) and
gets, per peer that answered within the round-trip bound, `offset = my clock - its clock`. `judge()`
turns one round of those into a verdict, `Hysteresis` turns verdicts into eligibility:

- **Majority.** The cluster is the live peers plus this planner (offset 0). The largest group of them
  whose clocks agree within `max_skew` (max - min <= max_skew) is the majority if it holds more than
  half of the cluster; its median offset is the *consensus*: how far this planner's clock is from the
  majority's. Out of bounds is `|consensus| > max_skew`. A peer that did not answer counts in the
  cluster but in no group, so it makes a verdict harder, never easier.
- **Cannot judge.** Alone (no peers), with two planners that disagree (1 of 2 is no majority), or with
  too few answers, there is no majority: the planner cannot tell whose clock is wrong and keeps
  planning. Three planners with three different clocks likewise: nobody stands down.
- **Hysteresis.** One out-of-bounds verdict makes the planner ineligible at once (standing down is the
  safe direction). It becomes eligible again only after `stable_rounds` verdicts in a row that are not
  out of bounds, spanning at least `stable_s` seconds of monotonic time. An unjudged verdict counts
  towards that when every live peer answered (there really is no majority: the planner keeps planning);
  one with unanswered probes changes nothing (a skewed planner whose peers are slow to answer stays out).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

STABLE_ROUNDS = 3  # verdicts in a row back in bounds before a skewed planner may own partitions again


@dataclass(frozen=True)
class Verdict:
    judged: bool  # a majority of the cluster agreed on a clock
    in_bounds: bool  # True when not judged: a planner that cannot judge itself keeps planning
    consensus_ms: int | None  # my clock minus the majority's (None: no majority)
    peers: int  # live peers
    answered: int  # of which answered within the round-trip bound
    majority: int  # size of the agreeing group (this planner included if it is in it)


def _median(xs: list[int]) -> int:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2


def judge(offsets: Mapping[str, int | None], max_skew_ms: int) -> Verdict:
    """One probe round: live peer -> my clock minus its clock in ms (None: no usable answer)."""
    answered = [o for o in offsets.values() if o is not None]
    cluster = len(offsets) + 1
    values = sorted([0, *answered])
    best: list[int] = []
    lo = 0
    for hi in range(len(values)):  # sliding window: the largest run of values within max_skew
        while values[hi] - values[lo] > max_skew_ms:
            lo += 1
        group = values[lo:hi + 1]
        if len(group) > len(best) or (len(group) == len(best) and abs(_median(group)) < abs(_median(best))):
            best = group
    if 2 * len(best) <= cluster or not answered:  # alone, a planner is a majority of one: no judgment
        return Verdict(False, True, None, len(offsets), len(answered), len(best))
    consensus = _median(best)
    return Verdict(True, abs(consensus) <= max_skew_ms, consensus, len(offsets), len(answered), len(best))


@dataclass
class Hysteresis:
    """Eligibility from a stream of verdicts. Starts eligible: a planner is judged before it claims
    (ClockGuard withholds eligibility until its first round), not presumed guilty."""

    stable_s: float
    stable_rounds: int = STABLE_ROUNDS
    eligible: bool = True
    _good: int = 0
    _good_since: float | None = None

    def feed(self, v: Verdict, mono: float) -> bool:
        """Take one verdict at monotonic time `mono`; returns whether eligibility changed."""
        if not v.in_bounds:
            self._good, self._good_since = 0, None
            if self.eligible:
                self.eligible = False
                return True
            return False
        if self.eligible:
            return False
        if not v.judged and v.answered < v.peers:
            return False  # peers that did not answer: no information, neither towards coming back nor against
        self._good += 1
        if self._good_since is None:
            self._good_since = mono
        if self._good >= self.stable_rounds and mono - self._good_since >= self.stable_s:
            self.eligible = True
            self._good, self._good_since = 0, None
            return True
        return False


@dataclass(frozen=True)
class Anchor:
    """The majority's wall clock as last measured, carried forward on this process's monotonic clock,
    which a wall-clock step (NTP, libfaketime) does not move."""

    majority_wall_ms: int  # the majority's wall time at `mono`
    mono: float

    def now_ms(self, mono: float) -> int:
        return self.majority_wall_ms + round((mono - self.mono) * 1000)


def bounded_now(wall_ms: int, anchor: Anchor | None, mono: float, max_skew_ms: int) -> int:
    """The wall time planning may use: this clock, but never more than `max_skew_ms` from the majority's
    clock carried forward from the last probe. Between a wall-clock jump and the round that trips the
    guard, runs then fire at most `max_skew_ms` (plus the probe's error) early or late, not by the jump."""
    if anchor is None:
        return wall_ms
    ref = anchor.now_ms(mono)
    return min(max(wall_ms, ref - max_skew_ms), ref + max_skew_ms)
