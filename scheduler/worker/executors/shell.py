"""The `shell` executor: run `/bin/sh -c <command>` with a timeout, in its own process group.

Payload (JSON): {"command": "pg_dump ... > /backups/x", "timeout_s": 30, "env": {"PGHOST": "db"}}

Exit codes (docs/workers.md): 0 success; 75 (EX_TEMPFAIL) transient; 64-78 other than 75 (sysexits:
usage, data, config... errors) permanent; anything else unknown; killed by the timeout: timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

from scheduler.pdeathsig import group_dies_with_parent
from scheduler.worker.context import OUTPUT_TAIL_BYTES, ExecutionContext, ExecutorOutput, stopped_first, tail
from scheduler.worker.errors import PermanentError, TaskTimeout, TransientError
from scheduler.worker.executors import payload as pl

EX_TEMPFAIL = 75
SYSEXITS = range(64, 79)  # EX_USAGE .. EX_CONFIG
_FIELDS = frozenset({"command", "timeout_s", "env"})
_TAIL_BYTES = 2048


class CommandFailed(Exception):
    """A non-zero exit outside the sysexits range: the worker cannot tell why (ERROR_CLASS_UNKNOWN)."""


def command_env(ctx: ExecutionContext, extra: dict[str, str], base: dict[str, str]) -> dict[str, str]:
    """The worker's environment without its own SCHED_* settings, the payload's `env`, then the
    execution's identity, which the payload cannot override."""
    env = {k: v for k, v in base.items() if not k.startswith("SCHED_")}
    env.update(extra)
    env.update({
        "SCHED_EXECUTION_ID": ctx.execution_id,
        "SCHED_SCHEDULE_ID": ctx.schedule_id,
        "SCHED_PLANNED_AT": ctx.planned_at_rfc3339,
        "SCHED_ATTEMPT": str(ctx.attempt),
        "SCHED_FENCING_TOKEN": str(ctx.fencing_token),
    })
    return env


class _Tail:
    """Keeps the last bytes of the command's output for the error message (both streams, in arrival
    order), and of each stream for the attempt record, however much it prints."""

    def __init__(self) -> None:
        self.data = b""
        self.streams = [b"", b""]  # stdout, stderr

    async def pump(self, stream: asyncio.StreamReader, which: int) -> None:
        while chunk := await stream.read(65536):
            self.data = (self.data + chunk)[-_TAIL_BYTES:]
            self.streams[which] = (self.streams[which] + chunk)[-OUTPUT_TAIL_BYTES:]

    def output(self, code: int | None) -> ExecutorOutput:
        return ExecutorOutput(tail(self.streams[0]), tail(self.streams[1]), code)

    def text(self) -> str:
        out = self.data.decode(errors="replace").strip()
        return f"; output: {out}" if out else ""


