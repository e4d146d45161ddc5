"""The error table, the retry policy (reads may retry, writes never), and "outcome unknown" for real."""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest

from chaos.infra.etcd import EtcdCluster, EtcdFactory
from scheduler.store.etcd import (
    Compacted,
    Compare,
    EtcdClient,
    EtcdConfig,
    EtcdError,
    LeaseNotFound,
    NoSpace,
    OutcomeUnknown,
    PermissionDenied,
    RequestTooLarge,
    Unauthenticated,
    Unavailable,
)
from scheduler.store.etcd._pb import txn_request
from scheduler.store.etcd.connection import Connection, grpc_target
from scheduler.store.etcd.errors import Malformed, from_rpc_error

_S = grpc.StatusCode


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, None)


@pytest.mark.parametrize(
    ("code", "details", "on_read", "on_write"),
    [
        pytest.param(_S.UNAVAILABLE, "connection refused", Unavailable, OutcomeUnknown, id="unavailable"),
        pytest.param(_S.DEADLINE_EXCEEDED, "Deadline Exceeded", Unavailable, OutcomeUnknown, id="deadline"),
        pytest.param(_S.UNAVAILABLE, "etcdserver: request timed out", Unavailable, OutcomeUnknown, id="etcd-timeout"),
        pytest.param(_S.UNKNOWN, "stream reset", EtcdError, OutcomeUnknown, id="unknown"),
        pytest.param(_S.INTERNAL, "Internal error from Core", Unavailable, OutcomeUnknown, id="grpc-core-internal"),
        pytest.param(_S.INTERNAL, "etcdserver: something broke", EtcdError, OutcomeUnknown, id="internal"),
        pytest.param(_S.OUT_OF_RANGE, "etcdserver: mvcc: required revision has been compacted", Compacted,
                     Compacted, id="compacted"),
        pytest.param(_S.OUT_OF_RANGE, "etcdserver: mvcc: required revision is a future revision", EtcdError,
                     EtcdError, id="future-revision"),
        pytest.param(_S.NOT_FOUND, "etcdserver: requested lease not found", LeaseNotFound, LeaseNotFound,
                     id="lease-not-found"),
        pytest.param(_S.INVALID_ARGUMENT, "etcdserver: request is too large", RequestTooLarge, RequestTooLarge,
                     id="too-large-etcd"),
        pytest.param(_S.RESOURCE_EXHAUSTED, "Received message larger than max (3145739 vs. 2097152)",
                     RequestTooLarge, RequestTooLarge, id="too-large-grpc"),
        pytest.param(_S.RESOURCE_EXHAUSTED, "etcdserver: mvcc: database space exceeded", NoSpace, NoSpace,
                     id="nospace"),
        pytest.param(_S.UNAUTHENTICATED, "etcdserver: invalid auth token", Unauthenticated, Unauthenticated,
                     id="token"),
        pytest.param(_S.INVALID_ARGUMENT, "etcdserver: authentication failed, invalid user ID or password",
                     Unauthenticated, Unauthenticated, id="bad-password"),
        pytest.param(_S.PERMISSION_DENIED, "etcdserver: permission denied", PermissionDenied, PermissionDenied,
                     id="permission"),
        pytest.param(_S.INVALID_ARGUMENT, "etcdserver: duplicate key given in txn request", Malformed, Malformed,
                     id="other"),
    ],
)
def test_error_table(code: grpc.StatusCode, details: str, on_read: type[EtcdError],
                     on_write: type[EtcdError]) -> None:
    exc = _rpc_error(code, details)
    assert type(from_rpc_error(exc, write=False)) is on_read
    assert type(from_rpc_error(exc, write=True)) is on_write
    assert from_rpc_error(exc, write=True).code == code


class _CountingMethod:
    """Stands in for a generated stub method: always fails with `code`."""

    def __init__(self, code: grpc.StatusCode) -> None:
        self.code = code
        self.calls = 0

    async def __call__(self, request: Any, **kwargs: Any) -> Any:
        self.calls += 1
        raise _rpc_error(self.code, "etcdserver: leader changed")


