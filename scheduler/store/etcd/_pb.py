"""The typed boundary to the generated etcd code: requests are built and responses converted here
and nowhere else. mypy skips `scheduler._gen`, so generated objects are `Any`; every value leaving
this module is converted explicitly (int(), bytes()...) into the frozen types of `types.py`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from scheduler._gen.etcd.etcdserverpb import rpc_pb2 as _rpc
from scheduler._gen.etcd.etcdserverpb import rpc_pb2_grpc as _rpc_grpc
from scheduler.store.etcd.ops import Compare, DeleteOp, Op, PutOp, RangeOp, TxnOp
from scheduler.store.etcd.types import (
    DeleteResult,
    EventType,
    KeyValue,
    LeaseTimeToLive,
    Member,
    OpResult,
    PutResult,
    RangeResult,
    ResponseHeader,
    SortOrder,
    SortTarget,
    Status,
    TxnResult,
    WatchEvent,
    WatchFilter,
)

_COMPARE_RESULT = {"==": 0, ">": 1, "<": 2, "!=": 3}  # etcd's Compare.CompareResult numbers
# Name of the Compare.target_union field for each CompareTarget value.
_COMPARE_FIELD = ("version", "create_revision", "mod_revision", "value", "lease")


def _wire(number: int) -> Any:
    """An enum field's wire number. protobuf accepts plain ints for enum fields; the generated
    stubs only declare their enum wrapper types, so this is the one place that says so."""
    return number


class Stubs:
    """The generated stubs of one channel, typed loosely on purpose (see module docstring)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.kv: Any = _rpc_grpc.KVStub(channel)
        self.watch: Any = _rpc_grpc.WatchStub(channel)
        self.lease: Any = _rpc_grpc.LeaseStub(channel)
        self.cluster: Any = _rpc_grpc.ClusterStub(channel)
        self.maintenance: Any = _rpc_grpc.MaintenanceStub(channel)
        self.auth: Any = _rpc_grpc.AuthStub(channel)


# ---- requests -----------------------------------------------------------------------------------


def range_request(op: RangeOp) -> Any:
    return _rpc.RangeRequest(
        key=op.key,
        range_end=op.range_end,
        limit=op.limit,
        revision=op.revision,
        sort_order=_wire(op.sort_order),
        sort_target=_wire(op.sort_target),
        serializable=op.serializable,
        keys_only=op.keys_only,
        count_only=op.count_only,
        min_mod_revision=op.min_mod_revision,
        max_mod_revision=op.max_mod_revision,
        min_create_revision=op.min_create_revision,
        max_create_revision=op.max_create_revision,
    )


def put_request(op: PutOp) -> Any:
    return _rpc.PutRequest(key=op.key, value=op.value, lease=op.lease, prev_kv=op.prev_kv)


def delete_request(op: DeleteOp) -> Any:
    return _rpc.DeleteRangeRequest(key=op.key, range_end=op.range_end, prev_kv=op.prev_kv)


# Txn requests are filled in place (add() + field assignment): building each sub-message and then
# copying it into the request costs 4x more CPU, which shows on 100-op fenced batches.


def _fill_op(m: Any, op: Op) -> None:
    if isinstance(op, PutOp):
        p = m.request_put
        p.key = op.key
        p.value = op.value
        p.lease = op.lease
        p.prev_kv = op.prev_kv
    elif isinstance(op, DeleteOp):
        m.request_delete_range.CopyFrom(delete_request(op))
    elif isinstance(op, TxnOp):
        _fill_txn(m.request_txn, op.compare, op.success, op.failure)
    else:
        _fill_range(m.request_range, op)


def _fill_range(r: Any, op: RangeOp) -> None:
    """In place, setting only what differs from the defaults: batches of single-key reads (the
    retention sweep's candidates, records read back after a create) carry one range per record."""
    r.key = op.key
    if op.range_end:
        r.range_end = op.range_end
    if op.limit:
        r.limit = op.limit
    if op.revision:
        r.revision = op.revision
    if op.sort_order != SortOrder.NONE:
        r.sort_order = _wire(op.sort_order)
    if op.sort_target != SortTarget.KEY:
        r.sort_target = _wire(op.sort_target)
    if op.serializable:
        r.serializable = True
    if op.keys_only:
        r.keys_only = True
    if op.count_only:
        r.count_only = True
    if op.min_mod_revision:
        r.min_mod_revision = op.min_mod_revision
    if op.max_mod_revision:
        r.max_mod_revision = op.max_mod_revision
    if op.min_create_revision:
        r.min_create_revision = op.min_create_revision
    if op.max_create_revision:
        r.max_create_revision = op.max_create_revision


def _fill_compare(m: Any, c: Compare) -> None:
    field = _COMPARE_FIELD[int(c.target)]
    if isinstance(c.operand, bytes) != (field == "value"):
        raise TypeError(f"compare on {c.target.name} needs {'bytes' if field == 'value' else 'an int'}")
    m.result = _wire(_COMPARE_RESULT[c.op])
    m.target = _wire(c.target)
    m.key = c.key
    m.range_end = c.range_end
    setattr(m, field, c.operand)  # also selects the target_union member


def _fill_txn(request: Any, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]) -> None:
    for c in compare:
        _fill_compare(request.compare.add(), c)
    for op in success:
        _fill_op(request.success.add(), op)
    for op in failure:
        _fill_op(request.failure.add(), op)


