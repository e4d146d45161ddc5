"""Building a `Schedule` message from `schedctl schedule create|update` flags and/or a JSON/TOML file.

The file uses the proto's JSON field names (`worker_pool`, `policies.retry.max_attempts`, durations
as "30s"), except `payload`, which may be a JSON object (stored as its JSON text) or a string
(stored as is) instead of base64. Flags override the file. The paths that were set are returned
too: they are the update mask of `schedctl schedule update`.
"""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from scheduler._gen.scheduler.v1 import schedule_pb2 as spb
from scheduler.cli.common import enum_choices, enum_value
from scheduler.cli.output import UINT32_MAX, check_count, parse_instant
from scheduler.errors import InvalidArgument
from scheduler.timeplan.plan import parse_duration_ms

# flag dest -> (proto path, kind)
_SIMPLE = {
    "id": "id", "tenant": "tenant", "cron": "spec", "tz": "time_zone", "pool": "worker_pool",
    "task_type": "task_type",
}
_ENUMS = {  # dest -> (path, enum, prefix)
    "missed_runs": ("policies.missed_runs.policy", spb.MissedRunPolicy, "MISSED_RUN_POLICY_"),
    "overlap": ("policies.overlap", spb.OverlapPolicy, "OVERLAP_POLICY_"),
    "dst_gap": ("policies.dst_gap", spb.DstGapPolicy, "DST_GAP_POLICY_"),
    "dst_overlap": ("policies.dst_overlap", spb.DstOverlapPolicy, "DST_OVERLAP_POLICY_"),
}
_DURATIONS = {
    "catchup_window": "policies.missed_runs.catchup_window", "jitter": "policies.jitter",
    "initial_backoff": "policies.retry.initial_backoff", "max_backoff": "policies.retry.max_backoff",
    "execution_timeout": "policies.execution_timeout",
}
# The longest google.protobuf.Duration (10000 years): a longer one overflowed protobuf's conversion (a traceback).
_DURATION_MAX_MS = 315_576_000_000 * 1000
_NUMBERS = {
    "catchup_cap": "policies.missed_runs.catchup_cap", "max_attempts": "policies.retry.max_attempts",
    "max_unknown_attempts": "policies.retry.max_unknown_attempts",
    "backoff_multiplier": "policies.retry.backoff_multiplier",
}


def add_schedule_flags(p: argparse.ArgumentParser, *, creating: bool) -> None:
    g = p.add_argument_group("schedule")
    g.add_argument("--file", "-f", metavar="FILE", help="JSON or TOML schedule (proto field names); flags override it")
    g.add_argument("--id", required=False, help="schedule id" + (" (required, here or in --file)" if creating else ""))
    g.add_argument("--tenant", help="tenant" + (" (default: default)" if creating else ""))
    g.add_argument("--cron", metavar="SPEC", help="cron spec, macro or '@every <duration>' (try `schedctl preview`)")
    g.add_argument("--tz", metavar="ZONE", help="IANA time zone the calendar is read in (default UTC)")
    g.add_argument("--pool", metavar="POOL", help="worker pool" + (" (default: default)" if creating else ""))
    g.add_argument("--task-type", metavar="TYPE", help="handler name (built-in: shell, http)")
    pay = g.add_mutually_exclusive_group()
    pay.add_argument("--payload", metavar="TEXT", help="payload bytes, e.g. a JSON document")
    pay.add_argument("--payload-file", metavar="FILE", help="read the payload from FILE ('-' for stdin)")
    pay.add_argument("--command", metavar="SHELL",
                     help="shorthand: task type `shell` with payload {\"command\": SHELL}")
    g.add_argument("--label", action="append", metavar="KEY=VALUE", default=None, help="label (repeatable)")
    g.add_argument("--start", metavar="RFC3339", help="first instant that may be planned (inclusive)")
    g.add_argument("--end", metavar="RFC3339", help="last instant that may be planned (inclusive: a planned time "
                   "equal to it still runs)")
    pol = p.add_argument_group("policies (docs/time.md)")
    for dest, (_, enum, prefix) in _ENUMS.items():
        pol.add_argument("--" + dest.replace("_", "-"), dest=dest, choices=enum_choices(enum, prefix))
    for dest in _DURATIONS:
        pol.add_argument("--" + dest.replace("_", "-"), dest=dest, metavar="DURATION", help="e.g. 90s, 5m, 1h")
    for dest in _NUMBERS:
        pol.add_argument("--" + dest.replace("_", "-"), dest=dest, metavar="N",
                         type=float if dest == "backoff_multiplier" else int)


