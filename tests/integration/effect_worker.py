"""A worker process for the engine drills: its handler appends the execution id to an effects file
outside the system (O_APPEND, one write per line), so the test can count real side effects.

    python tests/integration/effect_worker.py --id w1 --planners 127.0.0.1:7001,127.0.0.1:7002 --effects FILE
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal

from scheduler import logs
from scheduler.worker import ExecutionContext, Worker, WorkerSettings


async def main(args: argparse.Namespace) -> None:
    settings = WorkerSettings(
        worker_id=args.id, pool="pool", region="default", planners=tuple(args.planners.split(",")),
        concurrency=args.concurrency, discovery_interval=2.0, keepalive_time=1.0, result_ack_timeout=2.0,
        drain_grace=5.0,
    )
    worker = Worker(settings=settings)
    fd = os.open(args.effects, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @worker.task("effect")
    async def effect(ctx: ExecutionContext, payload: bytes) -> None:
        os.write(fd, f"{ctx.execution_id} {ctx.attempt} {args.id}\n".encode())

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    run = asyncio.create_task(worker.run())
    await stop.wait()
    await worker.drain(5.0, reason="test over")
    await worker.close()
    run.cancel()
    await asyncio.gather(run, return_exceptions=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--id", required=True)
    ap.add_argument("--planners", required=True)
    ap.add_argument("--effects", required=True)
    ap.add_argument("--concurrency", type=int, default=64)
    logs.setup("info")
    asyncio.run(main(ap.parse_args()))