def txn_request(compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]) -> Any:
    request = _rpc.TxnRequest()
    _fill_txn(request, compare, success, failure)
    return request


def compaction_request(revision: int, physical: bool) -> Any:
    return _rpc.CompactionRequest(revision=revision, physical=physical)


def lease_grant_request(ttl: int, lease_id: int) -> Any:
    return _rpc.LeaseGrantRequest(TTL=ttl, ID=lease_id)


def lease_revoke_request(lease_id: int) -> Any:
    return _rpc.LeaseRevokeRequest(ID=lease_id)


def lease_keepalive_request(lease_id: int) -> Any:
    return _rpc.LeaseKeepAliveRequest(ID=lease_id)


def lease_ttl_request(lease_id: int, keys: bool) -> Any:
    return _rpc.LeaseTimeToLiveRequest(ID=lease_id, keys=keys)


def member_list_request(linearizable: bool) -> Any:
    return _rpc.MemberListRequest(linearizable=linearizable)


def status_request() -> Any:
    return _rpc.StatusRequest()


def authenticate_request(name: str, password: str) -> Any:
    return _rpc.AuthenticateRequest(name=name, password=password)


def watch_create_request(
    key: bytes,
    range_end: bytes,
    start_revision: int,
    progress_notify: bool,
    prev_kv: bool,
    filters: Sequence[WatchFilter],
) -> Any:
    return _rpc.WatchRequest(
        create_request=_rpc.WatchCreateRequest(
            key=key,
            range_end=range_end,
            start_revision=start_revision,
            progress_notify=progress_notify,
            prev_kv=prev_kv,
            filters=[_wire(f) for f in filters],
        )
    )


def watch_progress_request() -> Any:
    return _rpc.WatchRequest(progress_request=_rpc.WatchProgressRequest())


# ---- responses ----------------------------------------------------------------------------------


def header(h: Any) -> ResponseHeader:
    return ResponseHeader(int(h.cluster_id), int(h.member_id), int(h.revision), int(h.raft_term))


def key_value(kv: Any) -> KeyValue:
    return KeyValue(
        bytes(kv.key),
        bytes(kv.value),
        int(kv.create_revision),
        int(kv.mod_revision),
        int(kv.version),
        int(kv.lease),
    )


def range_result(r: Any, h: ResponseHeader | None = None) -> RangeResult:
    kvs = tuple(key_value(kv) for kv in r.kvs)
    return RangeResult(h or header(r.header), kvs, bool(r.more), int(r.count))


def put_result(r: Any, h: ResponseHeader | None = None) -> PutResult:
    return PutResult(h or header(r.header), key_value(r.prev_kv) if r.HasField("prev_kv") else None)


def delete_result(r: Any, h: ResponseHeader | None = None) -> DeleteResult:
    return DeleteResult(h or header(r.header), int(r.deleted), tuple(key_value(kv) for kv in r.prev_kvs))


def _op_result(r: Any, h: ResponseHeader, plain_put: PutResult | None = None) -> OpResult:
    kind = r.WhichOneof("response")
    if kind == "response_put":
        if plain_put is not None and not r.response_put.HasField("prev_kv"):
            return plain_put  # immutable and identical for every put of this txn: shared
        return put_result(r.response_put, h)
    if kind == "response_delete_range":
        return delete_result(r.response_delete_range, h)
    if kind == "response_range":
        return range_result(r.response_range, h)
    if kind == "response_txn":
        t = r.response_txn
        return TxnResult(h, bool(t.succeeded), tuple(_op_result(op, h, plain_put) for op in t.responses))
    raise ValueError(f"unexpected txn response kind {kind!r}")


def txn_result(r: Any) -> TxnResult:
    # The results inside a txn get the txn's header: etcd fills only `revision` in their own headers
    # (the same revision), and converting 100 half-empty headers was a third of a batch's CPU. Puts
    # without prev_kv carry nothing else, so they share one (frozen) result object.
    h = header(r.header)
    plain_put = PutResult(h, None)
    return TxnResult(h, bool(r.succeeded), tuple(_op_result(op, h, plain_put) for op in r.responses))


def lease_ttl(r: Any) -> LeaseTimeToLive:
    return LeaseTimeToLive(
        header(r.header), int(r.ID), int(r.TTL), int(r.grantedTTL), tuple(bytes(k) for k in r.keys)
    )


def members(r: Any) -> tuple[Member, ...]:
    return tuple(
        Member(int(m.ID), str(m.name), tuple(m.peerURLs), tuple(m.clientURLs), bool(m.isLearner))
        for m in r.members
    )


def status(r: Any) -> Status:
    return Status(
        header=header(r.header),
        version=str(r.version),
        db_size=int(r.dbSize),
        db_size_in_use=int(r.dbSizeInUse),
        leader=int(r.leader),
        raft_index=int(r.raftIndex),
        raft_term=int(r.raftTerm),
        raft_applied_index=int(r.raftAppliedIndex),
        errors=tuple(str(e) for e in r.errors),
        is_learner=bool(r.isLearner),
    )


def watch_event(e: Any) -> WatchEvent:
    prev = key_value(e.prev_kv) if e.HasField("prev_kv") else None
    return WatchEvent(EventType(int(e.type)), key_value(e.kv), prev)


def watch_events(r: Any) -> tuple[WatchEvent, ...]:
    return tuple(watch_event(e) for e in r.events)
