"""A recorded drill run: the files of its directory, how they are written and read back.

The checker judges a run from these files alone, never from a planner's view of itself (issue 10,
"Checker and validity"). Every time is the harness's wall clock in epoch milliseconds (`t_ms`): the
harness, its effect sink and its etcd watcher live outside every fault, clock skew (F6) included, so
their clock is one clock. A run that shifts the whole cluster's wall clock (`clock_offset_ms`, for a DST
transition inside the window) records the offset, and the checker adds it to harness times before
comparing them with planned times.

    run.json          RunMeta: scenario, seed, plan fingerprint, versions, prefix, partitions, TTL, window
    scenario.toml     the scenario as run (lag bounds, validity thresholds, allowed errors)
    effects.jsonl     the effect sink's log (chaos/sink.py, EffectRecord)
    etcd-watch.jsonl  every event under the prefix from the run's first revision (WatchRecord)
    etcd-start.jsonl  only when the watch did not start at revision 1 (a cluster observed mid-life,
                      `watch_from_rev` in run.json): the keys as they were just before (record_snapshot)
    ops.jsonl         API operations as the harness made them (OpRecord)
    wire.jsonl        fenced txns etcd refused, seen on the planners' etcd links (chaos/wire.py; proxy links only)
    faults.jsonl      fault windows as injected, with when health came back (FaultRecord)
    commands.jsonl    an observed run's fault commands as run: argv, exit, output tails (chaos/fault_commands.py)
    logs/*.log        process logs (structured JSON lines), scanned by I8

Reading is strict where a wrong guess would hide a bug (a watch line without a revision stops the
load, naming file and line) and lenient where the writer may be killed mid-line (a torn last line of
a JSONL file is dropped).
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from chaos.history import Event
from chaos.sink import EffectRecord, read_effects
from chaos.wire import FencedTxn, read_wire
from scheduler.clock import SYSTEM_CLOCK, Clock
from scheduler.store.etcd.types import EventType, WatchEvent
from scheduler.store.kv import KV, WatchStream

__all__ = [
    "FaultRecord",
    "OpRecord",
    "Run",
    "RunError",
    "RunMeta",
    "RunWriter",
    "WatchProgress",
    "WatchRecord",
    "load_run",
    "record_snapshot",
    "record_watch",
    "write_jsonl",
    "write_run",
]


class RunError(ValueError):
    """A run directory that cannot be judged: names the file (and line) to look at."""


@dataclass(frozen=True)
class RunMeta:
    scenario: str
    seed: int
    prefix: str
    partitions: int
    lease_ttl_s: float
    start_ms: int  # the run's window: load and faults happened in [start_ms, end_ms]
    end_ms: int
    plan_fingerprint: str = ""
    versions: dict[str, str] = field(default_factory=dict)  # sched, python, etcd, ...
    clock_offset_ms: int = 0
    late_grace_ms: int = 2000  # the planners' settings the catch-up judgement depends on
    lookahead_ms: int = 1000
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> {"role", "region"}
    steady_before: bool = True  # the steady-state checks held before the first fault
    steady_after: bool = True  # ... and after the last (the cluster became healthy again)
    target: str = "local"  # local (the harness started the cluster) | observed (staging: faults by others)
    watch_from_rev: int = 1  # > 1: the history starts there, on top of etcd-start.jsonl's snapshot
    harness_errors: list[str] = field(default_factory=list)  # the runner's own failures: the run is invalid
    # An observed run's fault commands that failed (chaos/fault_commands.py), with their stderr's tail: the
    # run is invalid, since its windows are not what the scenario planned.
    command_errors: list[str] = field(default_factory=list)
    # False: the harness's etcd watch stopped short (it ended early, or never caught up), so the history is
    # complete only up to its last recorded event; the checker judges the part before it (check.judged_part).
    history_complete: bool = True

    @staticmethod
    def from_json(d: dict[str, Any]) -> RunMeta:
        known = RunMeta.__dataclass_fields__
        return RunMeta(**{k: v for k, v in d.items() if k in known})


@dataclass(frozen=True)
class WatchRecord:
    rev: int
    type: str  # PUT | DELETE
    key: str
    value: bytes = b""
    create_rev: int = 0
    mod_rev: int = 0
    lease: int = 0
    t_ms: int = 0  # when the watcher received it

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"rev": self.rev, "type": self.type, "key": self.key, "t_ms": self.t_ms}
        if self.type == "PUT":
            try:
                d["value"] = self.value.decode()
            except UnicodeDecodeError:
                d["value_b64"] = base64.b64encode(self.value).decode()
            d.update(create_rev=self.create_rev, mod_rev=self.mod_rev, lease=self.lease)
        return d

    @staticmethod
    def from_json(d: dict[str, Any]) -> WatchRecord:
        value = d["value"].encode() if "value" in d else base64.b64decode(d.get("value_b64", ""))
        return WatchRecord(int(d["rev"]), str(d["type"]), str(d["key"]), value, int(d.get("create_rev", 0)),
                           int(d.get("mod_rev", 0)), int(d.get("lease", 0)), int(d.get("t_ms", 0)))

    @staticmethod
    def from_watch(ev: WatchEvent, t_ms: int) -> WatchRecord:
        kv = ev.kv
        if ev.type is EventType.DELETE:
            return WatchRecord(ev.revision, "DELETE", kv.key.decode(errors="replace"), t_ms=t_ms)
        return WatchRecord(ev.revision, "PUT", kv.key.decode(errors="replace"), kv.value, kv.create_revision,
                           kv.mod_revision, kv.lease, t_ms)

    def event(self) -> Event:
        """The chaos.history form (ownership and checkpoint replay)."""
        t = EventType.PUT if self.type == "PUT" else EventType.DELETE
        return Event(self.rev, t, self.key.encode(), self.value, self.create_rev, self.lease)


@dataclass(frozen=True)
class OpRecord:
    t_ms: int  # invoked
    op: str
    schedule_id: str
    ok: bool
    t_end_ms: int = 0  # returned (0: never: the harness died)
    params: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] = field(default_factory=dict)  # e.g. {"execution_id": ...} of a rerun
    error: str = ""

    @staticmethod
    def from_json(d: dict[str, Any]) -> OpRecord:
        return OpRecord(**{k: v for k, v in d.items() if k in OpRecord.__dataclass_fields__})


@dataclass(frozen=True)
class FaultRecord:
    index: int
    type: str
    target: str
    start_ms: int
    end_ms: int | None  # None: never healed by the harness (the run is invalid)
    params: dict[str, Any] = field(default_factory=dict)
    role: str = ""
    name: str = ""
    healthy_ms: int | None = None  # when the cluster was healthy again after it (None: never)
    note: str = ""
    # What the nemesis made, counted (F9: `duplicated`, the assignments sent twice): validity reads it.
    counts: dict[str, int] = field(default_factory=dict)
    # What the nemesis did, for validity to check it happened (F12: the member removed and the one added).
    detail: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def from_json(d: dict[str, Any]) -> FaultRecord:
        return FaultRecord(**{k: v for k, v in d.items() if k in FaultRecord.__dataclass_fields__})


@dataclass
class Run:
    directory: Path
    meta: RunMeta
    effects: list[EffectRecord]
    watch: list[WatchRecord]
    ops: list[OpRecord]
    faults: list[FaultRecord]
    logs: list[Path]
    scenario_toml: str = ""
    snapshot: list[WatchRecord] = field(default_factory=list)  # etcd-start.jsonl (observed clusters)
    wire: list[FencedTxn] = field(default_factory=list)  # wire.jsonl: fenced txns etcd refused (chaos/wire.py)


def _jsonl(path: Path, *, strict: bool) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            if not isinstance(d, dict):
                raise ValueError("not an object")
        except ValueError as e:
            if i == len(lines) - 1:
                continue  # torn last line: the writer was killed mid-write
            if strict:
                raise RunError(f"{path}:{i + 1}: not a JSON object: {e}") from None
            continue
        out.append(d)
    return out


def load_run(directory: str | Path) -> Run:
    d = Path(directory)
    if not d.is_dir():
        raise RunError(f"{d}: not a directory")
    meta_path = d / "run.json"
    try:
        meta = RunMeta.from_json(json.loads(meta_path.read_text()))
    except FileNotFoundError:
        raise RunError(f"{meta_path}: missing (every recorded run has one)") from None
    except (ValueError, TypeError) as e:
        raise RunError(f"{meta_path}: {e}") from None
    watch: list[WatchRecord] = []
    for i, x in enumerate(_jsonl(d / "etcd-watch.jsonl", strict=True)):
        try:
            watch.append(WatchRecord.from_json(x))
        except (KeyError, ValueError, TypeError) as e:
            raise RunError(f"{d / 'etcd-watch.jsonl'}:{i + 1}: bad watch record ({e!r})") from None
    watch.sort(key=lambda w: w.rev)  # one revision may hold several events; sort is stable
    snapshot = [WatchRecord.from_json(x) for x in _jsonl(d / "etcd-start.jsonl", strict=True)]
    if meta.watch_from_rev > 1 and not snapshot:
        raise RunError(f"{d / 'etcd-start.jsonl'}: missing, but the watch started at revision "
                       f"{meta.watch_from_rev}: the keys before it are needed to judge the run")
    ops = [OpRecord.from_json(x) for x in _jsonl(d / "ops.jsonl", strict=True)]
    # A window is written when it is healed and again when health came back: the last line per index wins.
    faults = list({f.index: f for f in (FaultRecord.from_json(x) for x in _jsonl(d / "faults.jsonl", strict=True))}
                  .values())
    logs = sorted((d / "logs").glob("*.log")) if (d / "logs").is_dir() else []
    scen = d / "scenario.toml"
    try:
        wire = read_wire(_jsonl(d / "wire.jsonl", strict=True))
    except TypeError as e:
        raise RunError(f"{d / 'wire.jsonl'}: bad line ({e})") from None
    return Run(d, meta, read_effects(d / "effects.jsonl"), watch, sorted(ops, key=lambda o: o.t_ms),
               sorted(faults, key=lambda f: f.start_ms), logs, scen.read_text() if scen.exists() else "",
               sorted(snapshot, key=lambda w: w.rev), sorted(wire, key=lambda t: t.answered_ms))


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with path.open("w") as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")


def write_run(run: Run) -> None:
    """Write `run` as a run directory (synthetic histories in tests; the runner writes as it goes)."""
    d = run.directory
    d.mkdir(parents=True, exist_ok=True)
    (d / "run.json").write_text(json.dumps(asdict(run.meta), indent=1))
    if run.scenario_toml:
        (d / "scenario.toml").write_text(run.scenario_toml)
    write_jsonl(d / "effects.jsonl", (asdict(e) for e in run.effects))
    write_jsonl(d / "etcd-watch.jsonl", (w.to_json() for w in run.watch))
    write_jsonl(d / "ops.jsonl", (asdict(o) for o in run.ops))
    write_jsonl(d / "faults.jsonl", (asdict(f) for f in run.faults))
    if run.snapshot:
        write_jsonl(d / "etcd-start.jsonl", (w.to_json() for w in run.snapshot))


class RunWriter:
    """Writes a run directory while the run goes (what the runner records with): the sink logs to
    `effects_path`, the watcher to `watch`, operations and faults are appended as they happen (a
    line each, flushed: a crash of the harness keeps what was done), and `finish` writes run.json."""

    def __init__(self, directory: str | Path, scenario_toml: str = "") -> None:
        self.directory = Path(directory)
        self.logs = self.directory / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        if scenario_toml:
            (self.directory / "scenario.toml").write_text(scenario_toml)
        self.effects_path = self.directory / "effects.jsonl"
        self.watch: IO[str] = (self.directory / "etcd-watch.jsonl").open("a")
        self._ops = (self.directory / "ops.jsonl").open("a", buffering=1)
        self._faults = (self.directory / "faults.jsonl").open("a", buffering=1)
        self.wire: IO[str] = (self.directory / "wire.jsonl").open("a", buffering=1)

    def op(self, rec: OpRecord) -> None:
        self._ops.write(json.dumps(asdict(rec), separators=(",", ":")) + "\n")

    def fault(self, rec: FaultRecord) -> None:
        self._faults.write(json.dumps(asdict(rec), separators=(",", ":")) + "\n")

    def finish(self, meta: RunMeta) -> None:
        (self.directory / "run.json").write_text(json.dumps(asdict(meta), indent=1))
        for f in (self.watch, self._ops, self._faults, self.wire):
            f.close()


async def record_snapshot(kv: KV, prefix: str, out: IO[str], *, clock: Clock = SYSTEM_CLOCK) -> int:
    """For a cluster the harness did not start (staging): every key under `prefix` as it is now, one
    line each (as a PUT at its mod_revision), into etcd-start.jsonl. Returns the revision read at;
    watch from the next one (`record_watch(..., start_revision=rev + 1)`, `watch_from_rev` in run.json)."""
    root = (prefix.rstrip("/") + "/").encode()
    r = await kv.range(root, prefix=True)
    now = clock.wall_ms()
    for kv_ in sorted(r.kvs, key=lambda x: x.mod_revision):
        rec = WatchRecord(kv_.mod_revision, "PUT", kv_.key.decode(errors="replace"), kv_.value, kv_.create_revision,
                          kv_.mod_revision, kv_.lease, now)
        out.write(json.dumps(rec.to_json(), separators=(",", ":")) + "\n")
    out.flush()
    return r.revision


@dataclass
class WatchProgress:
    """What `record_watch` has recorded so far, for the harness to check before it trusts the history: a
    watch that stalls records nothing and raises nothing (a game day's recording stopped 406 s into 1,800
    and the checker then judged 23 minutes without a single etcd event)."""

    watcher: WatchStream | None = None
    written: int = 0  # the last revision written to the file

    async def caught_up(self, revision: int, timeout: float) -> bool:
        """Whether every event up to `revision` has been recorded (or etcd has said it has none below it:
        progress notifications cover revisions of keys outside the prefix)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            w = self.watcher
            if w is not None and max(w.revision, self.written) >= revision:
                return True
            if asyncio.get_running_loop().time() >= deadline:
                return False
            if w is not None:
                await w.request_progress()
            await asyncio.sleep(0.2)


