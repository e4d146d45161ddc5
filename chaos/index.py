"""The recorded history of a run, indexed for the checker: schedule activations, execution records,
skip records and holds from the etcd watch history; effects joined start-to-end per attempt; claims
and checkpoints with the harness times their revisions were seen at.

Nothing here judges; chaos/check.py does. Everything is rebuilt from the run directory (chaos/record.py),
never from what a planner said about itself.
"""

from __future__ import annotations

import bisect
import contextlib
import json
from dataclasses import dataclass, field

from chaos.history import Claim, HistoryReport, check_history
from chaos.record import Run, WatchRecord
from chaos.sink import EffectRecord
from scheduler.execution import Execution
from scheduler.model import Schedule, ScheduleState
from scheduler.region.policy import RegionPolicy
from scheduler.region.policy import decode as decode_policy
from scheduler.store.codec import decode_execution, decode_schedule
from scheduler.timeplan import Plan

__all__ = ["Activation", "Attempt", "HistoryIndex", "Skip"]


@dataclass(frozen=True)
class Activation:
    """A stretch of a schedule under one activation (create, pause, resume, spec change): from
    `activated_ms` (cluster clock, as the API wrote it) until the next activation or the delete."""

    schedule_id: str
    state: str  # active | paused | deleted
    activated_ms: int
    seen_ms: int  # harness time the put was seen (cluster clock: + offset)
    rev: int
    schedule: Schedule | None
    until_ms: int | None = None  # the next activation's instant; None: still current at the end

    def plan(self) -> Plan | None:
        return None if self.schedule is None else self.schedule.plan()


@dataclass(frozen=True)
class Skip:
    schedule_id: str
    after_ms: int
    through_ms: int
    reason: str
    rev: int
    seen_ms: int


@dataclass
class Attempt:
    """One accepted start at the sink, with its end if the sink saw one (times: harness clock)."""

    exec_id: str
    schedule_id: str
    planned_ms: int
    attempt: int
    worker: str
    partition: int
    revision: int
    start_ms: int
    end_ms: int | None = None
    aborted: bool = False  # ended by its caller going away (a killed worker), not completed


@dataclass
class HistoryIndex:
    run: Run
    offset_ms: int  # cluster wall clock = harness clock + offset
    rev_times: list[tuple[int, int]] = field(default_factory=list)  # (revision, harness ms first seen)
    versions: dict[str, list[Activation]] = field(default_factory=dict)  # every put/delete, in order
    activations: dict[str, list[Activation]] = field(default_factory=dict)  # boundaries only
    partition_of: dict[str, int] = field(default_factory=dict)
    records: dict[str, list[tuple[int, int, Execution]]] = field(default_factory=dict)  # eid -> (rev, ms, rec)
    skips: dict[str, list[Skip]] = field(default_factory=dict)
    holds: dict[str, list[tuple[int, int, int | None]]] = field(default_factory=dict)  # (from, put ms, del ms)
    checkpoints: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)  # p -> (rev, ms, watermark)
    attempts: dict[str, list[Attempt]] = field(default_factory=dict)  # eid -> accepted starts
    refused: list[EffectRecord] = field(default_factory=list)
    history: HistoryReport = field(default_factory=HistoryReport)
    # Secondary indexes, so that per-planned-time questions stay O(log n) on a 30-minute game day.
    claims_of: dict[int, list[Claim]] = field(default_factory=dict)  # partition -> claims by token
    claim_tokens: dict[int, list[int]] = field(default_factory=dict)  # partition -> their tokens, sorted
    attempts_of: dict[str, list[Attempt]] = field(default_factory=dict)  # schedule id -> accepted starts
    records_of: dict[str, list[str]] = field(default_factory=dict)  # schedule id -> execution ids
    # The region policy as written (rev, harness ms seen, policy): empty when the run had none.
    policies: list[tuple[int, int, RegionPolicy]] = field(default_factory=list)

    # ---- time ---------------------------------------------------------------------------------------

    def time_of(self, rev: int) -> int:
        """Harness ms at which revision `rev` (or the last one before it) was seen by the watcher."""
        i = bisect.bisect_right(self.rev_times, (rev, 1 << 62)) - 1
        return self.rev_times[i][1] if i >= 0 else self.run.meta.start_ms

    def rev_at(self, t_ms: int) -> int:
        """The last revision seen at or before harness time `t_ms`."""
        best = 0
        for rev, t in self.rev_times:
            if t > t_ms:
                break
            best = rev
        return best

    def cluster_ms(self, harness_ms: int) -> int:
        return harness_ms + self.offset_ms

    def harness_ms(self, cluster_ms: int) -> int:
        return cluster_ms - self.offset_ms

    # ---- lookups ------------------------------------------------------------------------------------

    def version_at(self, sid: str, cluster_ms: int) -> Activation | None:
        """The schedule as etcd had it at that instant (the latest put seen by then)."""
        cur = None
        for v in self.versions.get(sid, []):
            if self.cluster_ms(v.seen_ms) <= cluster_ms:
                cur = v
        return cur

    def final_record(self, eid: str) -> tuple[int, int, Execution] | None:
        recs = self.records.get(eid)
        return recs[-1] if recs else None

    def skip_covering(self, sid: str, t: int) -> list[Skip]:
        return [s for s in self.skips.get(sid, []) if s.after_ms < t <= s.through_ms]

    def claims(self) -> list[Claim]:
        return self.history.claims

    def owner_at_rev(self, partition: int, rev: int) -> Claim | None:
        """The claim current at `rev`: the latest made at or before it, if not ended by then."""
        cs = self.claims_of.get(partition, [])
        i = bisect.bisect_right(self.claim_tokens.get(partition, []), rev) - 1
        return cs[i] if i >= 0 and cs[i].held_at(rev) else None

    def watermark_before(self, partition: int, harness_ms: int) -> int | None:
        wm = None
        for _, t, w in self.checkpoints.get(partition, []):
            if t <= harness_ms:
                wm = w
        return wm

    def final_watermark(self, partition: int) -> int | None:
        cps = self.checkpoints.get(partition, [])
        return cps[-1][2] if cps else None


