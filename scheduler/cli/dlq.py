"""`schedctl dlq list|replay|discard`: dead letters wait here until an operator decides."""

from __future__ import annotations

import argparse

from scheduler.cli.common import client_parent, opt_ts, print_json, run_call, table, to_dict
from scheduler.cli.executions import show_execution
from scheduler.cli.output import Exit, check_execution_id, check_limit, parse_instant
from scheduler.client import SchedulerClient


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    top = sub.add_parser("dlq", help="list, replay or discard dead letters (server)",
                         description="Dead letters: executions that ran out of retries.")
    verbs = top.add_subparsers(dest="verb", required=True, metavar="VERB")
    conn = client_parent()

    p = verbs.add_parser("list", parents=[conn], help="list dead letters (oldest first)")
    p.add_argument("--schedule", "-s", default="", metavar="ID")
    p.add_argument("--tenant", default="")
    p.add_argument("--task-type", default="")
    p.add_argument("--since", metavar="RFC3339", help="dead-lettered at or after")
    p.add_argument("--until", metavar="RFC3339", help="dead-lettered before")
    p.add_argument("--limit", type=int, default=100, metavar="N", help="at most N (default 100; 0: all)")
    p.set_defaults(func=_list)

    for name, help, func in (("replay", "run a dead letter again with a fresh retry budget", _replay),
                             ("discard", "drop a dead letter for good (its execution ends FAILED)", _discard)):
        p = verbs.add_parser(name, parents=[conn], help=help, description=help[0].upper() + help[1:] + ".")
        p.add_argument("execution_id", metavar="EXECUTION_ID")
        p.add_argument("--reason", default="")
        if name == "replay":
            p.add_argument("--with-current-schedule", action="store_true",
                           help="run it with the schedule's current payload, command, task type, pool, retry "
                                "policy and timeout (after `schedule update` fixed them). Default: as it died, "
                                "with the payload kept in the dead letter")
        p.set_defaults(func=func)


def _list(args: argparse.Namespace) -> int:
    check_limit(args.limit)
    since = parse_instant(args.since, "since") if args.since else None
    until = parse_instant(args.until, "until") if args.until else None

    async def body(c: SchedulerClient) -> int:
        found = [d async for d in c.iter_dead_letters(limit=args.limit or None, schedule_id=args.schedule,
                                                      tenant=args.tenant, task_type=args.task_type,
                                                      start=since, end=until)]
        if args.json:
            print_json({"dead_letters": [to_dict(d) for d in found]})
        else:
            table(["EXECUTION_ID", "TASK", "ATTEMPTS", "DEAD_LETTERED", "REASON"],
                  [(d.execution.execution_id, d.execution.task_type, d.execution.attempt,
                    opt_ts(d, "dead_lettered_at"), d.reason or "-") for d in found])
        return Exit.OK
    return run_call(args, body)


def _replay(args: argparse.Namespace) -> int:
    check_execution_id(args.execution_id)

    async def body(c: SchedulerClient) -> int:
        show_execution(await c.replay_dead_letter(args.execution_id, reason=args.reason,
                                                  use_current_schedule=args.with_current_schedule), args.json)
        return Exit.OK
    return run_call(args, body)


def _discard(args: argparse.Namespace) -> int:
    check_execution_id(args.execution_id)

    async def body(c: SchedulerClient) -> int:
        show_execution(await c.discard_dead_letter(args.execution_id, reason=args.reason), args.json)
        return Exit.OK
    return run_call(args, body)
