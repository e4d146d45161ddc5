"""`schedctl exec list|get|cancel`: executions, newest first by default."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from scheduler._gen.scheduler.v1 import execution_pb2 as epb
from scheduler.cli.common import (
    client_parent,
    enum_choices,
    enum_name,
    enum_value,
    opt_ts,
    print_json,
    run_call,
    table,
    to_dict,
)
from scheduler.cli.output import Exit, check_execution_id, check_limit, parse_instant
from scheduler.client import ClientError, SchedulerClient
from scheduler.execution import RESERVED_MESSAGE

_STATE = "EXECUTION_STATE_"
_TRIGGER = "TRIGGER_"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    top = sub.add_parser("exec", help="list, inspect and cancel executions (server)",
                         description="Executions of schedules on a running cluster (`--server`).")
    verbs = top.add_subparsers(dest="verb", required=True, metavar="VERB")
    conn = client_parent()

    p = verbs.add_parser("list", parents=[conn], help="list executions (newest planned time first)",
                         description="List executions, newest planned time first within a schedule. Without "
                                     "--schedule, every schedule's, in storage order (partition, schedule, planned "
                                     "time), read page by page. Skipped planned times that never became an "
                                     "execution are listed by `schedctl skips SCHEDULE_ID`.")
    p.add_argument("--schedule", "-s", default="", metavar="ID", help="only this schedule's")
    p.add_argument("--tenant", default="")
    p.add_argument("--state", action="append", choices=enum_choices(epb.ExecutionState, _STATE),
                   help="only in this state (repeatable)")
    p.add_argument("--since", metavar="RFC3339", help="planned at or after")
    p.add_argument("--until", metavar="RFC3339", help="planned before")
    p.add_argument("--oldest-first", action="store_true", help="oldest planned time first (always so without "
                   "--schedule)")
    p.add_argument("--limit", type=int, default=50, metavar="N", help="at most N (default 50; 0: all)")
    p.set_defaults(func=_list)

    p = verbs.add_parser("get", parents=[conn], help="show one execution with its attempts")
    p.add_argument("execution_id", metavar="EXECUTION_ID", help="<schedule_id>@<planned time>")
    p.set_defaults(func=_get)

    p = verbs.add_parser("cancel", parents=[conn], help="cancel a non-terminal execution")
    p.add_argument("execution_id", metavar="EXECUTION_ID")
    p.add_argument("--reason", default="")
    p.set_defaults(func=_cancel)

    p = sub.add_parser("skips", parents=[conn], help="planned times of a schedule that did not run, and why (server)",
                       description="List the planned times of one schedule that were not run, with the reason "
                                   "(missed during an outage, paused, overlap, schedule changed...), oldest first: "
                                   "skip records expanded with the schedule's current spec, and executions "
                                   "recorded as skipped.")
    p.add_argument("schedule_id", metavar="SCHEDULE_ID")
    p.add_argument("--since", metavar="RFC3339", help="planned at or after")
    p.add_argument("--until", metavar="RFC3339", help="planned before")
    p.add_argument("--limit", type=int, default=100, metavar="N", help="at most N (default 100; 0: all)")
    p.set_defaults(func=_skips)


def show_execution(e: Any, as_json: bool) -> None:
    if as_json:
        print_json(e)
        return
    rows: list[tuple[str, object]] = [
        ("execution_id", e.execution_id), ("schedule_id", e.schedule_id), ("tenant", e.tenant),
        ("state", enum_name(epb.ExecutionState, e.state, _STATE)),
        ("trigger", enum_name(epb.Trigger, e.trigger, _TRIGGER)), ("planned_at", opt_ts(e, "planned_at")),
        ("due_at", opt_ts(e, "due_at")), ("attempt", e.attempt), ("task_type", e.task_type),
        ("worker_pool", e.worker_pool), ("next_attempt_at", opt_ts(e, "next_attempt_at")),
    ]
    if e.skip_reason:
        rows.append(("skip_reason", enum_name(epb.SkipReason, e.skip_reason, "SKIP_REASON_")))
    if e.state_message:
        rows.append(("message", e.state_message))
    if e.HasField("quota_deferred"):  # the tenant's executions-per-second quota started it later
        rows.append(("quota_deferred", f"{e.quota_deferred.ToMilliseconds() / 1000:g}s (included in due_at)"))
    width = max(len(k) for k, _ in rows)
    sys.stdout.write("".join(f"{k.ljust(width)}  {v}\n" for k, v in rows))
    if e.attempts:
        sys.stdout.write("\n")
        table(["ATTEMPT", "OUTCOME", "WORKER", "STARTED", "FINISHED", "EXIT", "ERROR"],
              [(a.attempt, _outcome(a), a.worker_id or "-", opt_ts(a, "started_at"), opt_ts(a, "finished_at"),
                a.exit_code if a.HasField("exit_code") else "-", " ".join((a.error_message or "-").split())[:200])
               for a in e.attempts])
        for a in e.attempts:  # the shell executor's output, last 4 KiB of each stream
            for name in ("stdout", "stderr"):
                text = getattr(a, f"{name}_tail")
                if text:
                    sys.stdout.write(f"\n--- attempt {a.attempt} {name} (tail)\n{text}")
                    sys.stdout.write("" if text.endswith("\n") else "\n")


def _outcome(a: Any) -> str:
    """How the attempt ended; while it is out: running (start recorded), never started, or waiting for its start."""
    if a.outcome:
        if a.never_started and not a.worker_id and a.error_message == RESERVED_MESSAGE:
            # The first attempt its creating owner reserved and never handed out, retired by a later dispatch
            # (docs/keyspace.md): no worker had it. Shown as `failed`, it read as a failure (an audit, session 36).
            return "not handed out"
        name = enum_name(epb.AttemptOutcome, a.outcome, "ATTEMPT_OUTCOME_")
        return f"{name} (never started)" if a.never_started else name
    return "running" if a.HasField("started_at") else "dispatched"


def _list(args: argparse.Namespace) -> int:
    check_limit(args.limit)
    states = [enum_value(epb.ExecutionState, _STATE, s) for s in args.state or ()]
    since = parse_instant(args.since, "since") if args.since else None
    until = parse_instant(args.until, "until") if args.until else None

    async def body(c: SchedulerClient) -> int:
        found = [e async for e in c.iter_executions(
            limit=args.limit or None, schedule_id=args.schedule, tenant=args.tenant, states=states,
            planned_start=since, planned_end=until, newest_first=bool(args.schedule) and not args.oldest_first)]
        if not found and args.schedule:
            await _note_if_missing(c, args.schedule)
        if args.json:
            print_json({"executions": [to_dict(e) for e in found]})
        else:
            table(["EXECUTION_ID", "STATE", "TRIGGER", "ATTEMPT", "WORKER", "STARTED", "FINISHED", "MESSAGE"],
                  [(e.execution_id, enum_name(epb.ExecutionState, e.state, _STATE),
                    enum_name(epb.Trigger, e.trigger, _TRIGGER), e.attempt,
                    (e.attempts[-1].worker_id or "-") if e.attempts else "-",
                    opt_ts(e.attempts[-1], "started_at") if e.attempts else "-", _finished(e), _message(e))
                   for e in found])
        return Exit.OK
    return run_call(args, body)


def _skips(args: argparse.Namespace) -> int:
    check_limit(args.limit)
    since = parse_instant(args.since, "since") if args.since else None
    until = parse_instant(args.until, "until") if args.until else None

    async def body(c: SchedulerClient) -> int:
        found = [x async for x in c.iter_skips(args.schedule_id, limit=args.limit or None, planned_start=since,
                                               planned_end=until)]
        if not found:
            await _note_if_missing(c, args.schedule_id)
        if args.json:
            print_json({"skips": [to_dict(x) for x in found]})
        else:
            table(["PLANNED_AT", "REASON", "RECORDED_AS"],
                  [(opt_ts(x, "planned_at") if x.HasField("planned_at") else
                    f"({opt_ts(x, 'range_after')}, {opt_ts(x, 'range_through')}]",
                    enum_name(epb.SkipReason, x.reason, "SKIP_REASON_"),
                    x.execution_id or f"skip record ({opt_ts(x, 'range_after')}, {opt_ts(x, 'range_through')}]")
                   for x in found])
        return Exit.OK
    return run_call(args, body)


async def _note_if_missing(c: SchedulerClient, schedule_id: str) -> None:
    """An empty listing for an id with no schedule: say so on stderr (a typo looked like "nothing skipped").
    Not an error: a deleted schedule's records stay listable, and may be none."""
    try:
        await c.get_schedule(schedule_id)
    except ClientError as e:
        if e.code.name == "NOT_FOUND":  # (no grpc import here: the CLI's start time)
            print(f"schedctl: no schedule {schedule_id!r} (deleted, or never created): nothing recorded under it",
                  file=sys.stderr)


def _finished(e: Any) -> str:
    """When the latest attempt ended (`-` while it runs)."""
    return opt_ts(e.attempts[-1], "finished_at") if e.attempts else "-"


def _message(e: Any) -> str:
    """The operator's note, else the latest attempt's error, on one line."""
    text = e.state_message or (e.attempts[-1].error_message if e.attempts else "") or "-"
    return " ".join(str(text).split())[:120]


def _get(args: argparse.Namespace) -> int:
    check_execution_id(args.execution_id)

    async def body(c: SchedulerClient) -> int:
        show_execution(await c.get_execution(args.execution_id), args.json)
        return Exit.OK
    return run_call(args, body)


def _cancel(args: argparse.Namespace) -> int:
    check_execution_id(args.execution_id)

    async def body(c: SchedulerClient) -> int:
        show_execution(await c.cancel_execution(args.execution_id, reason=args.reason), args.json)
        return Exit.OK
    return run_call(args, body)
