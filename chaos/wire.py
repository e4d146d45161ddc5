"""A wire witness for fenced writes: reads the gRPC traffic between one planner and etcd (as the link's
fault proxy forwards it) and records every txn that carries a fence compare, with etcd's answer.

Why: I4c asks every pause or cut beyond the lease to show a stale write *refused*. A planner frozen
with a write held in its link (chaos/nemesis.py, F2) sends that write before its lease ended; it
reaches etcd after the takeover, where the fence compare must refuse it. The planner itself usually
never hears the answer (its call's deadline passed while it was frozen), and a refused txn leaves no
trace in etcd's history. The witness sees both halves on the wire: the request (which partition,
which token) and etcd's `succeeded = false` with the owner key as it is now. That is evidence from
outside the planner, as the checker requires.

Parsing: HTTP/2 frames after the client preface; only DATA frames are read (no HPACK state is needed:
a txn is recognised by its body, a TxnRequest whose first compare is `create_revision` of an
`owners/` key: the fence, scheduler/store/fenced.py). gRPC messages are length-prefixed inside the
DATA payloads of a stream, possibly split across frames and reads. The answer on the same stream id
is parsed as a TxnResponse. Anything that does not parse is ignored: the witness must never break
the link it watches.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import IO, Any

from scheduler._gen.etcd.etcdserverpb import rpc_pb2

__all__ = ["FencedTxn", "WireWitness", "read_wire"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _PADDED = 0x0, 0x8
_CREATE = 1  # Compare.CompareTarget.CREATE
_MAX_BUFFER = 1 << 22  # a stream's unparsed bytes beyond this: not a txn we can follow, dropped


@dataclass(frozen=True)
class FencedTxn:
    """One fenced txn seen on a planner's etcd link."""

    planner: str
    stream: int
    partition_key: str  # the owner key the fence compares
    token: int  # the create_revision the writer claims (its fencing token)
    sent_ms: int  # the request's last byte reached the proxy
    answered_ms: int  # etcd's answer reached the proxy
    succeeded: bool
    owner_revision: int  # create_revision of the owner key in etcd's answer (0: no owner)
    writes: int  # puts and deletes in the success branch
    fenced: bool = True  # False: a write without the fence compare (a planner with its fence switched off)

    @property
    def refused_by_fence(self) -> bool:
        return self.fenced and not self.succeeded and self.owner_revision != self.token


