"""`schedctl worker`: run one worker with the built-in `shell` and `http` executors until SIGTERM/SIGINT
(then drain: hand back unstarted work, let running attempts finish within the grace, report the rest)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
from typing import TYPE_CHECKING

from scheduler import eventloop, logs
from scheduler.cli.output import Exit, fail_invalid
from scheduler.cli.planner import add_settings_flags, serve_metrics
from scheduler.config import parse_listen_address
from scheduler.errors import InvalidArgument
from scheduler.worker.settings import WorkerSettings

if TYPE_CHECKING:
    from scheduler.worker.health import HealthServer

log = logging.getLogger("scheduler.cli.worker")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "worker", help="run one worker process (built-in shell and http executors)",
        description="Run one worker with the built-in `shell` and `http` executors (docs/workers.md). "
                    "Settings: flags, then SCHED_* variables, then --config. SIGTERM drains it.")
    p.add_argument("--config", metavar="FILE", help="TOML file with settings (flat keys, as the flag names)")
    add_settings_flags(p, WorkerSettings)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    flags = vars(args)
    try:
        settings = WorkerSettings.load({f.name: flags[f.name] for f in dataclasses.fields(WorkerSettings)},
                                       toml_file=args.config)
    except InvalidArgument as e:
        return fail_invalid(e)
    logs.setup(settings.log_level)
    from scheduler.loop_lag import tune_collector

    tune_collector(settings.gc_threshold)
    try:
        return eventloop.run(_main(settings), settings.event_loop)
    except InvalidArgument as e:  # found only when acting on it (an address already in use)
        return fail_invalid(e)


async def _main(settings: WorkerSettings) -> int:
    from scheduler.worker import Worker  # the SDK, loaded when a worker runs (cli/planner.py says why)
    from scheduler.worker.executors import register_builtin

    worker = Worker(settings=settings)
    metrics = await serve_metrics(worker.metrics.registry, settings.metrics_address)  # first: fails fast
    health = await serve_health(settings.health_address)
    register_builtin(worker, settings)
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task[None]] = []

    def on_signal(sig: signal.Signals) -> None:
        if not stopping:
            stopping.append(asyncio.create_task(worker.drain(reason=sig.name)))
        else:  # a second signal: the operator does not want to wait for the grace
            log.warning("second signal: stopping without waiting", extra={"signal": sig.name})
            stopping.append(asyncio.create_task(worker.close()))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    log.info("worker starting", extra={"worker_id": worker.worker_id, "pool": settings.pool,
                                       "region": settings.region, "planners": list(settings.planners),
                                       "concurrency": settings.concurrency, "task_types": worker.task_types})
    try:
        await worker.run()
        if stopping:
            await asyncio.gather(*stopping, return_exceptions=True)
    finally:
        if health is not None:
            await health.stop()
        if metrics is not None:
            await metrics.stop()
    return Exit.OK


async def serve_health(address: str) -> HealthServer | None:
    """Serve the gRPC health service when `health_address` is set (validated with the settings)."""
    where = parse_listen_address("health_address", address)
    if where is None:
        return None
    from scheduler.worker.health import HealthServer

    server = HealthServer()
    try:
        port = await server.start(*where)
    except OSError as e:
        raise InvalidArgument("health_address", f"cannot listen on {address}: {e}") from None
    log.info("health serving", extra={"event": "health_serving", "address": f"{where[0]}:{port}"})
    return server