async def test_writes_are_sent_once_reads_retry() -> None:
    conn = Connection(EtcdConfig(endpoints=("127.0.0.1:1",), read_retries=2, timeout=5.0))
    try:
        write = _CountingMethod(_S.UNAVAILABLE)
        with pytest.raises(OutcomeUnknown):
            await conn.unary(write, None, write=True)
        assert write.calls == 1

        read = _CountingMethod(_S.UNAVAILABLE)
        with pytest.raises(Unavailable):
            await conn.unary(read, None, write=False)
        assert read.calls == 3
    finally:
        await conn.close()


@pytest.mark.parametrize(
    ("endpoints", "target"),
    [
        (("127.0.0.1:2379",), "ipv4:127.0.0.1:2379"),
        (("http://10.0.0.1:1", "10.0.0.2:2"), "ipv4:10.0.0.1:1,10.0.0.2:2"),
        (("[::1]:2379", "https://[::2]:2"), "ipv6:[::1]:2379,[::2]:2"),
        (("etcd.example:2379",), "dns:///etcd.example:2379"),
    ],
)
def test_grpc_target(endpoints: tuple[str, ...], target: str) -> None:
    assert grpc_target(endpoints) == target


@pytest.mark.parametrize(
    "settings",
    [
        {"endpoints": ()},
        {"endpoints": ("a.example:1", "b.example:2")},
        {"endpoints": ("127.0.0.1",)},
        {"endpoints": ("127.0.0.1:1",), "username": "u"},
        {"endpoints": ("127.0.0.1:1",), "cert_file": "c.pem"},
        {"endpoints": ("127.0.0.1:1",), "timeout": 0},
    ],
)
def test_config_refuses_bad_settings(settings: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - any refusal will do; the message names the rule
        EtcdConfig(**settings)


def test_compare_operand_type_is_checked() -> None:
    with pytest.raises(TypeError):
        txn_request([Compare.value("k", "==", 1)], [], [])  # type: ignore[arg-type]


@pytest.mark.etcd
async def test_write_to_a_frozen_etcd_is_outcome_unknown(etcd_factory: EtcdFactory) -> None:
    server = etcd_factory()
    async with EtcdClient(server.config(read_retries=0)) as etcd:
        await etcd.put("warm", b"up")  # connect first, so the timeout is about etcd, not the dial
        server.pause(0)
        try:
            started = time.monotonic()
            with pytest.raises(OutcomeUnknown):
                await etcd.put("k", b"v", timeout=0.5)
            assert time.monotonic() - started < 2.0
            with pytest.raises(Unavailable):  # the same timeout on a read is a plain failure
                await etcd.range("k", timeout=0.5)
        finally:
            server.resume(0)
        # The write may or may not have landed: etcd reads it from its socket once resumed, and in
        # practice applies it, after the client gave up. That is why a timeout is not "failed".
        # Either way it landed at most once: the client did not send it again.
        kv = await etcd.get("k", timeout=5)
        assert kv is None or kv.version == 1


async def test_a_txn_writing_one_key_twice_is_malformed_and_the_guard_sees_it_first(etcd_server: EtcdCluster,
                                                                                    key_prefix: str) -> None:
    """etcd refuses the whole request (the pause wedge of issue 9); `duplicate_write` catches it unsent."""
    from scheduler.store.etcd.ops import put, txn
    from scheduler.store.txn_check import duplicate_write

    k = f"{key_prefix}dup".encode()
    ops = [txn([Compare.create_revision(k, "==", 0)], [put(k, b"a")]), txn([], [put(k, b"b")])]
    assert duplicate_write(ops) == k
    async with EtcdClient(etcd_server.config(timeout=2.0)) as c:
        with pytest.raises(Malformed, match="duplicate key"):
            await c.txn([], ops)
        assert await c.get(k) is None, "nothing of a refused txn is applied"
