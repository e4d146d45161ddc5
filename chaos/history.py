"""Reconstruct partition ownership from etcd's history and check the fencing invariants.

After a drill, `read_history()` reads every event under the cluster's key prefix from revision 1
with a watch (so the run must not have been compacted) and keeps those of `owners/` and
`checkpoints/`. `check_history()` replays them revision by revision, keeping the owner key of every
partition as etcd had it at that revision, and reports:

(i)   exclusive ownership: an owner key is only ever *created* while it is absent; a put on a present
      owner key that names another node or lease would mean two planners held one partition;
(ii)  fenced writes: a checkpoint put at revision r for partition p carries the writer and token of
      the claim current at r, i.e. the owner key existed at r and token == its create_revision;
(iii) the watermark of each partition never decreases (and a checkpoint is never deleted).

Violations come back as human-readable lines; an empty list means the run kept every invariant.
`HistoryReport.findings` holds the same lines tagged with the invariant family they break (ownership,
fencing, watermark, or the history itself), which the drill checker (chaos/check.py) files under
I6, I4 and I5.
Owner and checkpoint events never share a revision (each is its own txn or lease revocation), so
"the claim current at r" is unambiguous.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from scheduler.store.etcd.types import EventType, WatchEvent
from scheduler.store.keyspace import Keyspace
from scheduler.store.kv import KV

__all__ = [
    "CheckpointWrite",
    "Claim",
    "Event",
    "HistoryReport",
    "check_history",
    "format_events",
    "read_and_check",
    "read_history",
]


@dataclass(frozen=True)
class Event:
    """One etcd event, reduced to what the checker needs (easy to build by hand in tests)."""

    revision: int
    type: EventType
    key: bytes
    value: bytes = b""
    create_revision: int = 0  # of the key after a put; 0 for deletes
    lease: int = 0

    @staticmethod
    def from_watch(ev: WatchEvent) -> Event:
        kv = ev.kv
        if ev.type is EventType.DELETE:
            return Event(ev.revision, EventType.DELETE, kv.key)
        return Event(ev.revision, EventType.PUT, kv.key, kv.value, kv.create_revision, kv.lease)


@dataclass
class Claim:
    """One tenure of one planner on one partition: from the owner key's creation to its deletion."""

    partition: int
    node: str
    token: int  # create_revision of the owner key = the fencing token
    lease: int
    end: int | None = None  # revision of the owner key's deletion; None: still held when the history ends
    writes: int = 0  # checkpoint writes that carried this claim's token while it was current
    last_write: int = 0  # revision of the last of them

    def held_at(self, revision: int) -> bool:
        return self.token <= revision and (self.end is None or revision < self.end)

    def __str__(self) -> str:
        until = f"deleted at rev {self.end}" if self.end is not None else "held at the end"
        return f"{self.node} (token {self.token}, {until})"


@dataclass(frozen=True)
class CheckpointWrite:
    partition: int
    revision: int
    watermark_ms: int
    writer: str
    token: int
    owner: Claim | None  # the claim current at `revision` (None: nobody owned the partition)

    @property
    def fenced_ok(self) -> bool:
        """The write carries the token and writer of the claim current at its revision."""
        return self.owner is not None and self.owner.token == self.token and self.owner.node == self.writer


@dataclass
class HistoryReport:
    events: int = 0
    first_revision: int = 0
    last_revision: int = 0
    claims: list[Claim] = field(default_factory=list)
    writes: list[CheckpointWrite] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    # The same lines tagged with what they break: "ownership" (two owners: I6), "fencing" (a write not
    # under the current claim: I4b), "watermark" (I5), "history" (the history itself is incomplete or
    # unreadable), in the order found.
    findings: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def stale_writes(self) -> list[CheckpointWrite]:
        """Checkpoint writes that landed without being the current owner's (check ii)."""
        return [w for w in self.writes if not w.fenced_ok]

    def claims_by(self, node: str) -> list[Claim]:
        return [c for c in self.claims if c.node == node]

    def writes_by(self, node: str, *, after: int = 0) -> list[CheckpointWrite]:
        return [w for w in self.writes if w.writer == node and w.revision > after]

    def owners_at(self, revision: int) -> dict[int, str]:
        """partition -> owner node as etcd had it at `revision`."""
        return {c.partition: c.node for c in self.claims if c.held_at(revision)}

    def takeovers_from(self, node: str) -> list[tuple[Claim, Claim]]:
        """(old, new) pairs where another node claimed a partition after `node`'s claim on it ended."""
        by_partition: dict[int, list[Claim]] = {}
        for c in self.claims:
            by_partition.setdefault(c.partition, []).append(c)
        pairs = []
        for cs in by_partition.values():
            for old, new in itertools.pairwise(cs):
                if old.node == node and new.node != node:
                    pairs.append((old, new))
        return pairs

    def summary(self, limit: int = 10) -> str:
        head = (f"{self.events} events, revisions {self.first_revision}..{self.last_revision}, "
                f"{len(self.claims)} claims, {len(self.writes)} checkpoint writes, "
                f"{len(self.violations)} violations")
        lines = [head, *(f"  - {v}" for v in self.violations[:limit])]
        if len(self.violations) > limit:
            lines.append(f"  ... and {len(self.violations) - limit} more")
        return "\n".join(lines)


