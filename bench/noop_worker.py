"""Worker process for bench_e2e.py: a no-op handler that records start lag (worker start time minus
planned time) and writes its tallies as JSON when it gets SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from pathlib import Path

from scheduler import eventloop, logs
from scheduler.clock import SYSTEM_CLOCK
from scheduler.loop_lag import tune_collector
from scheduler.timeplan.plan import to_ms
from scheduler.worker import ExecutionContext, Worker, WorkerSettings


async def main(args: argparse.Namespace) -> None:
    worker = Worker(settings=WorkerSettings(worker_id=args.id, pool="bench", planners=tuple(args.planners.split(",")),
                                            concurrency=args.concurrency, discovery_interval=5.0,
                                            tls_ca_file=args.tls_ca_file, tls_cert_file=args.tls_cert_file,
                                            tls_key_file=args.tls_key_file))
    lags: list[tuple[int, int]] = []  # (planned ms, lag ms)

    @worker.task("noop")
    async def noop(ctx: ExecutionContext, payload: bytes) -> None:
        planned = to_ms(ctx.planned_at)
        lags.append((planned, SYSTEM_CLOCK.wall_ms() - planned))

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    run = asyncio.create_task(worker.run())
    await stop.wait()
    await asyncio.to_thread(Path(args.out).write_text, json.dumps(lags))
    await worker.close()
    # For the logs a benchmark keeps: results sent again (overdue answers, broken streams) and starts asked of
    # another planner, over the whole run.
    print(json.dumps({"worker": args.id, "results_resent": worker.outbox.resent,
                      "starts_asked_again": worker.starts.asked_again}), flush=True)
    run.cancel()
    await asyncio.gather(run, return_exceptions=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--id", required=True)
    ap.add_argument("--planners", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--concurrency", type=int, default=512)
    ap.add_argument("--tls-ca-file", default=None)  # bench_e2e --secure: mutual TLS to the planners
    ap.add_argument("--tls-cert-file", default=None)
    ap.add_argument("--tls-key-file", default=None)
    ap.add_argument("--event-loop", default="asyncio", choices=eventloop.LOOPS)
    ap.add_argument("--gc-threshold", type=int, default=WorkerSettings().gc_threshold)  # as `schedctl worker`
    logs.setup("warning")
    a = ap.parse_args()
    tune_collector(a.gc_threshold)
    eventloop.run(main(a), a.event_loop)
