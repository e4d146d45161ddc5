"""`schedctl schedule apply -f FILE`: make the cluster's schedules match a file of many, like `kubectl apply`.

The file (YAML, or TOML by its `.toml` suffix) lists schedules in the proto's JSON field names, as
`schedctl schedule create --file` reads one: YAML a list (or `schedules:` holding one), TOML `[[schedules]]`
tables. Each schedule missing from the cluster is created (BatchCreateSchedules, up to 1000 and 3 MiB per call);
each one whose stored value differs in a field the file sets is updated with those fields as the update
mask, guarded by the version just read (a concurrent change fails that item with exit 4, never overwrites
it); equal ones are left alone, so applying the same file twice writes nothing. Fields the file does not
set are neither compared nor changed, and schedules the file does not name are not touched (no prune).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tomllib
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.cli.common import print_json
from scheduler.cli.output import Exit
from scheduler.cli.schedule_input import schedule_from_data
from scheduler.client import ClientError, SchedulerClient
from scheduler.errors import InvalidArgument

BATCH = 1000  # schedules per BatchCreateSchedules call (the server's limit)
# Bytes of schedules per call: 1000 schedules with 64 KiB payloads are 64 MiB, past the 32 MiB either end
# takes; the answer carries them back as stored, so the same bound keeps it under 4 MiB as well.
BATCH_BYTES = 3 * 1024 * 1024
MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the API's bound on instants (api/inputs.py)
# Set by a create, never by an update (the API's immutable fields): pause and resume are their own commands, and
# an apply of a file whose `state` differs from a schedule's now would otherwise fail on every run (an audit).
_CREATE_ONLY = ("state", "paused_reason")
_OUTPUT_ONLY = ("version", "created_at", "updated_at")
IN_FLIGHT = 16  # reads and updates at once


@dataclass
class Desired:
    schedule: Any  # Schedule message
    paths: list[str]  # the fields the file sets (compared, and the update mask)


@dataclass
class Plan:
    create: list[Desired] = field(default_factory=list)
    update: list[tuple[Desired, list[str], int]] = field(default_factory=list)  # (item, changed paths, version)
    unchanged: list[str] = field(default_factory=list)
    # (id, item index) whose `state` or `paused_reason` differs from the stored one: applied by a create only
    create_only: list[tuple[str, int]] = field(default_factory=list)


def read_file(path: str) -> list[Desired]:
    """The schedules of an apply file; every error names `schedules[i].<field>` (exit 2)."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise InvalidArgument("file", f"cannot read {path}: {e.strerror}") from None
    toml = path.endswith(".toml")
    try:
        if toml:
            data: Any = tomllib.loads(text)
        else:
            import yaml  # only apply reads YAML: not imported by the other commands

            data = yaml.safe_load(text)
    except Exception as e:  # tomllib.TOMLDecodeError, yaml.YAMLError: the parser's message says where
        raise InvalidArgument("file", f"{path} is not valid {'TOML' if toml else 'YAML'}: {e}") from None
    if isinstance(data, dict) and set(data) == {"schedules"}:
        data = data["schedules"]
    if not isinstance(data, list) or not data:
        raise InvalidArgument("file", f"{path} must hold a non-empty list of schedules "
                              "(YAML: a list or `schedules:`; TOML: [[schedules]] tables)")
    out: list[Desired] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(data):
        where = f"schedules[{i}]"
        if not isinstance(item, dict):
            raise InvalidArgument(where, "must be a mapping of schedule fields")
        s, paths = schedule_from_data(item, where, path)
        for name in ("id", "spec", "task_type"):
            if not getattr(s, name):
                raise InvalidArgument(f"{where}.{name}", "is required")
        for name in ("tenant", "worker_pool"):  # as `schedule create` does: `default` when not given
            if not getattr(s, name):
                setattr(s, name, "default")
                paths.append(name)
        if s.id in seen:
            raise InvalidArgument(f"{where}.id", f"{s.id!r} is also schedules[{seen[s.id]}]")
        seen[s.id] = i
        _validate(s, where)
        # Output-only fields (`version`, the times): never compared nor sent, as a create ignores them (an
        # outside audit: a file with `version:` created fine, then every later apply failed on it).
        out.append(Desired(s, sorted(set(paths) - {"id", *_OUTPUT_ONLY})))
    return out


def _validate(s: Any, where: str) -> None:
    """The server's own checks of a schedule (spec, zone, bounds, policies...), run on every item before anything
    is sent: a file the server would refuse halfway no longer writes the items before the bad one, and
    `--dry-run` answers what the real apply would (an outside audit: a bad zone passed the dry run, and the
    real apply created the item before it, then exited naming no item)."""
    from scheduler.api.convert import schedule_from_pb  # the same conversion and checks as the service's
    from scheduler.model import validate_schedule

    try:
        d = schedule_from_pb(s)
        for name, ms in (("start_at", d.start_ms), ("end_at", d.end_ms)):
            if ms is not None and not 0 <= ms <= MAX_MS:
                raise InvalidArgument(name, "is outside 1970-01-01 .. 9999-12-31")
        validate_schedule(d)
    except InvalidArgument as e:
        raise InvalidArgument(f"{where}.{e.field}" if e.field else where, e.reason) from None


def _value(msg: Any, path: str) -> Any:
    for name in path.split("."):
        msg = getattr(msg, name)
    return dict(msg) if path == "labels" else msg


