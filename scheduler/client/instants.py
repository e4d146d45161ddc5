"""Instants at the client edge: protobuf Timestamps from aware datetimes or epoch milliseconds."""

from __future__ import annotations

from datetime import datetime

from google.protobuf.timestamp_pb2 import Timestamp

Instant = datetime | int  # an aware datetime, or milliseconds since the epoch (UTC)


def timestamp(value: Instant) -> Timestamp:
    t = Timestamp()
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"{value!r} has no time zone: pass an aware datetime (UTC is safest)")
        t.FromMilliseconds(round(value.timestamp() * 1000))
    else:
        t.FromMilliseconds(int(value))
    return t
