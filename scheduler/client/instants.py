"""Instants at the client edge: protobuf Timestamps from aware datetimes or epoch milliseconds."""

from __future__ import annotations

from datetime import datetime

from google.protobuf.timestamp_pb2 import Timestamp

from scheduler.timeconv import ms_to_timestamp

Instant = datetime | int  # an aware datetime, or milliseconds since the epoch (UTC)


def timestamp(value: Instant) -> Timestamp:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"{value!r} has no time zone: pass an aware datetime (UTC is safest)")
        return ms_to_timestamp(round(value.timestamp() * 1000))
    return ms_to_timestamp(int(value))
