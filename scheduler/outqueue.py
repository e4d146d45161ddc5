"""A stream's outgoing messages, where a message put right behind one of the same kind joins it.

Every message on the worker stream costs both ends a fixed amount of Python (gRPC's write and read, the
generator hop, a wake-up) whatever it carries. Under load the writer falls behind the code that queues
acks, assignments and results, and the queue holds runs of messages of one kind: each run is sent as one
message. Only a message's neighbour is joined, so the order of kinds on the stream is unchanged (an
assignment never overtakes the cancel queued before it), and the repeated fields keep their order.
A joined message stays under a byte budget, far below gRPC's 4 MiB default receive limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

M = TypeVar("M")

# What a joined message may grow to (estimated bytes). A joined message is sent whole: this bounds the
# time one message holds the stream and what a receiver must take at once.
MAX_JOINED_BYTES = 1 << 20

Size = Callable[[M], int]
Join = Callable[[M, M], bool]  # join(last, new): True if `new` was folded into `last` (then not queued)


class JoiningQueue(asyncio.Queue["M | None"], Generic[M]):
    """asyncio.Queue (None ends the stream) whose `put_nowait` folds a message into the last one queued
    when `join` can; `size` estimates a message's bytes for the budget."""

    def __init__(self, join: Join[M], size: Size[M], budget: int = MAX_JOINED_BYTES) -> None:
        super().__init__()
        self._join = join
        self._size = size
        self._budget = budget
        self._last_bytes = 0  # estimated bytes of the last item queued (the only one a put can join)
        self.joined = 0  # messages folded into another (tests, metrics)

    def _put(self, item: M | None) -> None:
        # asyncio.Queue's documented hook for subclasses (PriorityQueue overrides it too). The item a
        # getter may be waiting for is the first; joining only ever changes the last.
        q = self._queue  # type: ignore[attr-defined]
        if item is not None and q:
            last = q[-1]
            if last is not None:
                n = self._size(item)
                if self._last_bytes + n <= self._budget and self._join(last, item):
                    self._last_bytes += n
                    self.joined += 1
                    return
                q.append(item)
                self._last_bytes = n
                return
        q.append(item)
        self._last_bytes = 0 if item is None else self._size(item)
