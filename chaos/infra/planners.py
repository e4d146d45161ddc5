"""Planner processes for drills: `schedctl planner` subprocesses started, signalled and stopped by pid.

`PlannerSet` starts planners against one etcd cluster and key prefix with the drills' fast timings,
and `close()` (call it from a finalizer) SIGKILLs every one still running, resuming paused ones
first. An atexit hook and, on Linux, a parent-death signal (setpriv --pdeathsig) are backstops so
that even a killed pytest leaves no planner behind. Nothing is ever stopped by name.

Each planner writes its JSON log lines to its own file; `events()` parses the ones that carry an
`event` field (acquired, lost, fenced_out, write).

Ports: a planner is started on `api_port` 0 (its default) and the port it bound is read back from its
`serving` log line (`wait_serving()`, `serving()`); likewise `metrics_address` 127.0.0.1:0 and its
`metrics_serving` line. Picking a port first and passing it loses races on a busy machine (and gRPC
binds with SO_REUSEPORT, so a collision may not even fail). Only a planner that must come back on
the address its workers dial is given one (`PlannerSet.start_serving(..., api_port=...)`), and that
start is retried on a bind error.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.infra.ports import is_bind_error
from chaos.infra.procs import forget, freeze, spawn
from scheduler.store.etcd.errors import EtcdError
from scheduler.store.etcd.types import EventType
from scheduler.store.keyspace import Keyspace
from scheduler.store.kv import KV

# Fast timings for drills: renew + 2 x rpc_timeout (1.3) <= lease_ttl - safety_margin (1.7); a
# planner round (which advances the partition's checkpoint) every 50 ms.
FAST: dict[str, str] = {
    "lease_ttl": "2",
    "renew_interval": "0.5",
    "rpc_timeout": "0.4",
    "safety_margin": "0.3",
    "loop_interval": "0.05",
}

# For tests of the API and the CLI rather than of failover. A request's etcd calls get the planner's
# rpc_timeout as their deadline, and FAST's 0.4 s does not hold on a loaded 2-core machine (a
# `region switchover` got DEADLINE_EXCEEDED from etcd there, exit 5 instead of 2): 3 s does. The lease
# grows to keep renew + 2 x rpc_timeout (1 + 6) <= lease_ttl - safety_margin (10 - 1); these tests
# hand partitions over by drain, not by lease expiry, so the longer TTL costs them nothing.
API: dict[str, str] = {
    "lease_ttl": "10",
    "renew_interval": "1",
    "rpc_timeout": "3",
    "safety_margin": "1",
    "loop_interval": "0.05",
}

# A planner's start-up (Python and gRPC imports, first etcd calls) takes 1-2 s on an idle machine and
# several times that on a loaded 2-core one: waits for it allow this much.
START_TIMEOUT = 60.0
BIND_ATTEMPTS = 5  # starts on a fixed port lost to another process before giving up


class PlannerExited(RuntimeError):
    """The planner exited before it was serving."""


class PlannerPortInUse(PlannerExited):
    """The planner exited because its API (or metrics) address was taken."""


def schedctl_binary() -> str:
    beside = Path(sys.executable).parent / "schedctl"
    if os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("schedctl")
    if found is None:
        raise RuntimeError("schedctl not found next to the test interpreter: run scripts/setup.sh")
    return found


@dataclass
class PlannerProcess:
    node_id: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    started_at: float = 0.0  # monotonic
    log_start: int = 0  # where this process's lines begin in log_path

    @property
    def pid(self) -> int:
        assert self.process is not None, f"planner {self.node_id} was never started"
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def start(self) -> PlannerProcess:
        if self.running:
            raise RuntimeError(f"planner {self.node_id} is already running (pid {self.pid})")
        self.log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.process = spawn(self.argv, self.log_path, env=self.env)
        self.paused = False
        self.started_at = time.monotonic()
        return self

    # ---- addresses it bound (read back from its log) ----------------------------------------------

    def bound(self, event: str = "serving") -> str | None:
        """The address of this process's `serving` (API) or `metrics_serving` line, once logged."""
        for r in self.log_records(since_start=True):
            if r.get("event") == event and r.get("address"):
                return str(r["address"])
        return None

    def _check_alive(self, what: str) -> None:
        if self.process is not None and self.process.poll() is not None:
            tail = self.log_tail(40, since_start=True)
            kind = PlannerPortInUse if is_bind_error(tail) else PlannerExited
            raise kind(f"planner {self.node_id} exited ({self.process.returncode}) before {what}; "
                       f"{self.log_path}:\n{tail}")

    def wait_serving(self, timeout: float = START_TIMEOUT, event: str = "serving") -> str:
        """Block until the planner logged the address it bound; returns host:port. Raises
        PlannerExited (PlannerPortInUse for a taken address) if it exits first."""
        deadline = time.monotonic() + timeout
        while (address := self.bound(event)) is None:
            self._check_alive(f"logging {event!r}")
            if time.monotonic() > deadline:
                raise AssertionError(f"planner {self.node_id} logged no {event!r} within {timeout:g}s:\n"
                                     f"{self.log_tail(since_start=True)}")
            time.sleep(0.05)
        return address

    async def serving(self, timeout: float = START_TIMEOUT, event: str = "serving") -> str:
        """`wait_serving()` without blocking the event loop."""
        deadline = time.monotonic() + timeout
        while (address := self.bound(event)) is None:
            self._check_alive(f"logging {event!r}")
            if time.monotonic() > deadline:
                raise AssertionError(f"planner {self.node_id} logged no {event!r} within {timeout:g}s:\n"
                                     f"{self.log_tail(since_start=True)}")
            await asyncio.sleep(0.05)
        return address

    # ---- signals (by pid) -----------------------------------------------------------------------

    def kill(self) -> None:
        """SIGKILL: no drain, no revoke; its lease expires after the TTL."""
        if self.process is None:
            return
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
            self.process.wait()
        self.paused = False
        forget(self.pid)

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM (the planner drains: hands its partitions over, then exits); SIGKILL if it hangs.
        Returns the exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            if self.paused:
                self.resume()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        forget(self.pid)
        rc = self.process.poll()
        assert rc is not None
        return rc

    async def stop(self, timeout: float = 15.0) -> int:
        """`terminate()` without blocking the event loop (watches keep running meanwhile)."""
        assert self.process is not None
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            if self.paused:
                self.resume()
            deadline = time.monotonic() + timeout
            while self.process.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110 (polls a child's exit: nothing to wait on)
                await asyncio.sleep(0.02)
        return self.terminate(0.1)

    def pause(self) -> None:
        freeze(self.pid)
        self.paused = True

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)
        self.paused = False

    # ---- logs -----------------------------------------------------------------------------------

    def _text(self, since_start: bool) -> str:
        try:
            with self.log_path.open("rb") as f:
                if since_start:
                    f.seek(self.log_start)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def log_records(self, since_start: bool = False) -> list[dict[str, Any]]:
        records = []
        text = self._text(since_start)
        for line in text.splitlines():
            if line.startswith("{"):
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue  # a line being written right now
        return records

    def events(self, *kinds: str) -> list[dict[str, Any]]:
        """Log records with an `event` field (of the given kinds, if any)."""
        return [r for r in self.log_records() if "event" in r and (not kinds or r["event"] in kinds)]

    def log_tail(self, lines: int = 30, since_start: bool = False) -> str:
        if not self.log_path.exists():
            return "(no log)"
        text = self._text(since_start).splitlines()
        keep = [ln for ln in text if "cygrpc" not in ln]
        return "\n".join(keep[-lines:])


