"""Fault commands: how `drill observe` makes a scenario's faults on a cluster the harness did not start.

A staging scenario names, per fault type, the command that makes the fault and (optionally) the one
that heals it, plus one health command (`[faults.commands]`, docs/drills.md "Against a staging
cluster"). The observer runs the plan's fault schedule with them, as the local runner does with its
nemeses: at each fault's earliest start it waits for health, runs the inject command, opens the window
when that returned 0, holds for the duration, runs the heal command (none: the fault heals on its own,
as a deleted pod is restarted by its controller), and records when the health command exits 0 again.
Windows go to faults.jsonl exactly as the local runner writes them; every command run, with its exit
and the tail of its output, goes to commands.jsonl.

No shell: a command line is split with shlex *before* its placeholders are filled in, and run with
exec, so a target or a variable holding `; rm -rf ~` is one argument, never a second command. A line
that needs a pipe says so itself (`sh -c '...'`), and then what it substitutes inside the quoted line
is shell text: it is the scenario's author's line. Each command runs in its own session, bounded by a
timeout; on timeout (or when the drill is cut short) its whole process group is killed.

A command that fails (non-zero exit, timeout, cannot start) is an error of the run (`command_errors` in
run.json): the run is invalid, never passed, and the report gives the command and its stderr's tail.
After a failure the observer makes no further fault: the cluster's state is no longer known.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from chaos.record import FaultRecord, RunWriter
from chaos.scenario import FaultCommands, Scenario, ScenarioError
from scheduler.clock import SYSTEM_CLOCK

if TYPE_CHECKING:  # chaos.plan imports this module to validate a plan's commands
    from chaos.plan import FaultWindow, Plan

__all__ = ["CommandFaults", "CommandResult", "Rendered", "describe", "render", "run_command"]

TAIL_LINES = 5  # of a failed command's stderr, in the run's errors (the whole output is in commands.jsonl)
TAIL_CHARS = 400
LOG_CHARS = 4000  # of each stream kept in commands.jsonl


@dataclass(frozen=True)
class Rendered:
    """A fault's commands with its placeholders filled in: argv, ready for exec."""

    inject: tuple[str, ...]
    heal: tuple[str, ...] | None
    timeout_s: float


def _commands(s: Scenario) -> FaultCommands:
    if s.faults.commands is None:
        raise ScenarioError("faults.commands", "the scenario names no fault commands", s.source)
    return s.faults.commands


def _fill(text: str, values: Mapping[str, str], where: str, w: FaultWindow, s: Scenario) -> tuple[str, ...]:
    out = []
    for arg in shlex.split(text):  # split first: a value is never re-split or re-parsed
        try:
            out.append(arg.format_map(values))
        except KeyError as e:
            raise ScenarioError(f"faults.commands.targets.{w.target}",
                                f"has no {e.args[0]!r}, which {where} uses (fault #{w.index} {w.type})",
                                s.source) from None
    return tuple(out)


def render(s: Scenario, w: FaultWindow) -> Rendered:
    """The commands that make and heal `w` (ScenarioError naming the field when they cannot be filled in)."""
    cmds = _commands(s)
    fc = cmds.per_type.get(w.type)
    if fc is None:
        raise ScenarioError(f"faults.commands.{w.type}", f"no command makes fault #{w.index} {w.type} (the "
                            "observer never uses a local nemesis)", s.source)
    target = cmds.targets.get(w.target)
    values = {**(target.vars if target is not None else {}), "target": w.target, "type": w.type,
              "index": str(w.index), "role": w.role, "duration_s": f"{w.duration_s:g}",
              "duration_ms": str(round(w.duration_s * 1000))}
    where = f"faults.commands.{w.type}"
    inject = _fill(fc.inject, values, f"{where}.inject", w, s)
    heal = None if fc.heal is None else _fill(fc.heal, values, f"{where}.heal", w, s)
    return Rendered(inject, heal, fc.timeout_s if fc.timeout_s is not None else cmds.timeout_s)


def health_argv(s: Scenario) -> tuple[str, ...] | None:
    h = _commands(s).health
    return None if h is None else tuple(a.format_map({}) for a in shlex.split(h))  # `{{` -> `{`