class _Direction:
    def __init__(self, expect_preface: bool) -> None:
        self.buf = bytearray()
        self.preface = expect_preface
        self.streams: dict[int, bytearray] = {}

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Complete gRPC messages (stream id, message bytes) found in `data` and what came before it."""
        self.buf += data
        out: list[tuple[int, bytes]] = []
        if self.preface:
            if len(self.buf) < len(PREFACE):
                return out
            if bytes(self.buf[: len(PREFACE)]) == PREFACE:
                del self.buf[: len(PREFACE)]
            self.preface = False
        while len(self.buf) >= 9:
            length = int.from_bytes(self.buf[0:3], "big")
            ftype, flags = self.buf[3], self.buf[4]
            stream = struct.unpack(">I", self.buf[5:9])[0] & 0x7FFFFFFF
            if len(self.buf) < 9 + length:
                break
            payload = bytes(self.buf[9 : 9 + length])
            del self.buf[: 9 + length]
            if ftype != _DATA or stream == 0:
                continue
            if flags & _PADDED and payload:
                pad = payload[0]
                payload = payload[1 : len(payload) - pad]
            acc = self.streams.setdefault(stream, bytearray())
            acc += payload
            while len(acc) >= 5:
                n = int.from_bytes(acc[1:5], "big")
                if len(acc) < 5 + n:
                    break
                compressed = acc[0]
                msg = bytes(acc[5 : 5 + n])
                del acc[: 5 + n]
                if not compressed:
                    out.append((stream, msg))
            if len(acc) > _MAX_BUFFER:
                del self.streams[stream]
        return out


class WireWitness:
    """Feed it both directions of one planner's etcd connection (each connection its own witness)."""

    def __init__(self, planner: str, owners_prefix: bytes, on_txn: Callable[[FencedTxn], None],
                 clock: Callable[[], int]) -> None:
        self.planner = planner
        self.owners = owners_prefix
        self.on_txn = on_txn
        self.clock = clock
        self._up = _Direction(expect_preface=True)
        self._down = _Direction(expect_preface=False)
        # stream -> (owner key or first written key, token, writes, t, fenced)
        self._pending: dict[int, tuple[bytes, int, int, int, bool]] = {}
        self.seen = 0  # fenced txns answered
        self.requests = 0  # fenced txns sent
        self.writes = 0  # txns that put a key under the cluster's prefix (fenced or not)
        # Writes only a partition's owner makes: fenced txns, and (from a planner whose fence is switched
        # off) unfenced ones that move a checkpoint. The F1/F2 nemeses act at the next one of these: a
        # write an API call or a result makes (a schedule, an audit event, a result CAS) is not fenced, so
        # a planner frozen with one held lands no stale write for I4c to see (a game day's F2 #149 froze on
        # a resume's write and was invalid).
        self.owned_writes = 0
        self.root = owners_prefix.rstrip(b"/").rsplit(b"/", 1)[0] + b"/"  # <prefix>/owners/ -> <prefix>/

    def client_bytes(self, data: bytes) -> None:
        try:
            for stream, msg in self._up.feed(data):
                self._request(stream, msg)
        except Exception:  # the witness never breaks the link
            self._up = _Direction(expect_preface=False)

    def server_bytes(self, data: bytes) -> None:
        try:
            for stream, msg in self._down.feed(data):
                self._response(stream, msg)
        except Exception:  # unparsable: ignored
            self._down = _Direction(expect_preface=False)

    def _request(self, stream: int, msg: bytes) -> None:
        try:
            req = rpc_pb2.TxnRequest.FromString(msg)
        except Exception:  # not a txn
            return
        puts = [op.request_put.key for op in req.success
                if op.HasField("request_put") and op.request_put.key.startswith(self.root)]
        if puts:
            self.writes += 1  # any write of the cluster's keys, fenced or not
        writes = sum(1 for op in req.success if op.HasField("request_put") or op.HasField("request_delete_range"))
        c = req.compare[0] if req.compare else None
        # create_revision == 0 is a claim ("the owner key is absent"), not a write under a fence.
        if c is not None and c.target == _CREATE and c.key.startswith(self.owners) and c.create_revision > 0:
            self._pending[stream] = (bytes(c.key), int(c.create_revision), writes, self.clock(), True)
            self.requests += 1
            self.owned_writes += 1
        elif puts and not any(x.key.startswith(self.owners) for x in req.compare) \
                and not any(k.startswith(self.owners) for k in puts):
            # A write of the cluster's keys without any fence (a planner with unsafe_disable_fencing): its
            # answer says whether the keys' own compares refused it. Claims and releases are left out.
            self._pending[stream] = (bytes(puts[0]), 0, writes, self.clock(), False)
            if any(k.startswith(self.root + b"checkpoints/") for k in puts):
                self.owned_writes += 1

    def _response(self, stream: int, msg: bytes) -> None:
        pending = self._pending.pop(stream, None)
        if pending is None:
            return
        try:
            resp = rpc_pb2.TxnResponse.FromString(msg)
        except Exception:  # unparsable: ignored
            return
        key, token, writes, sent, fenced = pending
        owner_rev = 0
        for r in resp.responses:
            if r.HasField("response_range"):
                for kv in r.response_range.kvs:
                    if bytes(kv.key) == key:
                        owner_rev = int(kv.create_revision)
        if resp.succeeded:
            owner_rev = token  # the fence held: the owner key is the writer's
        self.seen += 1
        self.on_txn(FencedTxn(self.planner, stream, key.decode(errors="replace"), token, sent, self.clock(),
                              bool(resp.succeeded), owner_rev, writes, fenced))


def writer(out: IO[str]) -> Callable[[FencedTxn], None]:
    """Log refused txns only (wire.jsonl): a succeeded fenced txn is every ordinary write, and etcd's
    history already holds those."""

    def write(t: FencedTxn) -> None:
        if not t.succeeded:
            out.write(json.dumps(asdict(t), separators=(",", ":")) + "\n")
            out.flush()

    return write


def read_wire(lines: list[dict[str, Any]]) -> list[FencedTxn]:
    known = FencedTxn.__dataclass_fields__
    return [FencedTxn(**{k: v for k, v in d.items() if k in known}) for d in lines]