@dataclass
class PlannerSet:
    """Planners of one cluster (same etcd endpoints, prefix and partition count)."""

    base_dir: Path
    endpoints: Sequence[str]
    prefix: str
    partitions: int = 32
    settings: Mapping[str, str] = field(default_factory=lambda: dict(FAST))
    planners: dict[str, PlannerProcess] = field(default_factory=dict)
    # argv put in front of a node's command (chaos/netns.py `prefix(node)`: run it inside the node's network
    # namespace); None: run here. The pid stays the planner's own (`ip netns exec` execs).
    prefix_for: Callable[[str], Sequence[str]] | None = None

    def __post_init__(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)

    def start(
        self,
        node_id: str,
        *,
        settings: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        log_level: str = "info",
    ) -> PlannerProcess:
        """Start planner `node_id` with the set's settings overridden by `settings` (setting name ->
        flag value). A node id used before gets a fresh process and log file."""
        merged = {**self.settings, **(settings or {})}
        argv = [
            *(self.prefix_for(node_id) if self.prefix_for is not None else ()),
            schedctl_binary(), "planner",
            "--node-id", node_id,
            "--etcd-endpoints", ",".join(self.endpoints),
            "--etcd-prefix", self.prefix,
            "--partitions", str(self.partitions),
            "--log-level", log_level,
        ]
        for k, v in merged.items():
            argv += ["--" + k.replace("_", "-"), v]
        run_env = {k: v for k, v in os.environ.items() if not k.startswith("SCHED_")}
        run_env.update(env or {})
        old = self.planners.get(node_id)
        if old is not None and old.running:
            raise RuntimeError(f"planner {node_id} is already running (pid {old.pid})")
        n = sum(1 for p in self.base_dir.glob(f"{node_id}.*.log"))
        proc = PlannerProcess(node_id, argv, run_env, self.base_dir / f"{node_id}.{n}.log")
        self.planners[node_id] = proc
        return proc.start()

    def start_serving(
        self,
        node_id: str,
        *,
        settings: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        log_level: str = "info",
        timeout: float = START_TIMEOUT,
    ) -> tuple[PlannerProcess, str]:
        """`start()`, then block until it serves; returns it and its API address. With `api_port`
        0 (the default) the port is its own choice; a fixed one (a planner coming back on the
        address its workers dial) may be held by someone else for a moment: the start is retried
        after a pause, a bounded number of times."""
        for attempt in range(1, BIND_ATTEMPTS + 1):
            proc = self.start(node_id, settings=settings, env=env, log_level=log_level)
            try:
                return proc, proc.wait_serving(timeout)
            except PlannerPortInUse:
                proc.kill()
                if attempt == BIND_ATTEMPTS:
                    raise
                time.sleep(0.5 * attempt)
        raise AssertionError("unreachable")

    async def serve(
        self,
        node_id: str,
        *,
        settings: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        log_level: str = "info",
        timeout: float = START_TIMEOUT,
    ) -> tuple[PlannerProcess, str]:
        """`start_serving()` without blocking the event loop."""
        for attempt in range(1, BIND_ATTEMPTS + 1):
            proc = self.start(node_id, settings=settings, env=env, log_level=log_level)
            try:
                return proc, await proc.serving(timeout)
            except PlannerPortInUse:
                proc.kill()
                if attempt == BIND_ATTEMPTS:
                    raise
                await asyncio.sleep(0.5 * attempt)
        raise AssertionError("unreachable")

    def running(self) -> list[PlannerProcess]:
        return [p for p in self.planners.values() if p.running]

    def running_ids(self) -> set[str]:
        return {p.node_id for p in self.planners.values() if p.running and not p.paused}

    def __getitem__(self, node_id: str) -> PlannerProcess:
        return self.planners[node_id]

    def close(self) -> None:
        """SIGKILL every planner still running (paused ones included). Safe to call twice."""
        for p in self.planners.values():
            p.kill()

    def stop_all(self, timeout: float = 15.0) -> None:
        """SIGTERM every running planner and wait (graceful: they drain)."""
        for p in self.planners.values():
            if p.running:
                p.terminate(timeout)

    def logs(self, lines: int = 15) -> str:
        """The tails of every planner's log, for assertion messages."""
        parts = []
        for p in self.planners.values():
            state = "paused" if p.paused else ("running" if p.running else f"exited {p.returncode}")
            parts.append(f"--- {p.node_id} (pid {p.process.pid if p.process else '-'}, {state}) {p.log_path}\n"
                         f"{p.log_tail(lines)}")
        return "\n".join(parts)