def _parts(prefix: str, key: str) -> list[str] | None:
    head = prefix.rstrip("/") + "/"
    return key[len(head):].split("/") if key.startswith(head) else None


def build(run: Run) -> HistoryIndex:
    idx = HistoryIndex(run, run.meta.clock_offset_ms)
    prefix = run.meta.prefix
    seen: set[int] = set()
    owner_events = []
    tomb_ms: dict[tuple[str, int], int] = {}  # (sid, rev) -> deleted_ms of the delete's tombstone
    records = [*run.snapshot, *run.watch]  # an observed cluster's starting state, then its history
    for w in records:  # first: a tombstone shares its revision with the delete, in either order
        parts = _parts(prefix, w.key)
        if parts and parts[0] == "tombstones" and w.type == "PUT" and len(parts) == 3:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                tomb_ms[(parts[2], w.rev)] = int(json.loads(w.value)["deleted_ms"])
    for w in records:
        if w.rev not in seen:
            seen.add(w.rev)
            idx.rev_times.append((w.rev, w.t_ms))
        parts = _parts(prefix, w.key)
        if not parts:
            continue
        kind = parts[0]
        if kind in ("owners", "checkpoints"):
            owner_events.append(w.event())
            if kind == "checkpoints" and w.type == "PUT":
                _checkpoint(idx, parts, w)
        elif kind == "schedules" and len(parts) == 3:
            _schedule(idx, int(parts[1]), parts[2], w, tomb_ms)
        elif kind == "executions" and len(parts) == 4 and w.type == "PUT":
            rec = decode_execution(w.value, w.mod_rev)
            idx.records.setdefault(rec.id, []).append((w.rev, w.t_ms, rec))
        elif kind == "skips" and len(parts) == 4 and w.type == "PUT":
            a, _, b = parts[3].partition("-")
            try:
                reason = str(json.loads(w.value).get("reason", ""))
            except ValueError:
                reason = ""
            idx.skips.setdefault(parts[2], []).append(Skip(parts[2], int(a), int(b), reason, w.rev, w.t_ms))
        elif kind == "holds" and len(parts) == 3:
            _hold(idx, parts[2], w)
        elif parts == ["cluster", "region"] and w.type == "PUT":
            with contextlib.suppress(ValueError, KeyError, TypeError):  # chaos/regions.py reports a bad record
                idx.policies.append((w.rev, w.t_ms, decode_policy(w.value)))
    idx.rev_times.sort()
    since = run.meta.watch_from_rev - 1 if run.meta.watch_from_rev > 1 else 0
    idx.history = check_history(owner_events, prefix, partitions=run.meta.partitions, since=since)
    for c in idx.history.claims:
        idx.claims_of.setdefault(c.partition, []).append(c)
    for p, cs in idx.claims_of.items():
        cs.sort(key=lambda c: c.token)
        idx.claim_tokens[p] = [c.token for c in cs]
    _boundaries(idx)
    _effects(idx, run.effects)
    for atts in idx.attempts.values():
        idx.attempts_of.setdefault(atts[0].schedule_id, []).extend(atts)
    for eid, recs in idx.records.items():
        idx.records_of.setdefault(recs[0][2].schedule_id, []).append(eid)
    return idx


