"""The server interceptor: authenticate every call, apply the method's rule, record admin and operator
actions in the audit log.

The check runs inside the handler it wraps, not in `intercept_service`: only the handler's context has
`auth_context()`, the verified client certificate. Deny by default: a method without a rule in
scheduler/auth/rules.py is refused. Without an authenticator (no `auth_file`: the dev cluster on
loopback) every call passes as no principal, and the audit log still records who did what as
`anonymous`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

import grpc

from scheduler.auth.audit import AuditLog, audited, target_of
from scheduler.auth.authn import Authenticator
from scheduler.auth.current import set_current
from scheduler.auth.principal import Principal, Role
from scheduler.auth.ratelimit import RateLimiter
from scheduler.auth.rules import Need, Rule, rule_for
from scheduler.errors import Unauthenticated

log = logging.getLogger("scheduler.auth")

Context = grpc.aio.ServicerContext[Any, Any]
if TYPE_CHECKING:  # generic in grpc-stubs, not subscriptable at run time
    _ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    _ServerInterceptor = grpc.aio.ServerInterceptor


class AuthInterceptor(_ServerInterceptor):
    def __init__(self, authn: Authenticator | None, audit: AuditLog | None = None,
                 limiter: RateLimiter | None = None) -> None:
        self.authn, self.audit, self.limiter = authn, audit, limiter

    async def _admit(self, method: str, rule: Rule | None, context: Context) -> Principal | None:
        """The call's principal, or abort with UNAUTHENTICATED / PERMISSION_DENIED."""
        if self.authn is None:
            return None
        if rule is None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{method} has no access rule: refused")
            raise AssertionError("unreachable")
        if rule.need is Need.OPEN:
            return None
        try:
            p = self.authn.authenticate(context.invocation_metadata(), context.auth_context())  # type: ignore[arg-type]
        except Unauthenticated as e:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(e))
            raise AssertionError("unreachable") from None
        if not rule.admits(p):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"{p.name} may not call {method.rsplit('/', 1)[-1]}: it needs {rule.describe()}")
        if self.limiter is not None and rule.need is not Need.WORKER and not p.has_system(Role.PLANNER):
            wait = self.limiter.take(p.name)
            if wait > 0:
                await _abort_rate_limited(context, p.name, wait)
        return p

    async def _record(self, method: str, p: Principal | None, request: Any, context: Context,
                      error: BaseException | None) -> None:
        if self.audit is None or not audited(method):
            return
        code = context.code() if hasattr(context, "code") else None
        if isinstance(code, int) and not isinstance(code, grpc.StatusCode):
            code = next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)
        if code is None:
            code = grpc.StatusCode.OK if error is None else grpc.StatusCode.UNKNOWN
        details = context.details() if hasattr(context, "details") else ""
        if isinstance(details, bytes):
            details = details.decode(errors="replace")
        await self.audit.record(p.name if p else "anonymous", method.rsplit("/", 1)[-1], target_of(request),
                                code.name, str(details or ""))

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or (self.authn is None and not (self.audit and audited(method))):
            return handler
        rule = rule_for(method)
        return _wrap(handler, method, rule, self)


async def _abort_rate_limited(context: Context, name: str, wait: float) -> None:
    """RESOURCE_EXHAUSTED with a google.rpc.RetryInfo detail (the standard retry hint) and the wait in the text."""
    from google.protobuf import any_pb2
    from google.protobuf.duration_pb2 import Duration
    from google.rpc import code_pb2, error_details_pb2, status_pb2
    from grpc_status import rpc_status

    delay = Duration()
    delay.FromMilliseconds(max(1, round(wait * 1000)))
    info = any_pb2.Any()
    info.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
    st = rpc_status.to_status(status_pb2.Status(
        code=code_pb2.RESOURCE_EXHAUSTED, details=[info],
        message=f"{name} is over its request rate on this planner; retry in {wait:.3f} s"))
    await context.abort(st.code, st.details, trailing_metadata=st.trailing_metadata)


def _wrap(h: grpc.RpcMethodHandler[Any, Any], method: str, rule: Rule | None,
          ic: AuthInterceptor) -> grpc.RpcMethodHandler[Any, Any]:
    if h.unary_unary is not None:
        inner_uu = h.unary_unary

        async def uu(request: Any, context: Context) -> Any:
            p = await ic._admit(method, rule, context)
            set_current(p)
            try:
                out = await inner_uu(request, context)  # type: ignore[arg-type]
            except BaseException as e:
                await ic._record(method, p, request, context, e)
                raise
            await ic._record(method, p, request, context, None)
            return out

        return grpc.unary_unary_rpc_method_handler(uu, h.request_deserializer, h.response_serializer)
    if h.unary_stream is not None:
        inner_us = h.unary_stream

        async def us(request: Any, context: Context) -> AsyncIterator[Any]:
            p = await ic._admit(method, rule, context)
            set_current(p)
            try:
                result = inner_us(request, context)  # type: ignore[arg-type]
                if hasattr(result, "__aiter__"):  # an async generator (ours): one extra hop per message
                    async for item in result:
                        yield item
                else:  # a coroutine writing with context.write
                    await cast(Awaitable[Any], result)
            except BaseException as e:
                await ic._record(method, p, request, context, e)
                raise
            await ic._record(method, p, request, context, None)

        return grpc.unary_stream_rpc_method_handler(us, h.request_deserializer, h.response_serializer)
    if h.stream_unary is not None:
        inner_su = h.stream_unary

        async def su(request_iterator: Any, context: Context) -> Any:
            p = await ic._admit(method, rule, context)
            set_current(p)
            return await inner_su(request_iterator, context)  # type: ignore[arg-type]

        return grpc.stream_unary_rpc_method_handler(su, h.request_deserializer, h.response_serializer)
    inner_ss = h.stream_stream
    assert inner_ss is not None

    async def ss(request_iterator: Any, context: Context) -> AsyncIterator[Any]:
        p = await ic._admit(method, rule, context)
        set_current(p)
        result = inner_ss(request_iterator, context)  # type: ignore[arg-type]
        if hasattr(result, "__aiter__"):  # the worker stream: one extra hop per message, nothing more
            async for item in result:
                yield item
        else:
            await cast(Awaitable[Any], result)

    return grpc.stream_stream_rpc_method_handler(ss, h.request_deserializer, h.response_serializer)