def _flag(report: HistoryReport, kind: str, text: str) -> None:
    report.violations.append(text)
    report.findings.append((kind, text))


def _keyspace(prefix: str | Keyspace) -> Keyspace:
    return prefix if isinstance(prefix, Keyspace) else Keyspace(prefix)


def check_history(events: Iterable[Event], prefix: str | Keyspace, *, partitions: int | None = None,
                  since: int = 0) -> HistoryReport:
    """Replay `events` (every owners/ and checkpoints/ event since revision 1, in revision order)
    and check invariants (i)-(iii). Events under other keys are ignored.

    `since`: events at revisions up to it are a snapshot of the keys as they were then (a cluster
    observed from the middle of its life, e.g. staging), not history: their keys may have been created
    earlier, and a checkpoint in it may predate the current claim. They set the starting state only."""
    ks = _keyspace(prefix)
    report = HistoryReport()
    owners: dict[int, Claim] = {}  # partition -> current claim
    watermarks: dict[int, tuple[int, int]] = {}  # partition -> (watermark_ms, revision written)
    last_rev = 0
    for ev in events:
        if ev.key.startswith(ks.owners):
            kind = "owner"
        elif ev.key.startswith(ks.checkpoints):
            kind = "checkpoint"
        else:
            continue
        report.events += 1
        report.first_revision = report.first_revision or ev.revision
        if ev.revision < last_rev:
            _flag(report, "history", f"rev {ev.revision}: history out of order (after rev {last_rev})")
        last_rev = max(last_rev, ev.revision)
        try:
            p = ks.partition_of(ev.key)
        except ValueError:
            _flag(report, "history", f"rev {ev.revision}: unexpected key {ev.key!r}")
            continue
        if partitions is not None and not 0 <= p < partitions:
            _flag(report, "history", f"rev {ev.revision}: {kind} key for partition {p} outside 0..{partitions - 1}")
        if kind == "owner":
            _owner_event(report, owners, p, ev, snapshot=ev.revision <= since)
        else:
            _checkpoint_event(report, owners, watermarks, p, ev, snapshot=ev.revision <= since)
    report.last_revision = last_rev
    return report


def _owner_event(report: HistoryReport, owners: dict[int, Claim], p: int, ev: Event, *, snapshot: bool = False) -> None:
    current = owners.get(p)
    if ev.type is EventType.DELETE:
        if current is None:
            _flag(report, "history", f"rev {ev.revision}: partition {p}: owner key deleted while absent "
                                     "(history incomplete?)")
            return
        current.end = ev.revision
        del owners[p]
        return
    try:
        d = json.loads(ev.value)
        node, lease_hex = str(d["node"]), str(d["lease"])
    except (ValueError, KeyError, TypeError):
        _flag(report, "history", f"rev {ev.revision}: partition {p}: undecodable owner value {ev.value!r}")
        return
    if int(lease_hex, 16) != ev.lease:
        _flag(report, "ownership", f"rev {ev.revision}: partition {p}: {node}'s owner value names lease {lease_hex} "
                                 f"but the key is attached to lease {ev.lease:x}")
    if current is None:
        if ev.create_revision != ev.revision and not snapshot:
            _flag(report, "history", f"rev {ev.revision}: partition {p}: owner key of {node} was created at rev "
                                     f"{ev.create_revision}, before the history shows it (history incomplete?)")
        claim = Claim(p, node, ev.create_revision, ev.lease)
        owners[p] = claim
        report.claims.append(claim)
        return
    # (i) a put on a present owner key: only the same claim may touch it.
    if ev.create_revision == ev.revision:
        _flag(report, "ownership", f"rev {ev.revision}: partition {p}: owner key created by {node} while "
                                 f"{current} held it")
    elif current.node != node or current.lease != ev.lease:
        _flag(report, "ownership", f"rev {ev.revision}: partition {p}: two planners: {node} (lease {ev.lease:x}) "
                                 f"overwrote the owner key held by {current}")
    else:
        return  # the owner refreshed its own key: same claim
    current.end = ev.revision
    claim = Claim(p, node, ev.create_revision, ev.lease)
    owners[p] = claim
    report.claims.append(claim)


