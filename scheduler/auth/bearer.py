"""The client side of bearer tokens: read a token file, and channel interceptors that send it as
`authorization: Bearer <token>` on every call (the client, `schedctl`, workers, planners' peer calls).

Metadata rather than grpc's call credentials: those are refused on a plaintext channel, and a dev cluster
on loopback may run with tokens but without TLS. Imports nothing of the server (the client and the
worker SDK load it).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from scheduler.errors import InvalidArgument

AUTHORIZATION = "authorization"

# grpc-stubs make the interceptor bases generic; grpcio's classes are not subscriptable at run time.
if TYPE_CHECKING:
    _UnaryUnaryBase = grpc.aio.UnaryUnaryClientInterceptor[Any, Any]
    _UnaryStreamBase = grpc.aio.UnaryStreamClientInterceptor[Any, Any]
    _StreamUnaryBase = grpc.aio.StreamUnaryClientInterceptor[Any, Any]
    _StreamStreamBase = grpc.aio.StreamStreamClientInterceptor[Any, Any]
else:
    _UnaryUnaryBase = grpc.aio.UnaryUnaryClientInterceptor
    _UnaryStreamBase = grpc.aio.UnaryStreamClientInterceptor
    _StreamUnaryBase = grpc.aio.StreamUnaryClientInterceptor
    _StreamStreamBase = grpc.aio.StreamStreamClientInterceptor


def read_token_file(path: str, field_name: str = "token_file") -> str:
    """The token in `path` (surrounding whitespace dropped): InvalidArgument naming the field if the file
    is unreadable or empty."""
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise InvalidArgument(field_name, f"cannot read {path}: {e.strerror or e}") from None
    if not token or any(c.isspace() for c in token):
        raise InvalidArgument(field_name, f"{path} holds no token (one line, no spaces)")
    return token


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return ((AUTHORIZATION, f"Bearer {token}"),) if token else ()


def _with_token(details: Any, token: str) -> Any:
    md = grpc.aio.Metadata(*tuple(details.metadata or ()))
    md.add(AUTHORIZATION, f"Bearer {token}")
    return grpc.aio.ClientCallDetails(details.method, details.timeout, md, details.credentials,
                                      details.wait_for_ready)


class _UnaryUnary(_UnaryUnaryBase):
    def __init__(self, token: str) -> None:
        self.token = token

    async def intercept_unary_unary(self, continuation: Callable[..., Any], client_call_details: Any,
                                    request: Any) -> Any:
        return await continuation(_with_token(client_call_details, self.token), request)


class _UnaryStream(_UnaryStreamBase):
    def __init__(self, token: str) -> None:
        self.token = token

    async def intercept_unary_stream(self, continuation: Callable[..., Any], client_call_details: Any,
                                     request: Any) -> Any:
        return await continuation(_with_token(client_call_details, self.token), request)


class _StreamUnary(_StreamUnaryBase):
    def __init__(self, token: str) -> None:
        self.token = token

    async def intercept_stream_unary(self, continuation: Callable[..., Any], client_call_details: Any,
                                     request_iterator: Any) -> Any:
        return await continuation(_with_token(client_call_details, self.token), request_iterator)


class _StreamStream(_StreamStreamBase):
    def __init__(self, token: str) -> None:
        self.token = token

    async def intercept_stream_stream(self, continuation: Callable[..., Any], client_call_details: Any,
                                      request_iterator: Any) -> Any:
        return await continuation(_with_token(client_call_details, self.token), request_iterator)


def bearer_interceptors(token: str | None) -> list[Any]:
    """For `grpc.aio.insecure_channel(..., interceptors=...)` (or a secure one); none without a token. (Typed
    Any: grpc-stubs declare the channel's interceptor list as a placeholder type.)"""
    if not token:
        return []
    return [_UnaryUnary(token), _UnaryStream(token), _StreamUnary(token), _StreamStream(token)]