def describe(s: Scenario, plan: Plan, limit: int | None = None) -> list[str]:
    """What the observer would run, line by line (`drill plan`, `drill observe --dry-run`)."""
    cmds = _commands(s)
    h = health_argv(s)
    lines = [f"fault commands (exec, no shell; each bounded by {cmds.timeout_s:g} s unless its type says):",
             f"  health: {shlex.join(h)}  (every {cmds.health_interval_s:g} s until 0, at most "
             f"health_timeout_s {s.faults.health_timeout_s:g} s)" if h is not None
             else "  health: none (healthy as soon as the heal returned)"]
    for w in plan.faults[:limit]:
        r = render(s, w)
        lines += [f"  #{w.index:<3} {w.type:<4} at {w.start_s:>7.1f}s for {w.duration_s:>5.1f}s on {w.target}",
                  f"        inject: {shlex.join(r.inject)}",
                  f"        heal:   {shlex.join(r.heal)}" if r.heal is not None else
                  "        heal:   none (heals on its own; the window ends with its duration)"]
    return lines


# ---- running one command ------------------------------------------------------------------------


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    rc: int | None  # None: it never exited on its own (timed out, or could not start)
    t_start_ms: int
    t_end_ms: int
    stdout: str = ""
    stderr: str = ""
    error: str = ""  # why there is no exit code

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.error

    def why(self) -> str:
        """The failure, with the tail of its stderr: what goes into the report."""
        head = self.error or f"exited {self.rc}"
        tail = " | ".join(self.stderr.strip().splitlines()[-TAIL_LINES:])[-TAIL_CHARS:]
        return f"{head}; stderr: {tail}" if tail else f"{head}; no stderr"

    def to_json(self) -> dict[str, Any]:
        return {"argv": list(self.argv), "rc": self.rc, "error": self.error, "t_start_ms": self.t_start_ms,
                "t_end_ms": self.t_end_ms, "stdout": self.stdout[-LOG_CHARS:], "stderr": self.stderr[-LOG_CHARS:]}


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    # The command runs in its own session: its group is what it started (a wrapper's children too),
    # and nothing else.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def run_command(argv: tuple[str, ...], timeout_s: float) -> CommandResult:
    t0 = SYSTEM_CLOCK.wall_ms()
    try:
        proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                    start_new_session=True)
    except OSError as e:
        return CommandResult(argv, None, t0, SYSTEM_CLOCK.wall_ms(), error=f"cannot start: {e.strerror or e}")
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        _kill_group(proc)
        await proc.wait()
        return CommandResult(argv, None, t0, SYSTEM_CLOCK.wall_ms(), error=f"timed out after {timeout_s:g} s (killed)")
    except asyncio.CancelledError:  # the drill was cut short: leave nothing running behind it
        _kill_group(proc)
        with contextlib.suppress(Exception):
            await asyncio.shield(proc.wait())
        raise
    return CommandResult(argv, proc.returncode, t0, SYSTEM_CLOCK.wall_ms(), out.decode(errors="replace"),
                         err.decode(errors="replace"))


# ---- the fault schedule -----------------------------------------------------------------------------