def _read_file(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise InvalidArgument("file", f"cannot read {path}: {e.strerror}") from None
    try:
        data = tomllib.loads(text) if path.endswith(".toml") else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as e:
        raise InvalidArgument("file", f"{path} is not valid {'TOML' if path.endswith('.toml') else 'JSON'}: {e}") \
            from None
    if not isinstance(data, dict):
        raise InvalidArgument("file", f"{path} must hold one object (a schedule)")
    return data


def _paths(d: dict[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for k, v in d.items():
        if isinstance(v, dict) and k != "labels":
            out += _paths(v, f"{prefix}{k}.")
        else:
            out.append(prefix + k)
    return out


def _set(msg: Any, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for name in parents:
        msg = getattr(msg, name)
    field = msg.DESCRIPTOR.fields_by_name[leaf]
    if field.message_type is not None:  # a Duration
        getattr(msg, leaf).FromMilliseconds(value)
    else:
        setattr(msg, leaf, value)


def schedule_from_data(data: dict[str, Any], field: str, where: str) -> tuple[Any, list[str]]:
    """A Schedule message from one file object (proto JSON names; `payload` an object or a string), and the
    paths it set. `field` names the object in errors (`file`, `schedules[3]`), `where` the file."""
    s = spb.Schedule()
    data = dict(data)
    payload = data.pop("payload", None)
    try:
        json_format.ParseDict(data, s)
    except json_format.ParseError as e:
        raise InvalidArgument(field, f"{where}: {e}") from None
    paths = _paths(data)
    if payload is not None:
        s.payload = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        paths.append("payload")
    return s, paths


def build_schedule(args: argparse.Namespace, *, creating: bool) -> tuple[Any, list[str]]:
    """(Schedule message, paths that were set)."""
    s = spb.Schedule()
    paths: list[str] = []
    if args.file:
        s, paths = schedule_from_data(_read_file(args.file), "file", args.file)
    for dest, path in _SIMPLE.items():
        v = getattr(args, dest)
        if v is not None:
            setattr(s, path, v)
            paths.append(path)
    if args.command is not None:
        s.payload = json.dumps({"command": args.command}).encode()
        paths.append("payload")
        if args.task_type is None:
            s.task_type = "shell"
            paths.append("task_type")
    elif args.payload is not None:
        s.payload = args.payload.encode()
        paths.append("payload")
    elif args.payload_file is not None:
        try:
            s.payload = (Path("/dev/stdin") if args.payload_file == "-" else Path(args.payload_file)).read_bytes()
        except OSError as e:
            raise InvalidArgument("payload_file", f"cannot read {args.payload_file}: {e.strerror}") from None
        paths.append("payload")
    if args.label is not None:
        s.labels.clear()
        for item in args.label:
            k, sep, v = item.partition("=")
            if not sep or not k:
                raise InvalidArgument("label", f"{item!r} is not KEY=VALUE")
            if k in s.labels:  # the last one silently won: one of the two values was a mistake, say which key
                raise InvalidArgument("label", f"key {k!r} is given twice ({k}={s.labels[k]} and {item}); "
                                               "give each key once")
            s.labels[k] = v
        paths.append("labels")
    for dest, field in (("start", "start_at"), ("end", "end_at")):
        v = getattr(args, dest)
        if v is not None:
            getattr(s, field).FromMilliseconds(parse_instant(v, dest))
            paths.append(field)
    for dest, (path, enum, prefix) in _ENUMS.items():
        v = getattr(args, dest)
        if v is not None:
            _set(s, path, enum_value(enum, prefix, v))
            paths.append(path)
    for dest, path in _DURATIONS.items():
        v = getattr(args, dest)
        if v is not None:
            ms = parse_duration_ms(v, dest)  # (it has no sign: a negative one is not a duration)
            if ms > _DURATION_MAX_MS:
                raise InvalidArgument(dest, f"{v!r} is longer than a google.protobuf.Duration holds (10000 years)")
            _set(s, path, ms)
            paths.append(path)
    for dest, path in _NUMBERS.items():
        v = getattr(args, dest)
        if v is not None:
            if dest != "backoff_multiplier":  # a double takes any number; the server checks its 1-10
                # uint32 fields: the server checks its own bounds (1-10000, ...), but a value the field cannot
                # hold never reached it: protobuf raised ValueError, a traceback with exit 1.
                check_count("--" + dest.replace("_", "-"), v, most=UINT32_MAX)
            _set(s, path, v)
            paths.append(path)
    if creating:
        s.tenant = s.tenant or "default"
        s.worker_pool = s.worker_pool or "default"
        for field, flag in (("id", "--id"), ("spec", "--cron"), ("task_type", "--task-type or --command")):
            if not getattr(s, field):
                raise InvalidArgument(field, f"is required: pass {flag} or set `{field}` in --file")
    return s, sorted(set(paths))