# ---- watching what planners do, from etcd ---------------------------------------------------------


class OwnersView:
    """partition -> owner node, as etcd has it, kept current by a watch on the owners/ prefix.

    `wait_for(pred)` returns the local monotonic time of the watch batch after which `pred` first
    held, so drills can measure handovers without polling. Predicates are checked after every
    batch, in the watch task itself, so a slow test task does not blur the measurement.
    """

    def __init__(self, kv: KV, ks: Keyspace) -> None:
        self._kv = kv
        self._ks = ks
        self.owners: dict[int, str] = {}
        self.revision = 0
        self.batches = 0
        self._waiters: list[tuple[Callable[[dict[int, str]], bool], asyncio.Future[float]]] = []
        self._task: asyncio.Task[None] | None = None
        self._synced = asyncio.Event()

    async def __aenter__(self) -> OwnersView:
        self._task = asyncio.create_task(self._run())
        await asyncio.wait_for(self._synced.wait(), 30)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _apply_kv(self, key: bytes, value: bytes | None) -> None:
        p = self._ks.partition_of(key)
        if value is None:
            self.owners.pop(p, None)
        else:
            self.owners[p] = str(json.loads(value)["node"])

    def _check_waiters(self) -> None:
        now = time.monotonic()
        for pred, fut in list(self._waiters):
            if not fut.done() and pred(self.owners):
                fut.set_result(now)
        self._waiters = [(p, f) for p, f in self._waiters if not f.done()]

    async def _run(self) -> None:
        while True:
            try:
                r = await self._kv.range(self._ks.owners, prefix=True, timeout=2.0)
                self.owners = {}
                for kv in r.kvs:
                    self._apply_kv(kv.key, kv.value)
                self.revision = r.revision
                self._synced.set()
                self._check_waiters()
                watch = self._kv.watch(self._ks.owners, prefix=True, start_revision=r.revision + 1)
                try:
                    async for batch in watch:
                        for ev in batch.events:
                            self._apply_kv(ev.kv.key, ev.kv.value if ev.type is EventType.PUT else None)
                            self.revision = ev.revision
                        self.batches += 1
                        self._check_waiters()
                finally:
                    await watch.close()
            except EtcdError:
                await asyncio.sleep(0.2)  # etcd down (drills kill it); the watch resumes by itself otherwise

    async def wait_for(self, pred: Callable[[dict[int, str]], bool], timeout: float, what: str) -> float:
        """Wait until `pred(owners)` holds; return the monotonic time it first did (from the watch)."""
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        if pred(self.owners):
            return time.monotonic()
        self._waiters.append((pred, fut))
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}; owners now: "
                                 f"{describe(self.owners)}") from None

    def counts(self) -> dict[str, int]:
        return dict(Counter(self.owners.values()))

    async def read(self) -> tuple[dict[int, str], int]:
        """partition -> owner as etcd has it now, and the revision read, straight from etcd. The watch
        behind `owners` may still be a batch behind: a drill that pairs the owners with another
        observation made just before (a log offset) needs the owners no older than that."""
        r = await self._kv.range(self._ks.owners, prefix=True, timeout=2.0)
        return {self._ks.partition_of(kv.key): str(json.loads(kv.value)["node"]) for kv in r.kvs}, r.revision