class CommandFaults:
    """Makes a plan's faults with the scenario's commands, recording windows in faults.jsonl (through
    `rec`) and every command in commands.jsonl. `errors` collects the failures (run.json
    `command_errors`: each one makes the run invalid)."""

    def __init__(self, s: Scenario, plan: Plan, rec: RunWriter, say: Callable[[str], None] | None = None) -> None:
        self.s, self.plan, self.rec = s, plan, rec
        self.cmds = _commands(s)
        self.say = say or (lambda _m: None)
        self.errors: list[str] = []
        self._log = (rec.directory / "commands.jsonl").open("a", buffering=1)

    def close(self) -> None:
        self._log.close()

    def _logged(self, w: FaultWindow | None, phase: str, r: CommandResult, attempts: int = 1) -> CommandResult:
        row = {"index": None if w is None else w.index, "type": None if w is None else w.type,
               "target": None if w is None else w.target, "phase": phase, "attempts": attempts, **r.to_json()}
        self._log.write(json.dumps(row, separators=(",", ":")) + "\n")
        return r

    def _fail(self, w: FaultWindow, phase: str, r: CommandResult) -> None:
        msg = f"fault #{w.index} {w.type} on {w.target}: {phase} command `{shlex.join(r.argv)}` {r.why()}"
        self.errors.append(msg)
        self.say(f"  {msg}")

    async def run(self, start_ms: int) -> None:
        """The plan's faults one at a time, from the window's start `start_ms`. Stops at the first failure."""
        for w in self.plan.faults:
            delay = (start_ms + w.start_s * 1000 - SYSTEM_CLOCK.wall_ms()) / 1000
            if delay > 0:
                await asyncio.sleep(delay)
            if await self._health(w, "health before") is None:
                # Nothing is injected into a sick cluster, and nothing after it (as the local runner).
                self.errors.append(f"fault #{w.index} {w.type} on {w.target} not made: the cluster was not "
                                   f"healthy before it within {self.s.faults.health_timeout_s:g} s")
                return
            if not await self._one(w):
                return

    async def _health(self, w: FaultWindow, phase: str) -> int | None:
        """When the health command first exited 0 (epoch ms), trying every health_interval_s up to
        faults.health_timeout_s; None if it never did. No health command: healthy now."""
        argv = health_argv(self.s)
        if argv is None:
            return SYSTEM_CLOCK.wall_ms()
        deadline = time.monotonic() + self.s.faults.health_timeout_s
        attempts = 0
        last: CommandResult | None = None
        try:
            while True:
                left = deadline - time.monotonic()
                r = await run_command(argv, max(0.1, min(self.cmds.timeout_s, left)))
                attempts += 1
                if r.ok:
                    self._logged(w, phase, r, attempts)
                    return r.t_end_ms
                if last is None:  # once per wait: the operator sees why it is waiting
                    self.say(f"  fault #{w.index} {phase}: not yet ({r.why()})")
                last = r
                if time.monotonic() + self.cmds.health_interval_s > deadline:
                    self._logged(w, phase, r, attempts)  # only the last try: a health loop is many lines otherwise
                    self._fail(w, phase, r)
                    return None
                await asyncio.sleep(self.cmds.health_interval_s)
        except asyncio.CancelledError:
            if last is not None:  # the window closed while it waited: what it was waiting on is kept
                self._logged(w, f"{phase} (cut short)", last, attempts)
            raise

    async def _heal(self, w: FaultWindow, cmd: Rendered) -> int | None:
        """When the heal took effect (its command returned 0; none: now, the fault heals on its own)."""
        if cmd.heal is None:
            return SYSTEM_CLOCK.wall_ms()
        r = self._logged(w, "heal", await run_command(cmd.heal, cmd.timeout_s))
        if not r.ok:
            self._fail(w, "heal", r)
            return None
        return r.t_end_ms

    def _record(self, w: FaultWindow, start: int, end: int | None, healthy: int | None, note: str) -> None:
        self.rec.fault(FaultRecord(w.index, w.type, w.target, start, end, dict(w.params), w.role, w.name, healthy,
                                   note))

    async def _one(self, w: FaultWindow) -> bool:
        cmd = render(self.s, w)
        r = self._logged(w, "inject", await run_command(cmd.inject, cmd.timeout_s))
        if not r.ok:
            self._fail(w, "inject", r)
            # It may have been half made: the window covers it from the command's start (lag there is
            # judged as a fault's, not as steady state), healed at once where a heal command can.
            healed = await self._heal(w, cmd)
            why = f"inject failed: {r.why()}"
            self._record(w, r.t_start_ms, healed, None, why)
            if healed is not None:
                self._record(w, r.t_start_ms, healed, await self._health(w, "health after"), why)
            return False
        start = r.t_end_ms  # the command returned 0: the fault has taken hold
        note = f"made by `{shlex.join(cmd.inject)}`"
        self.say(f"fault #{w.index} {w.type} ({w.name}) on {w.target} for {w.duration_s:g} s: {note}")
        self._record(w, start, None, None, note)  # an open window until healed (a killed observer shows it)
        end: int | None = None
        try:
            await asyncio.sleep(w.duration_s)
        finally:
            # Healed even when the window closes under it (the observer cancels this task at its end).
            end = await self._heal(w, cmd)
            self._record(w, start, end, None, note)
        if end is None:
            return False
        healthy = await self._health(w, "health after")
        # Written again with its health time: the reader keeps the last line per index.
        self._record(w, start, end, healthy, note)
        self.say(f"  healed; healthy again after {(healthy - end) / 1000:.1f} s" if healthy is not None
                 else "  never healthy again")
        return healthy is not None
