"""The one mapping from the project's errors to gRPC status codes (docs/api.md, Errors).

Every ScheduleService and AdminService handler runs inside `grpc_errors` (unary) or
`grpc_stream_errors` (server streaming). INVALID_ARGUMENT carries a google.rpc.BadRequest in the
rich status details (the `grpc-status-details-bin` trailer, built by grpcio-status), so clients can
name the bad field without parsing text. Anything unexpected becomes INTERNAL with a log line: a
request can fail, the server never crashes on one.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from scheduler import errors
from scheduler.execution import TransitionError
from scheduler.store.etcd.errors import EtcdError

log = logging.getLogger("scheduler.api")

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
_Self = TypeVar("_Self")
Context = grpc.aio.ServicerContext[Any, Any]

UNKNOWN_OUTCOME = "etcd is unreachable; if this was a write, its outcome is unknown: read again before retrying"

# Order matters: the first matching class wins (OutcomeUnknown before the EtcdError it subclasses).
_CODES: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (errors.AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (errors.VersionMismatch, grpc.StatusCode.ABORTED),
    (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (TransitionError, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (errors.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (errors.OutcomeUnknown, grpc.StatusCode.UNAVAILABLE),
    (EtcdError, grpc.StatusCode.UNAVAILABLE),
    (errors.FencedOut, grpc.StatusCode.UNAVAILABLE),
)


# Messages may quote client input; status travels in trailers (HTTP/2 headers, 8 KiB by default), so
# an oversized echo must not turn a clear INVALID_ARGUMENT into a transport error.
_MAX_TEXT = 1024
_MAX_FIELD = 200


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def to_status(exc: BaseException) -> grpc.Status:
    """The status a client sees for `exc` (with BadRequest details for InvalidArgument)."""
    code = next((c for cls, c in _CODES if isinstance(exc, cls)), grpc.StatusCode.INTERNAL)
    if code is grpc.StatusCode.INTERNAL:
        message = "internal error; the server logged it"
    elif code is grpc.StatusCode.UNAVAILABLE:
        message = f"{UNKNOWN_OUTCOME} ({exc})"
    else:
        message = str(exc)
    details = []
    if isinstance(exc, errors.InvalidArgument):
        bad = error_details_pb2.BadRequest(field_violations=[error_details_pb2.BadRequest.FieldViolation(
            field=_clip(exc.field, _MAX_FIELD), description=_clip(exc.reason, _MAX_TEXT))])
        packed = any_pb2.Any()
        packed.Pack(bad)
        details.append(packed)
    st = status_pb2.Status(code=getattr(code_pb2, code.name), message=_clip(message, _MAX_TEXT), details=details)
    return rpc_status.to_status(st)


async def abort(context: Context, exc: BaseException) -> NoReturn:
    st = to_status(exc)
    if st.code is grpc.StatusCode.INTERNAL:
        log.error("unexpected error in an API call", exc_info=exc)
    await context.abort(st.code, st.details, trailing_metadata=st.trailing_metadata)
    raise AssertionError("context.abort returned")  # pragma: no cover


def _ours(exc: BaseException) -> bool:
    """Errors to turn into a status: not grpc's own abort signal nor cancellation."""
    return isinstance(exc, Exception) and not isinstance(exc, grpc.aio.AbortError)


def grpc_errors(
    fn: Callable[[_Self, _Req, Context], Awaitable[_Resp]],
) -> Callable[[_Self, _Req, Context], Awaitable[_Resp]]:
    @functools.wraps(fn)
    async def wrapper(self: _Self, request: _Req, context: Context) -> _Resp:
        try:
            return await fn(self, request, context)
        except Exception as e:
            if not _ours(e):
                raise
            await abort(context, e)

    return wrapper


def grpc_stream_errors(
    fn: Callable[[_Self, _Req, Context], AsyncIterator[_Resp]],
) -> Callable[[_Self, _Req, Context], AsyncIterator[_Resp]]:
    @functools.wraps(fn)
    async def wrapper(self: _Self, request: _Req, context: Context) -> AsyncIterator[_Resp]:
        try:
            async for item in fn(self, request, context):
                yield item
        except Exception as e:
            if not _ours(e):
                raise
            await abort(context, e)

    return wrapper