def describe(owners: Mapping[int, str]) -> str:
    c = Counter(owners.values())
    return f"{len(owners)} owned, " + ", ".join(f"{n}={k}" for n, k in sorted(c.items())) if c else "none owned"


def balanced(partitions: int, nodes: Iterable[str]) -> Callable[[dict[int, str]], bool]:
    """Every partition owned, only by `nodes`, each within +-1 of partitions / len(nodes)."""
    want = frozenset(nodes)

    def pred(owners: dict[int, str]) -> bool:
        if len(owners) != partitions or set(owners.values()) - want:
            return False
        c = Counter(owners.values())
        return all(abs(c.get(n, 0) - partitions / len(want)) <= 1 for n in want)

    return pred


def all_owned_by(partitions: int, nodes: Iterable[str]) -> Callable[[dict[int, str]], bool]:
    """Every partition owned, and only by `nodes` (no balance required)."""
    want = frozenset(nodes)
    return lambda owners: len(owners) == partitions and set(owners.values()) <= want


def none_owned_by(node: str) -> Callable[[dict[int, str]], bool]:
    return lambda owners: node not in owners.values()


async def watermarks(kv: KV, ks: Keyspace) -> dict[int, int]:
    r = await kv.range(ks.checkpoints, prefix=True, timeout=2.0)
    return {ks.partition_of(x.key): int(json.loads(x.value)["watermark_ms"]) for x in r.kvs}


async def wait_checkpoints_advance(kv: KV, ks: Keyspace, partitions: int | Iterable[int], timeout: float) -> float:
    """Wait until the checkpoint of every partition (of `range(partitions)`, or those listed) moved past
    where it is now; return the seconds taken."""
    wanted = list(range(partitions)) if isinstance(partitions, int) else list(partitions)
    t0 = time.monotonic()
    deadline = t0 + timeout
    before: dict[int, int] | None = None
    while True:
        try:
            if before is None:
                before = await watermarks(kv, ks)
            now = await watermarks(kv, ks)
            stuck = sorted(p for p in wanted if now.get(p, 0) <= before.get(p, 0))
            if not stuck:
                return time.monotonic() - t0
        except EtcdError:
            stuck = []
        if time.monotonic() > deadline:
            raise AssertionError(f"checkpoints did not advance within {timeout:.1f}s; stuck partitions: {stuck}")
        await asyncio.sleep(0.1)
