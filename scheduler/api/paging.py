"""Page sizes and page tokens for the List* calls.

A token is opaque to clients: base64url of JSON holding where the previous page stopped and a hash
of the filters it was issued for. A token presented with other filters is refused (INVALID_ARGUMENT
naming `page_token`) instead of silently paging through a different result set. The hash covers the
position too, so a token edited by hand is refused as well (an outside audit, session 36: a position
changed to `pg-010` paged on from there). Tokens are not secret (they hold ids the caller may read
anyway), so they are not signed: the hash catches mistakes, not a client set on forging one, which
could only reach what it may list anyway.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Sequence
from typing import Any, Protocol

from scheduler.errors import InvalidArgument

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
MAX_TOKEN_LEN = 4096
# Bytes of entries one page may carry. gRPC clients refuse a response over 4 MiB unless told otherwise
# (grpcurl, the generated stubs on a default channel): a page of 100 schedules or dead letters with 64 KiB
# payloads was 6.5 MiB, and the call failed RESOURCE_EXHAUSTED at the default page size. A page that
# would pass this ends early, with a token.
PAGE_BYTES = 3 * 1024 * 1024


class _Sized(Protocol):
    def ByteSize(self) -> int: ...  # protobuf's name


def fitting(entries: Sequence[_Sized], budget: int = PAGE_BYTES) -> int:
    """How many of `entries`, in page order, fit in one response of at most `budget` bytes: at least
    one (a single entry is bounded by the input limits, far below the budget)."""
    total = 0
    for i, m in enumerate(entries):
        total += m.ByteSize() + 6  # the entry's tag and length
        if total > budget and i > 0:
            return i
    return len(entries)


def page_size(n: int) -> int:
    """0 -> the default; above the maximum -> clamped; negative -> INVALID_ARGUMENT."""
    if n < 0:
        raise InvalidArgument("page_size", f"{n} is negative")
    return DEFAULT_PAGE_SIZE if n == 0 else min(n, MAX_PAGE_SIZE)


def _filters_hash(filters: Any, position: Any) -> str:
    canon = json.dumps([filters, position], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


def encode_token(filters: Any, position: Any) -> str:
    raw = json.dumps({"f": _filters_hash(filters, position), "p": position}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str, filters: Any) -> Any:
    """The position stored in `token`, or None for the first page."""
    if not token:
        return None
    if len(token) > MAX_TOKEN_LEN:
        raise InvalidArgument("page_token", "is not a token this server issued")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        d = json.loads(raw)
        fh, pos = d["f"], d["p"]
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise InvalidArgument("page_token", "is not a token this server issued") from None
    if fh != _filters_hash(filters, pos):
        raise InvalidArgument("page_token", "was issued for other filters, or altered; start again without a token")
    return pos
