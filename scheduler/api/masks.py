"""UpdateSchedule's field-mask semantics (schedule_service.proto, UpdateScheduleRequest).

- A listed path replaces that field of the stored schedule with the request's value; a listed
  field that is unset in the request goes back to its default (the mask says "change this").
- Empty mask: every mutable field that is set (non-default) in the request, leaf by leaf, so a
  client may send only `policies.overlap` without resetting the other policies.
- `*`: every mutable field, as in the request (unset ones go back to their defaults).
- `id`, `tenant`, `state`, `paused_reason` and output-only fields cannot be changed here.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from scheduler._gen.scheduler.v1 import schedule_pb2 as pb
from scheduler.errors import InvalidArgument

MUTABLE = ("spec", "time_zone", "worker_pool", "task_type", "payload", "labels", "start_at", "end_at", "policies")
IMMUTABLE = ("id", "tenant", "state", "paused_reason", "version", "created_at", "updated_at")
_OUTPUT_ONLY = ("version", "created_at", "updated_at")
# Messages treated as one value (never merged field by field).
_ATOMIC = ("google.protobuf.Timestamp", "google.protobuf.Duration")
MAX_PATHS = 64


def _is_map(f: Any) -> bool:
    return f.message_type is not None and f.message_type.GetOptions().map_entry


def _set_paths(m: Message, prefix: str) -> list[str]:
    out = []
    for f, _v in m.ListFields():
        path = f"{prefix}{f.name}"
        if f.message_type is not None and not _is_map(f) and f.message_type.full_name not in _ATOMIC \
                and not f.is_repeated:
            out += _set_paths(getattr(m, f.name), path + ".") or [path]
        else:
            out.append(path)
    return out


def effective_paths(req: pb.Schedule, stored: pb.Schedule, paths: list[str]) -> list[str]:
    """The paths to apply, validated (errors name `update_mask`)."""
    if len(paths) > MAX_PATHS:
        raise InvalidArgument("update_mask", f"has {len(paths)} paths; the limit is {MAX_PATHS}")
    if paths == ["*"]:
        return list(MUTABLE)
    if not paths:
        out = []
        for p in _set_paths(req, ""):
            top = p.split(".", 1)[0]
            if top in _OUTPUT_ONLY or top == "id":
                continue  # output-only fields are ignored on input; id names the schedule
            if top in IMMUTABLE:
                if getattr(req, top) != getattr(stored, top):
                    raise InvalidArgument(f"schedule.{top}", "cannot be changed by UpdateSchedule" +
                                          (" (use PauseSchedule/ResumeSchedule)" if top in ("state", "paused_reason")
                                           else ""))
                continue
            out.append(p)
        return out
    for p in paths:
        top = p.split(".", 1)[0]
        if p == "*":
            raise InvalidArgument("update_mask", "'*' must be the only path")
        if top in IMMUTABLE:
            raise InvalidArgument("update_mask", f"{p!r} cannot be changed by UpdateSchedule")
        if top not in MUTABLE:
            raise InvalidArgument("update_mask", f"{p!r} is not a Schedule field")
        _descend(pb.Schedule(), p)  # unknown sub-fields fail here
    return paths


def _descend(m: Message, path: str) -> tuple[Message, Any]:
    parts = path.split(".")
    for i, name in enumerate(parts):
        f = m.DESCRIPTOR.fields_by_name.get(name)
        if f is None:
            raise InvalidArgument("update_mask", f"{path!r}: {name!r} is not a field of {m.DESCRIPTOR.name}")
        if i == len(parts) - 1:
            return m, f
        if f.message_type is None or _is_map(f) or f.message_type.full_name in _ATOMIC:
            raise InvalidArgument("update_mask", f"{path!r}: {name!r} has no sub-fields")
        m = getattr(m, name)
    raise AssertionError("unreachable")


def apply(stored: pb.Schedule, req: pb.Schedule, paths: list[str]) -> pb.Schedule:
    """A copy of `stored` with each path taken from `req`."""
    out = pb.Schedule()
    out.CopyFrom(stored)
    for p in paths:
        dst, f = _descend(out, p)
        src, _ = _descend(req, p)
        if f.is_repeated:
            dst.ClearField(f.name)
            if _is_map(f):
                getattr(dst, f.name).update(getattr(src, f.name))
            else:
                getattr(dst, f.name).extend(getattr(src, f.name))
        elif f.message_type is not None or f.has_presence:
            dst.ClearField(f.name)
            if src.HasField(f.name):
                if f.message_type is not None:
                    getattr(dst, f.name).CopyFrom(getattr(src, f.name))
                else:
                    setattr(dst, f.name, getattr(src, f.name))
        else:
            setattr(dst, f.name, getattr(src, f.name))
    return out
