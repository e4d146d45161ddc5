"""The client's one exception: the gRPC status code, its message, and the fields the server named.

The server attaches a `google.rpc.Status` with `google.rpc.BadRequest` details to INVALID_ARGUMENT
(docs/api.md, Errors); grpcio-status decodes it from the `grpc-status-details-bin` trailer, so the
caller can say exactly which field to fix instead of echoing a flat string.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status


@dataclass(frozen=True)
class FieldViolation:
    field: str  # dotted path as in the proto, e.g. `schedule.spec` or `policies.retry.max_attempts`
    description: str

    def __str__(self) -> str:
        return f"{self.field}: {self.description}" if self.field else self.description


class ClientError(Exception):
    """A call failed. `code` is the gRPC status; `violations` lists the bad fields (INVALID_ARGUMENT)."""

    def __init__(self, code: grpc.StatusCode, message: str, violations: tuple[FieldViolation, ...] = ()) -> None:
        self.code = code
        self.message = message
        self.violations = violations
        super().__init__(self.describe())

    def describe(self) -> str:
        """`field: reason` lines when the server named fields, else the status message."""
        if self.violations:
            return "; ".join(str(v) for v in self.violations)
        return self.message or self.code.name


def from_rpc_error(err: grpc.RpcError) -> ClientError:
    """Decode a failed call (sync or aio) into a ClientError, rich details included when present."""
    code: grpc.StatusCode = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message: str = (err.details() if hasattr(err, "details") else "") or ""
    violations: list[FieldViolation] = []
    try:
        status = rpc_status.from_call(err)  # type: ignore[arg-type]  # AioRpcError has the Call methods it reads
    except (ValueError, AttributeError):  # details inconsistent with the status line: keep the line
        status = None
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                violations.extend(FieldViolation(v.field, v.description) for v in bad.field_violations)
    return ClientError(code, message, tuple(violations))