class ShellExecutor:
    def __init__(self, kill_grace: float = 2.0, shell: str = "/bin/sh") -> None:
        self.kill_grace = kill_grace
        self.shell = shell

    async def __call__(self, ctx: ExecutionContext, payload: bytes) -> None:
        data = pl.json_object(payload, _FIELDS)
        command = pl.required_str(data, "command")
        env = command_env(ctx, pl.str_map(data, "env"), dict(os.environ))
        limit = pl.min_timeout(pl.timeout_s(data), ctx.remaining())
        # Our own pipe rather than asyncio's: asyncio's Process.wait() also waits for its pipes to close,
        # which a background child (`cmd &`) holding the output open would delay indefinitely.
        # One pipe per stream: their tails are kept apart on the attempt (`exec get` shows them).
        pipes: list[tuple[int, asyncio.StreamReader, asyncio.BaseTransport]] = []
        try:
            for _ in range(2):
                pipes.append(await _pipe())
        except BaseException:
            for wfd, _, transport in pipes:
                os.close(wfd)
                transport.close()
            raise
        (out_fd, out, out_t), (err_fd, err, err_t) = pipes
        # Its own process group, so a timeout kills the children too, led by a guard that takes the group
        # down if this worker dies (scheduler/pdeathsig.py: a SIGKILLed worker left commands running).
        argv = group_dies_with_parent([self.shell, "-c", command], self.kill_grace)
        spawn = asyncio.ensure_future(asyncio.create_subprocess_exec(
            *argv, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=out_fd, stderr=err_fd, start_new_session=True,
        ))
        try:
            # Shielded: cancelled mid-spawn, the command may already run and fork; asyncio would then
            # kill only the shell. Let the spawn finish and kill the whole group.
            proc = await asyncio.shield(spawn)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await self._kill_group(await spawn)
            out_t.close()
            err_t.close()
            raise
        except BaseException:
            out_t.close()
            err_t.close()
            raise
        finally:
            os.close(out_fd)
            os.close(err_fd)
        tail = _Tail()
        readers = asyncio.gather(tail.pump(out, 0), tail.pump(err, 1))
        try:
            if await stopped_first(ctx, asyncio.ensure_future(proc.wait()), limit):
                # A Cancel (or an orphaned attempt's stop): the group gets SIGTERM now, SIGKILL after
                # `kill_grace`, as docs/workers.md says, not only when the worker cancels this task
                # `cancel_grace` later. Until then a `cancel_other` schedule's next run waited for the
                # cancelled command to finish on its own: a game day saw them 2-4 s late, every run.
                # The stop decides the attempt's outcome (CANCELLED), whatever the exit code says.
                await asyncio.shield(self._kill_group(proc))
        except TimeoutError:
            await asyncio.shield(self._kill_group(proc))
            raise TaskTimeout(f"command killed after its {limit:g} s timeout{tail.text()}") from None
        except asyncio.CancelledError:  # Cancel from the planner, the worker's deadline, or drain
            # Shielded: a second cancellation (the worker closing) must not leave the group running.
            await asyncio.shield(self._kill_group(proc))
            raise
        finally:
            # The shell has exited; read what is already in the pipes, but do not wait for a background
            # child that keeps them open.
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(readers), 0.1)
            readers.cancel()
            with contextlib.suppress(BaseException):
                await readers
            out_t.close()
            err_t.close()
            ctx.output = tail.output(proc.returncode)  # kept on the attempt whatever the outcome
        self._check(proc.returncode, tail)

    @staticmethod
    def _check(code: int | None, tail: _Tail) -> None:
        if code == 0:
            return
        if code == EX_TEMPFAIL:
            raise TransientError(f"exit code {code} (EX_TEMPFAIL){tail.text()}")
        if code is not None and code in SYSEXITS:
            raise PermanentError(f"exit code {code}{tail.text()}")
        if code is not None and code < 0:
            raise CommandFailed(f"killed by signal {signal.Signals(-code).name}{tail.text()}")
        raise CommandFailed(f"exit code {code}{tail.text()}")

    async def _kill_group(self, proc: asyncio.subprocess.Process) -> None:
        """SIGTERM the whole group, give it `kill_grace` to exit, then SIGKILL whatever is left."""
        pgid = proc.pid  # start_new_session: the shell leads its own group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        loop = asyncio.get_running_loop()
        until = loop.time() + self.kill_grace
        # Polling: nothing signals when the last process of a group (grandchildren included) is gone.
        while loop.time() < until and _group_alive(pgid):  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            await proc.wait()
        until = loop.time() + 1.0  # SIGKILL is not instant under load: return once the group is gone
        while loop.time() < until and _group_alive(pgid):  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def _pipe() -> tuple[int, asyncio.StreamReader, asyncio.BaseTransport]:
    """A pipe whose read end is an asyncio stream: (write fd for the child, reader, its transport)."""
    rfd, wfd = os.pipe()
    stream = asyncio.StreamReader()
    try:
        transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(stream), os.fdopen(rfd, "rb", buffering=0))
    except BaseException:
        os.close(wfd)
        raise
    return wfd, stream, transport


_PROC = Path("/proc")


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs. On Linux, zombies do not count: an orphaned
    grandchild stays a zombie until init reaps it, and a container's init may never do so."""
    if not (_PROC / "self" / "stat").exists():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for stat in _PROC.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
