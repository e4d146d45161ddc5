"""etcd's error answers, turned into exceptions by the real client's own table.

The twin builds a stand-in for the gRPC error etcd would send (code and etcd's message text) and
passes it through `from_rpc_error`, so every error class, message and read/write distinction is the
one `EtcdClient` produces, and stays so when that table changes.
"""

from __future__ import annotations

import grpc

from scheduler.store.etcd.errors import EtcdError, from_rpc_error

__all__ = [
    "COMPACTED",
    "DUPLICATE_KEY",
    "EMPTY_KEY",
    "FUTURE_REVISION",
    "LEASE_EXISTS",
    "LEASE_NOT_FOUND",
    "REQUEST_TOO_LARGE",
    "TOO_MANY_OPS",
    "Status",
    "error",
]

_S = grpc.StatusCode


class Status(grpc.RpcError):
    """What etcd's gRPC server answers: a code and a message (the two things `from_rpc_error` reads)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


# etcd 3.5's texts (server/etcdserver/api/v3rpc/rpctypes/error.go), checked against a live 3.5.16.
EMPTY_KEY = Status(_S.INVALID_ARGUMENT, "etcdserver: key is not provided")
DUPLICATE_KEY = Status(_S.INVALID_ARGUMENT, "etcdserver: duplicate key given in txn request")
TOO_MANY_OPS = Status(_S.INVALID_ARGUMENT, "etcdserver: too many operations in txn request")
REQUEST_TOO_LARGE = Status(_S.INVALID_ARGUMENT, "etcdserver: request is too large")
FUTURE_REVISION = Status(_S.OUT_OF_RANGE, "etcdserver: mvcc: required revision is a future revision")
COMPACTED = Status(_S.OUT_OF_RANGE, "etcdserver: mvcc: required revision has been compacted")
LEASE_NOT_FOUND = Status(_S.NOT_FOUND, "etcdserver: requested lease not found")
LEASE_EXISTS = Status(_S.FAILED_PRECONDITION, "etcdserver: lease already exists")


def error(status: Status, *, write: bool) -> EtcdError:
    return from_rpc_error(status, write=write)