def differs(desired: Any, stored: Any, paths: list[str]) -> list[str]:
    """The paths whose value in `desired` is not the stored one."""
    return [p for p in paths if _value(desired, p) != _value(stored, p)]


async def plan(c: SchedulerClient, items: list[Desired]) -> Plan:
    out = Plan()
    sem = asyncio.Semaphore(IN_FLIGHT)

    async def look(d: Desired) -> tuple[Desired, Any]:
        async with sem:
            try:
                return d, await c.get_schedule(d.schedule.id)
            except ClientError as e:
                if e.code.name == "NOT_FOUND":
                    return d, None
                raise

    for i, (d, stored) in enumerate(await asyncio.gather(*(look(d) for d in items))):
        if stored is None:
            out.create.append(d)
            continue
        if "tenant" in d.paths and d.schedule.tenant != stored.tenant:
            # Checked for every item before anything is written: exit 2 names it, and nothing is applied.
            raise InvalidArgument(f"schedules[{i}].tenant", f"{d.schedule.tenant!r} differs from the stored "
                                  f"schedule's {stored.tenant!r}: a schedule does not move between tenants "
                                  "(delete it and create it again)")
        changed = differs(d.schedule, stored, [p for p in d.paths if p not in _CREATE_ONLY])
        if any(p in _CREATE_ONLY for p in differs(d.schedule, stored, d.paths)):
            out.create_only.append((d.schedule.id, i))
        if changed:
            out.update.append((d, changed, stored.version))
        else:
            out.unchanged.append(d.schedule.id)
    return out


def _batches(items: list[Desired]) -> list[list[Desired]]:
    """`items` in order, in calls of at most BATCH schedules and BATCH_BYTES (at least one a call)."""
    out: list[list[Desired]] = []
    cur: list[Desired] = []
    size = 0
    for d in items:
        n = d.schedule.ByteSize() + 6
        if cur and (len(cur) >= BATCH or size + n > BATCH_BYTES):
            out.append(cur)
            cur, size = [], 0
        cur.append(d)
        size += n
    if cur:
        out.append(cur)
    return out


async def execute(c: SchedulerClient, p: Plan) -> tuple[list[str], list[str], list[str]]:
    """(created, updated, conflicts): a conflict is an id created or changed by someone else meanwhile."""
    created: list[str] = []
    conflicts: list[str] = []
    request_id = f"apply-{uuid.uuid4().hex}"  # a retried call of this run counts its own creates as created
    for chunk in _batches(p.create):
        try:
            results = await c.batch_create_schedules([d.schedule for d in chunk], request_id=request_id)
        except ClientError:
            if created:  # earlier calls wrote theirs (each call is all or nothing): say which, then the error
                print(f"{len(created)} created before the error: {', '.join(created[:5])}"
                      f"{' ...' if len(created) > 5 else ''} (apply again once it is fixed: they are unchanged "
                      "then)", file=sys.stderr)
            raise
        for d, r in zip(chunk, results, strict=True):
            (conflicts if r.already_exists else created).append(d.schedule.id)
    sem = asyncio.Semaphore(IN_FLIGHT)

    async def update(d: Desired, paths: list[str], version: int) -> tuple[str, bool]:
        async with sem:
            try:
                await c.update_schedule(d.schedule, update_mask=paths, expected_version=version)
                return d.schedule.id, True
            except ClientError as e:
                if e.code.name in ("ABORTED", "NOT_FOUND"):
                    return d.schedule.id, False
                raise

    updated: list[str] = []
    for sid, ok in await asyncio.gather(*(update(d, paths, v) for d, paths, v in p.update)):
        (updated if ok else conflicts).append(sid)
    return created, updated, conflicts


def report(args: argparse.Namespace, p: Plan, created: list[str], updated: list[str], conflicts: list[str]) -> int:
    verb = "would be " if args.dry_run else ""
    if args.json:
        print_json({"dry_run": args.dry_run, "created": created, "updated": updated,
                    "unchanged": p.unchanged, "conflicts": conflicts,
                    "state_not_applied": [sid for sid, _ in p.create_only]})
    else:
        for sid in created:
            print(f"{sid}: {verb}created")
        done = set(updated)
        for d, paths, _ in p.update:
            if d.schedule.id in done:
                print(f"{d.schedule.id}: {verb}updated ({', '.join(paths)})")
        for sid in conflicts:
            print(f"{sid}: changed by someone else meanwhile: not applied (run apply again)", file=sys.stderr)
        for sid, i in p.create_only:
            print(f"{sid}: schedules[{i}].state differs from the stored schedule's: apply sets it only when it "
                  f"creates one (`schedctl schedule pause|resume {sid}`)", file=sys.stderr)
        print(f"{len(created)} {verb}created, {len(updated)} {verb}updated, {len(p.unchanged)} unchanged"
              + (f", {len(conflicts)} conflicts" if conflicts else ""))
    return Exit.CONFLICT if conflicts else Exit.OK


async def apply(c: SchedulerClient, args: argparse.Namespace, items: list[Desired]) -> int:
    p = await plan(c, items)
    if args.dry_run:
        return report(args, p, [d.schedule.id for d in p.create], [d.schedule.id for d, _, _ in p.update], [])
    created, updated, conflicts = await execute(c, p)
    return report(args, p, created, updated, conflicts)