async def record_watch(kv: KV, prefix: str, out: IO[str], stop: asyncio.Event, *, start_revision: int = 1,
                       clock: Clock = SYSTEM_CLOCK, progress: WatchProgress | None = None) -> int:
    """The harness's etcd watcher: every event under `prefix` from `start_revision`, one JSON line each,
    stamped with the harness's time, until `stop` is set. Returns the last revision written. Run it
    against a member outside the faults; the run must not be compacted meanwhile (a compaction ends
    the watch with an error, and the run cannot be judged)."""
    root = (prefix.rstrip("/") + "/").encode()
    last = 0
    watcher = kv.watch(root, prefix=True, start_revision=start_revision)
    if progress is not None:
        progress.watcher = watcher

    async def pump() -> None:
        nonlocal last
        async for batch in watcher:
            now = clock.wall_ms()
            for ev in batch.events:
                out.write(json.dumps(WatchRecord.from_watch(ev, now).to_json(), separators=(",", ":")) + "\n")
                last = ev.revision
            out.flush()
            if progress is not None:
                progress.written = last

    task = asyncio.create_task(pump())
    stopper = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # re-raise a watch failure (Compacted, ...)
    finally:
        for t in (task, stopper):
            t.cancel()
        await asyncio.gather(task, stopper, return_exceptions=True)
        await watcher.close()
    return last
