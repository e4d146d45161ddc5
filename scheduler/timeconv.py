"""Epoch milliseconds -> protobuf `Timestamp` / `Duration`: the one home of the conversions that the
server side (`api/`, `dispatch/`), the worker SDK and the client all make at their protobuf edge.

Floor 1: it imports only google.protobuf, so the worker SDK and the client can use it without
pulling in the API layer. Reading goes through the messages' own `ToMilliseconds()`; validating a
caller's Timestamp or Duration (ranges, the field to blame) is the API's job (`api/convert`,
`api/inputs`).
"""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp


def ms_to_timestamp(ms: int) -> Timestamp:
    t = Timestamp()
    t.FromMilliseconds(ms)
    return t


def ms_to_duration(ms: int) -> Duration:
    d = Duration()
    d.FromMilliseconds(ms)
    return d