def _checkpoint(idx: HistoryIndex, parts: list[str], w: WatchRecord) -> None:
    try:
        wm = int(json.loads(w.value)["watermark_ms"])
    except (ValueError, KeyError, TypeError):
        return  # chaos.history reports it
    idx.checkpoints.setdefault(int(parts[1]), []).append((w.rev, w.t_ms, wm))


def _schedule(idx: HistoryIndex, p: int, sid: str, w: WatchRecord, tomb_ms: dict[tuple[str, int], int]) -> None:
    idx.partition_of[sid] = p
    vs = idx.versions.setdefault(sid, [])
    if w.type == "DELETE":
        # The delete's instant: the tombstone written in the same txn says it (cluster clock).
        at = tomb_ms.get((sid, w.rev), idx.cluster_ms(w.t_ms))
        vs.append(Activation(sid, "deleted", at, w.t_ms, w.rev, None))
        return
    s, activated = decode_schedule(w.value, w.mod_rev)
    state = "paused" if s.state is ScheduleState.PAUSED else "active"
    vs.append(Activation(sid, state, activated, w.t_ms, w.rev, s))


def _boundaries(idx: HistoryIndex) -> None:
    """Collapse puts that kept the activation (a pool or policy change continues the same planned
    times) and give each activation its end: the next one's instant."""
    for sid, vs in idx.versions.items():
        acts: list[Activation] = []
        for v in vs:
            if acts and v.state == acts[-1].state and v.activated_ms == acts[-1].activated_ms:
                # Same activation: keep the newest schedule (policies) but the first instant.
                last = acts[-1]
                acts[-1] = Activation(sid, last.state, last.activated_ms, last.seen_ms, last.rev, v.schedule)
                continue
            acts.append(v)
        out = []
        for a, nxt in zip(acts, [*acts[1:], None], strict=True):
            until = None if nxt is None else nxt.activated_ms
            out.append(Activation(a.schedule_id, a.state, a.activated_ms, a.seen_ms, a.rev, a.schedule, until))
        idx.activations[sid] = out


def _hold(idx: HistoryIndex, sid: str, w: WatchRecord) -> None:
    hs = idx.holds.setdefault(sid, [])
    if w.type == "PUT":
        try:
            frm = int(json.loads(w.value)["from"])
        except (ValueError, KeyError, TypeError):
            return
        if hs and hs[-1][2] is None:
            return  # the same hold rewritten
        hs.append((frm, w.t_ms, None))
    elif hs and hs[-1][2] is None:
        frm, put, _ = hs[-1]
        hs[-1] = (frm, put, w.t_ms)


def _effects(idx: HistoryIndex, effects: list[EffectRecord]) -> None:
    # (execution id, attempt, worker) -> starts not yet ended, oldest first: one attempt delivered twice
    # to workers behind one address (F9) has two starts under one key, and each end closes the oldest.
    open_: dict[tuple[str, int, str], list[Attempt]] = {}
    for e in sorted(effects, key=lambda r: r.seq):
        key = (e.exec_id, e.attempt, e.worker)
        if e.phase == "start":
            if not e.accepted:
                idx.refused.append(e)
                continue
            a = Attempt(e.exec_id, e.schedule_id, e.planned_ms, e.attempt, e.worker, e.partition, e.revision, e.t_ms)
            idx.attempts.setdefault(e.exec_id, []).append(a)
            open_.setdefault(key, []).append(a)
        elif e.phase in ("end", "abort") and open_.get(key):
            got = open_[key].pop(0)
            got.end_ms = e.t_ms
            got.aborted = e.phase == "abort"
