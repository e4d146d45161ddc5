"""Pins the public v1 gRPC contract (proto/scheduler/v1/), read from the generated descriptors.

A failure here means a change to the wire contract. Renaming or renumbering a field, or changing a
method's streaming kind, breaks deployed clients and workers: do it only in a new API version. Adding
a method or field is allowed, but must be deliberate: extend the tables below in the same change.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor, FileDescriptor

from scheduler._gen.scheduler.v1 import (
    admin_service_pb2,
    cluster_pb2,
    execution_pb2,
    schedule_pb2,
    schedule_service_pb2,
    worker_service_pb2,
)

ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = ROOT / "proto"
PACKAGE = "scheduler.v1"

FILES: list[FileDescriptor] = [
    m.DESCRIPTOR
    for m in (
        schedule_pb2,
        execution_pb2,
        cluster_pb2,
        schedule_service_pb2,
        worker_service_pb2,
        admin_service_pb2,
    )
]

UNARY, SERVER_STREAM, BIDI = "unary", "server-stream", "bidi"

# service -> method -> (request type, response type, streaming kind)
SERVICES: dict[str, dict[str, tuple[str, str, str]]] = {
    "ScheduleService": {
        "CreateSchedule": ("CreateScheduleRequest", "CreateScheduleResponse", UNARY),
        "BatchCreateSchedules": ("BatchCreateSchedulesRequest", "BatchCreateSchedulesResponse", UNARY),
        "GetSchedule": ("GetScheduleRequest", "GetScheduleResponse", UNARY),
        "UpdateSchedule": ("UpdateScheduleRequest", "UpdateScheduleResponse", UNARY),
        "DeleteSchedule": ("DeleteScheduleRequest", "DeleteScheduleResponse", UNARY),
        "ListSchedules": ("ListSchedulesRequest", "ListSchedulesResponse", UNARY),
        "PauseSchedule": ("PauseScheduleRequest", "PauseScheduleResponse", UNARY),
        "ResumeSchedule": ("ResumeScheduleRequest", "ResumeScheduleResponse", UNARY),
        "TriggerSchedule": ("TriggerScheduleRequest", "TriggerScheduleResponse", UNARY),
        "RerunExecution": ("RerunExecutionRequest", "RerunExecutionResponse", UNARY),
        "Backfill": ("BackfillRequest", "BackfillProgress", SERVER_STREAM),
        "PreviewSchedule": ("PreviewScheduleRequest", "PreviewScheduleResponse", UNARY),
        "GetExecution": ("GetExecutionRequest", "GetExecutionResponse", UNARY),
        "ListExecutions": ("ListExecutionsRequest", "ListExecutionsResponse", UNARY),
        "ListSkips": ("ListSkipsRequest", "ListSkipsResponse", UNARY),
        "CancelExecution": ("CancelExecutionRequest", "CancelExecutionResponse", UNARY),
        "ListDeadLetters": ("ListDeadLettersRequest", "ListDeadLettersResponse", UNARY),
        "ReplayDeadLetter": ("ReplayDeadLetterRequest", "ReplayDeadLetterResponse", UNARY),
        "DiscardDeadLetter": ("DiscardDeadLetterRequest", "DiscardDeadLetterResponse", UNARY),
    },
    "WorkerService": {
        "Connect": ("WorkerMessage", "PlannerMessage", BIDI),
        "DiscoverPlanners": ("DiscoverPlannersRequest", "DiscoverPlannersResponse", UNARY),
    },
    "AdminService": {
        "GetClusterStatus": ("GetClusterStatusRequest", "GetClusterStatusResponse", UNARY),
        "Switchover": ("SwitchoverRequest", "SwitchoverResponse", UNARY),
        "SetWorkerAffinity": ("SetWorkerAffinityRequest", "SetWorkerAffinityResponse", UNARY),
        "DrainPlanner": ("DrainPlannerRequest", "DrainPlannerResponse", UNARY),
        "UndrainPlanner": ("UndrainPlannerRequest", "UndrainPlannerResponse", UNARY),
        "GetTime": ("GetTimeRequest", "GetTimeResponse", UNARY),
        "ListAuditEvents": ("ListAuditEventsRequest", "ListAuditEventsResponse", UNARY),
        "SetTenantQuota": ("SetTenantQuotaRequest", "SetTenantQuotaResponse", UNARY),
        "GetTenantQuota": ("GetTenantQuotaRequest", "GetTenantQuotaResponse", UNARY),
        "ListTenantQuotas": ("ListTenantQuotasRequest", "ListTenantQuotasResponse", UNARY),
        "DeleteTenantQuota": ("DeleteTenantQuotaRequest", "DeleteTenantQuotaResponse", UNARY),
    },
}

TS, DUR = "google.protobuf.Timestamp", "google.protobuf.Duration"
TOKEN = f"{PACKAGE}.FencingToken"

# message -> field -> (number, type). Types: scalar names, `repeated X`, `optional X` (explicit
# presence on a scalar), or a message/enum full name.
FIELDS: dict[str, dict[str, tuple[int, str]]] = {
    "FencingToken": {"partition": (1, "uint32"), "revision": (2, "int64")},
    "Assignment": {
        "execution_id": (1, "string"),
        "schedule_id": (2, "string"),
        "tenant": (3, "string"),
        "task_type": (4, "string"),
        "planned_at": (5, TS),
        "attempt": (6, "uint32"),
        "fencing_token": (7, TOKEN),
        "payload": (8, "bytes"),
        "deadline": (9, TS),
        "trigger": (10, f"{PACKAGE}.Trigger"),
        "timeout": (11, DUR),
        "start_timeout": (12, DUR),
        "start_in": (13, DUR),
    },
    "Result": {
        "execution_id": (1, "string"),
        "attempt": (2, "uint32"),
        "fencing_token": (3, TOKEN),
        "outcome": (4, f"{PACKAGE}.AttemptOutcome"),
        "error_class": (5, f"{PACKAGE}.ErrorClass"),
        "message": (6, "string"),
        "started_at": (7, TS),
        "finished_at": (8, TS),
        "retry_after": (9, DUR),
    },
    "Execution": {
        "execution_id": (1, "string"),
        "schedule_id": (2, "string"),
        "planned_at": (4, TS),
        "due_at": (5, TS),
        "state": (7, f"{PACKAGE}.ExecutionState"),
        "attempt": (9, "uint32"),
        "attempts": (10, f"repeated {PACKAGE}.AttemptRecord"),
        "fencing_token": (12, TOKEN),
    },
    "AttemptRecord": {"attempt": (1, "uint32"), "fencing_token": (4, TOKEN), "deadline": (8, TS)},
    "Schedule": {
        "id": (1, "string"),
        "tenant": (2, "string"),
        "spec": (3, "string"),
        "time_zone": (4, "string"),
        "payload": (7, "bytes"),
        "labels": (8, f"repeated {PACKAGE}.Schedule.LabelsEntry"),
        "state": (9, f"{PACKAGE}.ScheduleState"),
        "policies": (13, f"{PACKAGE}.SchedulePolicies"),
        "version": (14, "uint64"),
    },
    "UpdateScheduleRequest": {
        "schedule": (1, f"{PACKAGE}.Schedule"),
        "expected_version": (2, "optional uint64"),
        "update_mask": (3, "google.protobuf.FieldMask"),
    },
    "GetExecutionRequest": {"execution_id": (1, "string")},
    "PartitionStatus": {"partition": (1, "uint32"), "owner": (2, "string"), "fencing_token": (4, TOKEN)},
    "GetTimeResponse": {"server_time": (1, TS)},
    "ReplayDeadLetterRequest": {"execution_id": (1, "string"), "reason": (2, "string"),
                                "use_current_schedule": (3, "bool")},
    "DrainPlannerRequest": {"node_id": (1, "string"), "reason": (2, "string"), "force": (3, "bool")},
    "UndrainPlannerRequest": {"node_id": (1, "string")},
    "TenantQuota": {"tenant": (1, "string"), "max_schedules": (2, "uint64"), "max_executions_per_second": (3, "double"),
                    "max_backfill": (4, "uint64"), "max_labels": (5, "uint32"), "max_payload_bytes": (6, "uint32"),
                    "version": (7, "uint64")},
    "SetTenantQuotaRequest": {"tenant": (1, "string"), "default_quota": (2, "bool"),
                              "quota": (3, f"{PACKAGE}.TenantQuota"), "expected_version": (5, "optional uint64")},
    "ListSkipsRequest": {"schedule_id": (1, "string"), "planned": (2, f"{PACKAGE}.TimeRange")},
    "SkippedTime": {"schedule_id": (1, "string"), "planned_at": (2, TS), "reason": (3, f"{PACKAGE}.SkipReason"),
                    "execution_id": (4, "string")},
}

# The stream envelopes: oneof `body` member -> (number, message type).
ONEOFS: dict[str, dict[str, tuple[int, str]]] = {
    "WorkerMessage": {
        "hello": (1, "Hello"),
        "credits": (2, "Credits"),
        "heartbeat": (3, "Heartbeat"),
        "results": (4, "Results"),
        "drain": (5, "Drain"),
        "started": (6, "Started"),
    },
    "PlannerMessage": {
        "welcome": (1, "Welcome"),
        "assignments": (2, "Assignments"),
        "cancel": (3, "Cancel"),
        "result_ack": (4, "ResultAck"),
        "reattached": (5, "Reattached"),
        "start_ack": (6, "StartAck"),
        "probe": (7, "Probe"),
        "disarm": (8, "Disarm"),
        "heartbeat_ack": (9, "HeartbeatAck"),
    },
}


def _message(name: str) -> Descriptor:
    for f in FILES:
        if name in f.message_types_by_name:
            return f.message_types_by_name[name]
    raise KeyError(name)


def _type_name(field: FieldDescriptor) -> str:
    if field.message_type is not None:
        base = field.message_type.full_name
    elif field.enum_type is not None:
        base = field.enum_type.full_name
    else:
        base = {
            FieldDescriptor.TYPE_STRING: "string",
            FieldDescriptor.TYPE_BYTES: "bytes",
            FieldDescriptor.TYPE_BOOL: "bool",
            FieldDescriptor.TYPE_INT32: "int32",
            FieldDescriptor.TYPE_INT64: "int64",
            FieldDescriptor.TYPE_UINT32: "uint32",
            FieldDescriptor.TYPE_UINT64: "uint64",
            FieldDescriptor.TYPE_DOUBLE: "double",
        }[field.type]
    if field.is_repeated:
        return f"repeated {base}"
    # proto3 `optional` is a synthetic oneof named after its one field.
    oneof = field.containing_oneof
    if field.has_presence and field.message_type is None and (oneof is None or oneof.name == f"_{field.name}"):
        return f"optional {base}"
    return base


def _all_enums() -> list[EnumDescriptor]:
    out: list[EnumDescriptor] = []

    def walk(msg: Descriptor) -> None:
        out.extend(msg.enum_types)
        for nested in msg.nested_types:
            walk(nested)

    for f in FILES:
        out.extend(f.enum_types_by_name.values())
        for msg in f.message_types_by_name.values():
            walk(msg)
    return out


def _kind(client_streaming: bool, server_streaming: bool) -> str:
    return {
        (False, False): UNARY,
        (False, True): SERVER_STREAM,
        (True, True): BIDI,
        (True, False): "client-stream",
    }[(client_streaming, server_streaming)]


def test_every_v1_proto_file_is_pinned() -> None:
    on_disk = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "scheduler" / "v1").glob("*.proto"))
    assert on_disk == sorted(f.name for f in FILES)
    assert {f.package for f in FILES} == {PACKAGE}
    for f in FILES:
        proto = descriptor_pb2.FileDescriptorProto()
        f.CopyToProto(proto)
        assert proto.syntax == "proto3", f.name


def test_services_and_methods() -> None:
    actual: dict[str, dict[str, tuple[str, str, str]]] = {}
    for f in FILES:
        for service in f.services_by_name.values():
            actual[service.name] = {
                m.name: (
                    m.input_type.name,
                    m.output_type.name,
                    _kind(m.client_streaming, m.server_streaming),
                )
                for m in service.methods
            }
    assert actual == SERVICES


@pytest.mark.parametrize(("message", "fields"), sorted(FIELDS.items()))
def test_key_fields(message: str, fields: dict[str, tuple[int, str]]) -> None:
    desc = _message(message)
    actual = {
        name: (desc.fields_by_name[name].number, _type_name(desc.fields_by_name[name]))
        for name in fields
        if name in desc.fields_by_name
    }
    assert actual == fields


@pytest.mark.parametrize(("message", "members"), sorted(ONEOFS.items()))
def test_stream_envelopes(message: str, members: dict[str, tuple[int, str]]) -> None:
    desc = _message(message)
    assert list(desc.oneofs_by_name) == ["body"]
    body = desc.oneofs_by_name["body"]
    actual = {f.name: (f.number, f.message_type.name if f.message_type else "") for f in body.fields}
    assert actual == members
    assert len(desc.fields) == len(body.fields), "envelope fields belong in the oneof"


def test_enums_start_with_unspecified_and_are_prefixed() -> None:
    enums = _all_enums()
    assert len(enums) >= 10
    for enum in enums:
        prefix = "".join(f"_{c}" if c.isupper() else c.upper() for c in enum.name).lstrip("_")
        assert enum.values_by_number[0].name == f"{prefix}_UNSPECIFIED", enum.full_name
        bad = [v.name for v in enum.values if not v.name.startswith(f"{prefix}_")]
        assert not bad, f"{enum.full_name}: values must start with {prefix}_: {bad}"


def test_execution_ids_are_the_key_everywhere() -> None:
    """Everything that names one execution calls the field `execution_id` and types it string."""
    for name in (
        "Execution",
        "Assignment",
        "Result",
        "Cancel",
        "RunningAttempt",
        "AttemptRef",
        "ResultAckEntry",
        "GetExecutionRequest",
        "CancelExecutionRequest",
        "ReplayDeadLetterRequest",
        "DiscardDeadLetterRequest",
    ):
        field = _message(name).fields_by_name["execution_id"]
        assert (field.number, field.type) == (1, FieldDescriptor.TYPE_STRING), name


def test_list_methods_paginate() -> None:
    for method in ("ListSchedules", "ListExecutions", "ListSkips", "ListDeadLetters", "ListAuditEvents",
                   "ListTenantQuotas"):
        request, response = _message(f"{method}Request"), _message(f"{method}Response")
        assert _type_name(request.fields_by_name["page_size"]) == "int32", method
        assert _type_name(request.fields_by_name["page_token"]) == "string", method
        assert _type_name(response.fields_by_name["next_page_token"]) == "string", method


def _source_info(tmp: Path) -> descriptor_pb2.FileDescriptorSet:
    """Compile the v1 protos with comments kept (the generated descriptors drop them)."""
    from grpc_tools import protoc

    include = Path(protoc.__file__).parent / "_proto"
    out = tmp / "v1.pb"
    files = [str(p.relative_to(PROTO_ROOT)) for p in sorted((PROTO_ROOT / "scheduler" / "v1").glob("*.proto"))]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            "--include_source_info",
            f"--descriptor_set_out={out}",
            *files,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString(out.read_bytes())
    return fds


def _undocumented(file: descriptor_pb2.FileDescriptorProto) -> list[str]:
    """Fields, enums, enum values and methods of one file that have no comment."""
    commented = {
        tuple(loc.path)
        for loc in file.source_code_info.location
        if loc.leading_comments.strip() or loc.trailing_comments.strip()
    }
    missing: list[str] = []

    def check(path: tuple[int, ...], what: str) -> None:
        if path not in commented:
            missing.append(f"{file.name}: {what}")

    def walk_enum(enum: descriptor_pb2.EnumDescriptorProto, path: tuple[int, ...]) -> None:
        check(path, enum.name)
        for i, value in enumerate(enum.value):
            check((*path, 2, i), f"{enum.name}.{value.name}")

    def walk_message(msg: descriptor_pb2.DescriptorProto, path: tuple[int, ...], prefix: str) -> None:
        for i, field in enumerate(msg.field):
            check((*path, 2, i), f"{prefix}{msg.name}.{field.name}")
        for i, nested in enumerate(msg.nested_type):
            if not nested.options.map_entry:
                walk_message(nested, (*path, 3, i), f"{prefix}{msg.name}.")
        for i, enum in enumerate(msg.enum_type):
            walk_enum(enum, (*path, 4, i))

    # Source paths: 4 = message_type, 5 = enum_type, 6 = service; 2 = field / value / method.
    for i, msg in enumerate(file.message_type):
        walk_message(msg, (4, i), "")
    for i, enum in enumerate(file.enum_type):
        walk_enum(enum, (5, i))
    for i, service in enumerate(file.service):
        check((6, i), service.name)
        for j, method in enumerate(service.method):
            check((6, i, 2, j), f"{service.name}.{method.name}")
    return missing


def test_every_field_enum_value_and_method_is_documented(tmp_path: Path) -> None:
    """The comments are the contract's documentation: units and meaning on every element."""
    missing = [m for file in _source_info(tmp_path).file for m in _undocumented(file)]
    assert not missing, "undocumented proto elements:\n" + "\n".join(missing)
