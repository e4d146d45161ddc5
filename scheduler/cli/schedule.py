"""`schedctl schedule create|apply|get|list|update|delete|pause|resume|trigger|rerun|backfill|preview`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tqdm import tqdm

from scheduler._gen.scheduler.v1 import schedule_pb2 as spb
from scheduler._gen.scheduler.v1 import schedule_service_pb2 as sspb
from scheduler.cli.common import (
    client_parent,
    duration_text,
    enum_choices,
    enum_name,
    enum_value,
    opt_ts,
    print_json,
    run_call,
    table,
    to_dict,
    ts,
)
from scheduler.cli.executions import show_execution
from scheduler.cli.output import UINT32_MAX, Exit, check_count, check_limit, check_version, parse_instant
from scheduler.cli.schedule_input import add_schedule_flags, build_schedule
from scheduler.client import SchedulerClient
from scheduler.clock import SYSTEM_CLOCK
from scheduler.ids import format_rfc3339_ms

_STATE = "SCHEDULE_STATE_"
_OVERLAP = "OVERLAP_POLICY_"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    top = sub.add_parser("schedule", help="create, change and run schedules (server)",
                         description="Manage schedules on a running cluster (`--server`).")
    verbs = top.add_subparsers(dest="verb", required=True, metavar="VERB")
    conn = client_parent()

    def verb(name: str, help: str, func: Any) -> argparse.ArgumentParser:
        p = verbs.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".", parents=[conn])
        p.set_defaults(func=func)
        return p

    p = verb("create", "create a schedule from flags and/or a JSON/TOML file", _create)
    add_schedule_flags(p, creating=True)
    p.add_argument("--request-id", default="", help="makes a retried create safe (same id returns the schedule)")

    p = verb("apply", "create or update many schedules to match a YAML or TOML file (idempotent)", _apply)
    p.add_argument("--file", "-f", required=True, metavar="FILE",
                   help="YAML (a list, or `schedules:`) or TOML (`[[schedules]]`, by the .toml suffix) of schedules "
                        "in the proto's JSON field names, as `create --file` takes one")
    p.add_argument("--dry-run", action="store_true", help="say what would be created and updated; write nothing")

    p = verb("get", "show one schedule", _get)
    p.add_argument("id")

    p = verb("list", "list schedules (ordered by id)", _list)
    p.add_argument("--tenant", default="")
    p.add_argument("--selector", "-l", default="", metavar="SELECTOR",
                   help="label selector, e.g. 'team=billing,env!=dev'")
    p.add_argument("--state", choices=enum_choices(spb.ScheduleState, _STATE))
    p.add_argument("--limit", type=int, default=0, metavar="N", help="at most N (default: all)")

    p = verb("update", "change the given fields of a schedule (the others are kept)", _update)
    p.add_argument("id")
    add_schedule_flags(p, creating=False)
    p.add_argument("--expected-version", type=int, metavar="N", help="refuse (exit 4) unless the stored version is N")

    p = verb("delete", "delete a schedule (its history stays readable)", _delete)
    p.add_argument("id")
    p.add_argument("--expected-version", type=int, metavar="N")
    p.add_argument("--cancel-running", action="store_true", help="also cancel its dispatched or running executions")
    p.add_argument("--allow-missing", action="store_true", help="succeed if there is no such schedule")

    p = verb("pause", "pause a schedule at once", _pause)
    p.add_argument("id")
    p.add_argument("--reason", default="")
    p.add_argument("--cancel-running", action="store_true", help="also cancel its dispatched or running executions")
    p.add_argument("--expected-version", type=int, metavar="N")

    p = verb("resume", "resume a paused schedule from now on", _resume)
    p.add_argument("id")
    p.add_argument("--expected-version", type=int, metavar="N")

    p = verb("trigger", "run a schedule now, outside its spec", _trigger)
    p.add_argument("id")
    p.add_argument("--at", metavar="RFC3339", help="the instant naming the run (makes a retry idempotent)")
    p.add_argument("--overlap", choices=enum_choices(spb.OverlapPolicy, _OVERLAP), help="for this run only")

    p = verb("rerun", "run one planned time again under its original execution id", _rerun)
    p.add_argument("id")
    p.add_argument("planned_at", metavar="PLANNED_AT", help="the planned time (RFC3339), as in the execution id")

    p = verb("backfill", "materialize the planned times of a past range, with progress", _backfill)
    p.add_argument("id")
    p.add_argument("--start", required=True, metavar="RFC3339", help="inclusive start")
    p.add_argument("--end", required=True, metavar="RFC3339", help="exclusive end (not in the future)")
    p.add_argument("--overlap", choices=enum_choices(spb.OverlapPolicy, _OVERLAP),
                   help="overlap policy of the backfilled runs (default buffer_all: every planned time of the "
                        "range runs, one after another; the schedule's own policy is not used)")
    p.add_argument("--dry-run", action="store_true", help="count, write nothing")

    p = verb("preview", "next planned times of a stored schedule (the server computes them)", _preview)
    p.add_argument("id")
    p.add_argument("--after", metavar="RFC3339", help="strictly after this (default: now)")
    p.add_argument("--count", type=int, default=10, metavar="N")


# ---- output ---------------------------------------------------------------------------------------


def show_schedule(s: Any, as_json: bool) -> None:
    if as_json:
        print_json(s)
        return
    p = s.policies
    rows: list[tuple[str, object]] = [
        ("id", s.id), ("tenant", s.tenant), ("state", enum_name(spb.ScheduleState, s.state, _STATE)),
        ("spec", s.spec), ("time_zone", s.time_zone or "UTC"), ("worker_pool", s.worker_pool),
        ("task_type", s.task_type), ("payload", s.payload.decode(errors="replace") or "-"),
        ("labels", ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) or "-"),
        ("start_at", opt_ts(s, "start_at")), ("end_at", opt_ts(s, "end_at")),
        ("missed_runs", enum_name(spb.MissedRunPolicy, p.missed_runs.policy, "MISSED_RUN_POLICY_")),
        ("overlap", enum_name(spb.OverlapPolicy, p.overlap, _OVERLAP)),
        ("jitter", duration_text(p.jitter.ToMilliseconds())),
        ("max_attempts", p.retry.max_attempts if p.retry.HasField("max_attempts") else "-"),
        ("execution_timeout", duration_text(p.execution_timeout.ToMilliseconds())),
        ("version", s.version), ("created_at", opt_ts(s, "created_at")), ("updated_at", opt_ts(s, "updated_at")),
    ]
    if s.paused_reason:
        rows.insert(3, ("paused_reason", s.paused_reason))
    if s.HasField("end_at") and s.end_at.ToMilliseconds() < SYSTEM_CLOCK.wall_ms():
        # Still `active` (nothing changed it), but it plans nothing more: said, not left to guess (an audit).
        rows[2] = ("state", f"{rows[2][1]} (ended: end_at has passed)")
    width = max(len(k) for k, _ in rows)
    sys.stdout.write("".join(f"{k.ljust(width)}  {v}\n" for k, v in rows))


# ---- verbs ----------------------------------------------------------------------------------------


def _create(args: argparse.Namespace) -> int:
    schedule, _ = build_schedule(args, creating=True)

    async def body(c: SchedulerClient) -> int:
        show_schedule(await c.create_schedule(schedule, request_id=args.request_id), args.json)
        return Exit.OK
    return run_call(args, body)


def _get(args: argparse.Namespace) -> int:
    async def body(c: SchedulerClient) -> int:
        show_schedule(await c.get_schedule(args.id), args.json)
        return Exit.OK
    return run_call(args, body)


def _apply(args: argparse.Namespace) -> int:
    from scheduler.cli import apply  # YAML is loaded only for this verb

    items = apply.read_file(args.file)  # bad input exits 2 before anything is sent

    async def body(c: SchedulerClient) -> int:
        return await apply.apply(c, args, items)
    return run_call(args, body)


def _list(args: argparse.Namespace) -> int:
    check_limit(args.limit)
    state = enum_value(spb.ScheduleState, _STATE, args.state) if args.state else spb.SCHEDULE_STATE_UNSPECIFIED

    async def body(c: SchedulerClient) -> int:
        found: list[Any] = []
        async for s in c.iter_schedules(tenant=args.tenant, label_selector=args.selector, state=state):
            found.append(s)
            if args.limit and len(found) >= args.limit:
                break
        if args.json:
            print_json({"schedules": [to_dict(s) for s in found]})
        else:
            table(["ID", "TENANT", "STATE", "SPEC", "TZ", "POOL", "TASK", "VERSION"],
                  [(s.id, s.tenant, enum_name(spb.ScheduleState, s.state, _STATE), s.spec, s.time_zone or "UTC",
                    s.worker_pool, s.task_type, s.version) for s in found])
        return Exit.OK
    return run_call(args, body)


def _update(args: argparse.Namespace) -> int:
    check_version(args.expected_version)
    schedule, paths = build_schedule(args, creating=False)
    schedule.id = args.id
    paths = [p for p in paths if p != "id"]
    if not paths:
        print("schedctl: nothing to update: pass the fields to change (e.g. --cron, --payload) or --file",
              file=sys.stderr)
        return Exit.INVALID

    async def body(c: SchedulerClient) -> int:
        s = await c.update_schedule(schedule, update_mask=paths, expected_version=args.expected_version)
        show_schedule(s, args.json)
        return Exit.OK
    return run_call(args, body)


def _delete(args: argparse.Namespace) -> int:
    check_version(args.expected_version)

    async def body(c: SchedulerClient) -> int:
        deleted = await c.delete_schedule(args.id, expected_version=args.expected_version,
                                          cancel_running=args.cancel_running, allow_missing=args.allow_missing)
        if args.json:
            print_json({"deleted": args.id} if deleted else {"missing": args.id})
        elif deleted:
            print(f"deleted {args.id}")
        else:  # --allow-missing: a success, but saying "deleted" told an operator something happened
            print(f"no schedule {args.id}: nothing deleted")
        return Exit.OK
    return run_call(args, body)


def _pause(args: argparse.Namespace) -> int:
    check_version(args.expected_version)

    async def body(c: SchedulerClient) -> int:
        show_schedule(await c.pause_schedule(args.id, reason=args.reason, cancel_running=args.cancel_running,
                                             expected_version=args.expected_version), args.json)
        return Exit.OK
    return run_call(args, body)


def _resume(args: argparse.Namespace) -> int:
    check_version(args.expected_version)

    async def body(c: SchedulerClient) -> int:
        show_schedule(await c.resume_schedule(args.id, expected_version=args.expected_version), args.json)
        return Exit.OK
    return run_call(args, body)


def _trigger(args: argparse.Namespace) -> int:
    at = parse_instant(args.at, "at") if args.at else None
    overlap = enum_value(spb.OverlapPolicy, _OVERLAP, args.overlap) if args.overlap else spb.OVERLAP_POLICY_UNSPECIFIED

    async def body(c: SchedulerClient) -> int:
        show_execution(await c.trigger_schedule(args.id, trigger_time=at, overlap_policy=overlap), args.json)
        return Exit.OK
    return run_call(args, body)


def _rerun(args: argparse.Namespace) -> int:
    planned = parse_instant(args.planned_at, "planned_at")

    async def body(c: SchedulerClient) -> int:
        show_execution(await c.rerun_execution(args.id, planned), args.json)
        return Exit.OK
    return run_call(args, body)


def _backfill(args: argparse.Namespace) -> int:
    start, end = parse_instant(args.start, "start"), parse_instant(args.end, "end")
    overlap = enum_value(spb.OverlapPolicy, _OVERLAP, args.overlap) if args.overlap else spb.OVERLAP_POLICY_UNSPECIFIED

    async def body(c: SchedulerClient) -> int:
        last = sspb.BackfillProgress()
        # The bar measures the share of the time range processed (the server does not know the count
        # of planned times up front); tqdm turns itself off when stderr is not a terminal (disable=None).
        span = max(1, (end - start) // 1000)
        with tqdm(total=span, unit="s", unit_scale=True, desc=f"backfill {args.id}", disable=None,
                  file=sys.stderr, leave=False) as bar:
            async for p in c.backfill(args.id, start, end, overlap_policy=overlap, dry_run=args.dry_run):
                last = p
                if p.HasField("processed_until"):
                    bar.n = min(span, max(0, (p.processed_until.ToMilliseconds() - start) // 1000))
                bar.set_postfix(created=p.created, existing=p.existing, skipped=p.skipped, refresh=False)
                bar.refresh()
        if args.json:
            print_json(to_dict(last) | {"dry_run": args.dry_run})
        else:
            verb = "would create" if args.dry_run else "created"
            print(f"{args.id}: {last.planned} planned times in [{format_rfc3339_ms(start)}, "
                  f"{format_rfc3339_ms(end)}): "
                  f"{verb} {last.created}, {last.existing} existed, {last.skipped} skipped (overlap)")
        return Exit.OK if last.done else Exit.FAILURE
    return run_call(args, body)


def _preview(args: argparse.Namespace) -> int:
    check_count("--count", args.count, most=UINT32_MAX)  # the request's uint32 (the server allows 0-1000)
    after = parse_instant(args.after, "after") if args.after else None

    async def body(c: SchedulerClient) -> int:
        times = await c.preview_schedule(schedule_id=args.id, after=after, count=args.count)
        if args.json:  # the response's proto JSON mapping, as every --json prints (docs/cli.md)
            print_json(sspb.PreviewScheduleResponse(planned_times=times))
        else:
            sys.stdout.write("".join(ts(t) + "\n" for t in times))
            if not times:  # say why nothing comes (an audit: an ended schedule printed nothing, exit 0)
                s = await c.get_schedule(args.id)
                why = f"it ended at {opt_ts(s, 'end_at')}" if s.HasField("end_at") else "its spec plans no more"
                sys.stderr.write(f"schedctl: no planned time of {args.id!r} after that instant: {why}\n")
        return Exit.OK
    return run_call(args, body)

