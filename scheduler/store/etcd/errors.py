"""One error hierarchy for the etcd client, and the one table that maps gRPC status codes onto it.

Reads and writes fail differently on purpose. A read that times out or finds etcd unreachable simply
did not happen (`Unavailable`), so it may be retried. A write that times out may or may not have been
applied: etcd can commit it after the client gave up. That is `OutcomeUnknown`, never "failed", and
never retried blindly: the caller re-reads before deciding (DESIGN.md, Ownership and fencing).
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from scheduler import errors as base

__all__ = [
    "Compacted",
    "EtcdError",
    "LeaseLost",
    "LeaseNotFound",
    "Malformed",
    "NoSpace",
    "OutcomeUnknown",
    "PermissionDenied",
    "RequestTooLarge",
    "Unauthenticated",
    "Unavailable",
    "from_rpc_error",
]


class EtcdError(base.SchedError):
    """Root of every error raised by the etcd client (under the project's one error root)."""

    def __init__(self, message: str, *, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class OutcomeUnknown(EtcdError, base.OutcomeUnknown):
    """A write whose result is unknown (timeout, lost connection): it may have been applied. Re-read."""


class Unavailable(EtcdError):
    """The request was not served: etcd unreachable, no leader, timed out (reads), or overloaded."""


class Compacted(EtcdError):
    """The requested revision is older than the compacted revision. `compact_revision` is 0 when
    etcd did not say which revision it compacted to (ranges); watches always say."""

    def __init__(self, compact_revision: int, message: str = "", *, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message or f"revision compacted (compact revision {compact_revision})", code=code)
        self.compact_revision = compact_revision


class LeaseNotFound(EtcdError):
    """The lease does not exist (expired, revoked, or never granted)."""


class LeaseLost(EtcdError):
    """Raised by `LeaseKeeper.check()` once the lease is gone or past its local deadline."""


class RequestTooLarge(EtcdError):
    """The request exceeds etcd's --max-request-bytes (or gRPC's message limit). Not applied."""


class NoSpace(EtcdError):
    """etcd's backend quota is exhausted (NOSPACE alarm); writes are refused until an operator acts."""


class Malformed(EtcdError):
    """etcd refused the request as malformed (INVALID_ARGUMENT: a txn naming one key twice, too many
    operations...). Nothing was applied, and sending it again gives the same answer: a bug of ours."""


class Unauthenticated(EtcdError):
    """Wrong user or password, or a token etcd no longer accepts."""


class PermissionDenied(EtcdError):
    """The authenticated user lacks the permission for this key range."""


@dataclass(frozen=True, slots=True)
class _Rule:
    code: grpc.StatusCode
    contains: str | None  # a fragment of etcd's message that narrows the code; None matches any message
    on_read: type[EtcdError]
    on_write: type[EtcdError]


_S = grpc.StatusCode

# THE mapping. First matching row wins, so message-specific rows come before catch-alls of one code.
# Messages are etcd's (api/v3rpc/rpctypes/error.go) or grpc-core's. Write rows for codes that can
# mean "the request reached etcd and then the answer was lost" are OutcomeUnknown; rows for errors
# etcd raises before proposing the request to raft (auth, size, quota, overload) are definite.
_RULES: tuple[_Rule, ...] = (
    _Rule(_S.OUT_OF_RANGE, "required revision has been compacted", Compacted, Compacted),
    _Rule(_S.NOT_FOUND, "lease not found", LeaseNotFound, LeaseNotFound),
    _Rule(_S.INVALID_ARGUMENT, "request is too large", RequestTooLarge, RequestTooLarge),
    _Rule(_S.RESOURCE_EXHAUSTED, "larger than max", RequestTooLarge, RequestTooLarge),
    _Rule(_S.RESOURCE_EXHAUSTED, "database space exceeded", NoSpace, NoSpace),
    _Rule(_S.RESOURCE_EXHAUSTED, "too many requests", Unavailable, Unavailable),
    _Rule(_S.UNAUTHENTICATED, None, Unauthenticated, Unauthenticated),
    _Rule(_S.INVALID_ARGUMENT, "authentication failed", Unauthenticated, Unauthenticated),
    _Rule(_S.INVALID_ARGUMENT, "user name is empty", Unauthenticated, Unauthenticated),
    _Rule(_S.INVALID_ARGUMENT, "revision of auth store is old", Unauthenticated, Unauthenticated),
    _Rule(_S.INVALID_ARGUMENT, None, Malformed, Malformed),
    _Rule(_S.PERMISSION_DENIED, None, PermissionDenied, PermissionDenied),
    _Rule(_S.UNAVAILABLE, None, Unavailable, OutcomeUnknown),
    _Rule(_S.DEADLINE_EXCEEDED, None, Unavailable, OutcomeUnknown),
    _Rule(_S.CANCELLED, None, Unavailable, OutcomeUnknown),
    _Rule(_S.UNKNOWN, None, EtcdError, OutcomeUnknown),
    # grpc.aio's own status for a batch that failed inside the client's core (`set_internal_error`): the
    # transport lost the call, typically a stream whose server ended it while we wrote to it, so the real
    # status is gone. It is no answer from etcd: a read may be sent again. The game day's harness watch
    # died of it when an F4 took a member down (docs/drills.md), as a planner's watch would have.
    _Rule(_S.INTERNAL, "Internal error from Core", Unavailable, OutcomeUnknown),
    _Rule(_S.INTERNAL, None, EtcdError, OutcomeUnknown),
)

# Unauthenticated errors that a fresh token cures (as opposed to a wrong password).
_REAUTH_FRAGMENTS = ("invalid auth token", "user name is empty", "revision of auth store is old")


def from_rpc_error(exc: grpc.RpcError, *, write: bool) -> EtcdError:
    """Translate a gRPC error into the client's hierarchy (the caller raises it `from exc`)."""
    code, details = _code_and_details(exc)
    for rule in _RULES:
        if rule.code == code and (rule.contains is None or rule.contains in details):
            cls = rule.on_write if write else rule.on_read
            message = f"{code.name}: {details}" if code is not None else details
            if cls is Compacted:
                return Compacted(0, message, code=code)
            return cls(message, code=code)
    return EtcdError(f"{code.name if code else 'UNKNOWN'}: {details}", code=code)


def token_expired(exc: grpc.RpcError) -> bool:
    """True when re-authenticating may cure `exc` (stale or missing token, not bad credentials)."""
    _, details = _code_and_details(exc)
    return any(fragment in details for fragment in _REAUTH_FRAGMENTS)


def _code_and_details(exc: grpc.RpcError) -> tuple[grpc.StatusCode | None, str]:
    # grpc.aio.AioRpcError and the sync grpc.Call both expose code()/details(); a bare RpcError does not.
    code_fn = getattr(exc, "code", None)
    details_fn = getattr(exc, "details", None)
    code = code_fn() if callable(code_fn) else None
    details = details_fn() if callable(details_fn) else str(exc)
    return (code if isinstance(code, grpc.StatusCode) else None), str(details or "")