def _checkpoint_event(
    report: HistoryReport,
    owners: dict[int, Claim],
    watermarks: dict[int, tuple[int, int]],
    p: int,
    ev: Event,
    *,
    snapshot: bool = False,
) -> None:
    if ev.type is EventType.DELETE:
        _flag(report, "watermark", f"rev {ev.revision}: partition {p}: checkpoint deleted")
        watermarks.pop(p, None)
        return
    try:
        d = json.loads(ev.value)
        wm, writer, token = int(d["watermark_ms"]), str(d.get("writer", "")), int(d.get("token", 0))
    except (ValueError, KeyError, TypeError):
        _flag(report, "history", f"rev {ev.revision}: partition {p}: undecodable checkpoint {ev.value!r}")
        return
    owner = owners.get(p)
    if snapshot:  # the starting state: only its watermark counts (for (iii))
        watermarks[p] = (wm, ev.revision)
        return
    write = CheckpointWrite(p, ev.revision, wm, writer, token, owner)
    report.writes.append(write)
    # (ii) the write is the current owner's, made under its token.
    if owner is None:
        _flag(report, "fencing", f"rev {ev.revision}: partition {p}: stale write: checkpoint written by {writer} "
                                 f"(token {token}) while nobody owned the partition")
    elif not write.fenced_ok:
        _flag(report, "fencing", f"rev {ev.revision}: partition {p}: stale write: checkpoint written by {writer} "
                                 f"(token {token}) while {owner} owned it")
    else:
        owner.writes += 1
        owner.last_write = ev.revision
    # (iii) never backwards.
    prev = watermarks.get(p)
    if prev is not None and wm < prev[0]:
        _flag(report, "watermark", f"rev {ev.revision}: partition {p}: watermark went back from {prev[0]} "
                                 f"(rev {prev[1]}) to {wm} (written by {writer}, token {token})")
    if prev is None or wm >= prev[0]:
        watermarks[p] = (wm, ev.revision)


async def read_history(
    kv: KV,
    prefix: str | Keyspace,
    *,
    until_revision: int | None = None,
    timeout: float = 60.0,
    poke_every: float = 0.2,
) -> list[Event]:
    """Every owners/ and checkpoints/ event under `prefix` from revision 1 up to `until_revision`
    (default: etcd's revision now), read with a watch. Raises `Compacted` if the run was compacted.

    The end is found with progress notifications (requested every `poke_every` seconds), so it does
    not matter whether the last revisions touched this prefix at all."""
    ks = _keyspace(prefix)
    root = (ks.prefix + "/").encode()
    if until_revision is None:
        until_revision = (await kv.range(root, prefix=True, count_only=True, timeout=timeout)).revision
    out: list[Event] = []
    watcher = kv.watch(root, prefix=True, start_revision=1, progress_notify=True)

    async def poke() -> None:
        while True:
            await asyncio.sleep(poke_every)
            await watcher.request_progress()

    async def collect() -> None:
        async for batch in watcher:
            for ev in batch.events:
                if ev.revision > until_revision:
                    return
                if ev.kv.key.startswith((ks.owners, ks.checkpoints)):
                    out.append(Event.from_watch(ev))
            reached = batch.events[-1].revision if batch.events else batch.revision
            if reached >= until_revision:
                return
        raise RuntimeError("the history watch ended before reaching the wanted revision")

    poker = asyncio.create_task(poke())
    try:
        await asyncio.wait_for(collect(), timeout)
    finally:
        poker.cancel()
        await asyncio.gather(poker, return_exceptions=True)
        await watcher.close()
    return out


async def read_and_check(
    kv: KV, prefix: str | Keyspace, *, partitions: int | None = None, until_revision: int | None = None
) -> HistoryReport:
    """`read_history` then `check_history`: the one call a drill makes after its run."""
    events = await read_history(kv, prefix, until_revision=until_revision)
    return check_history(events, prefix, partitions=partitions)


def format_events(events: Sequence[Event], limit: int = 20) -> str:
    """A compact listing for assertion messages."""
    lines = []
    for ev in events[:limit]:
        what = ev.value.decode(errors="replace") if ev.type is EventType.PUT else "<delete>"
        lines.append(f"{ev.revision:>7} {ev.type.name:<6} {ev.key.decode(errors='replace')} {what}")
    if len(events) > limit:
        lines.append(f"... {len(events) - limit} more")
    return "\n".join(lines)
