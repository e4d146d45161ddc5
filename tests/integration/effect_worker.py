"""A worker process for the engine drills: its handler appends the execution id to an effects file
outside the system (O_APPEND, one write per line), so the test can count real side effects.

    python tests/integration/effect_worker.py --id w1 --planners 127.0.0.1:7001,127.0.0.1:7002 --effects FILE

Task type `effect` does what its payload (JSON, optional) says, so one process serves several tests:
- `{"hold_s": 3, "hold_attempts": 1}`: before finishing, sleep 3 s on attempts <= hold_attempts (a
  long task to kill or drain the worker under); every start is logged to `--starts` first;
- `{"fail": "transient" | "permanent" | "unknown", "fail_attempts": 2}`: raise the SDK's
  TransientError / PermanentError / a plain exception on attempts <= fail_attempts (default: all).
An empty payload (the main drill) just records the effect. `--times FILE` logs `<id> <attempt> <wall ms>`
at every handler start, by this worker's (unskewed) clock: when each run really started. Effect lines
are `<id> <attempt> <worker>`, written only when the handler succeeds. The built-in `shell` and `http`
executors are registered too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time

from scheduler import logs
from scheduler.worker import ExecutionContext, PermanentError, TransientError, Worker, WorkerSettings
from scheduler.worker.executors import register_builtin


async def main(args: argparse.Namespace) -> None:
    settings = WorkerSettings(
        worker_id=args.id, pool="pool", region=args.region, planners=tuple(args.planners.split(",")),
        concurrency=args.concurrency, discovery_interval=2.0, keepalive_time=1.0, result_ack_timeout=2.0,
        drain_grace=args.drain_grace, allow_shell=True,  # the API contract tests run shell schedules
    )
    worker = Worker(settings=settings)
    register_builtin(worker, settings)
    fd = os.open(args.effects, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    starts = os.open(args.starts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if args.starts else None
    times = os.open(args.times, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if args.times else None

    @worker.task("effect")
    async def effect(ctx: ExecutionContext, payload: bytes) -> None:
        if times is not None:
            os.write(times, f"{ctx.execution_id} {ctx.attempt} {time.time_ns() // 1_000_000}\n".encode())
        spec = json.loads(payload) if payload else {}
        if starts is not None:
            os.write(starts, f"{ctx.execution_id} {ctx.attempt} {args.id}\n".encode())
        if ctx.attempt <= spec.get("hold_attempts", 1_000_000):
            await asyncio.sleep(float(spec.get("hold_s", 0)))
        fail = spec.get("fail")
        if fail and ctx.attempt <= spec.get("fail_attempts", 1_000_000):
            if fail == "transient":
                raise TransientError(f"transient failure on attempt {ctx.attempt}")
            if fail == "permanent":
                raise PermanentError(f"permanent failure on attempt {ctx.attempt}")
            raise RuntimeError(f"unclassified failure on attempt {ctx.attempt}")
        os.write(fd, f"{ctx.execution_id} {ctx.attempt} {args.id}\n".encode())

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    run = asyncio.create_task(worker.run())
    await stop.wait()
    await worker.drain(args.drain_grace, reason="SIGTERM")
    await worker.close()
    run.cancel()
    await asyncio.gather(run, return_exceptions=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--id", required=True)
    ap.add_argument("--planners", required=True)
    ap.add_argument("--effects", required=True)
    ap.add_argument("--starts", default="", help="also log every handler start here")
    ap.add_argument("--times", default="", help="also log every handler start with its wall time (ms) here")
    ap.add_argument("--region", default="default", help="the worker's region (worker affinity, docs/operations.md)")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--drain-grace", type=float, default=5.0)
    logs.setup("info")
    asyncio.run(main(ap.parse_args()))
