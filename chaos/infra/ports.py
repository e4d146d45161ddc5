"""Loopback ports for the servers tests start, chosen so that start-up does not lose races on a busy
machine.

Bind-and-release (`bind(0)`, read the port, close, hand it to a child) loses in two ways: the kernel
hands the same ephemeral port to any outgoing connection made meanwhile (etcd peers, gRPC channels,
other engineers' test runs), and a gRPC server binds with SO_REUSEPORT, so two of them on one port do
not even fail: they split the connections. So:

- a server that can bind port 0 and report what it bound (our planner: the `serving` log event)
  is started on port 0 and the port is read back (chaos/infra/planners.py);
- a server that must be told its port (etcd's peer and client URLs, a planner restarted on the
  address its workers dial) gets one from `pick_port()`: below the kernel's ephemeral range, where no
  outgoing connection ever lands, not handed out before by this process, and free when picked; the
  starter still retries on a bind error (`is_bind_error`), a bounded number of times, because
  another process may pick the same one;
- "nothing listens here" is `unused_port()`: a socket kept bound but not listening, so connections
  are refused and nobody can start a server there while the test relies on it.
"""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Iterator

# Lines servers print when a listen address is taken: Go's net package (etcd) and gRPC core (planner).
_BIND_ERRORS = ("address already in use", "failed to bind to address")

_FALLBACK_EPHEMERAL = (32768, 60999)  # Linux's default net.ipv4.ip_local_port_range
_LOWEST = 10_000  # below: ports that system services are configured on by convention
_handed_out: set[int] = set()
_rng = random.SystemRandom()  # not `random`: pytest-randomly reseeds it identically in every process


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (and for bind(0))."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return _FALLBACK_EPHEMERAL


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port() -> int:
    """A loopback port a server can be told to listen on (see the module docstring)."""
    low, high = ephemeral_range()
    # The widest stretch outside the ephemeral range, at or above _LOWEST.
    below, above = (_LOWEST, low - 1), (high + 1, 65_535)
    lo, hi = max(below, above, key=lambda r: r[1] - r[0])
    if hi - lo < 1000:  # an unusual kernel setting leaves no room: bind(0) is all there is
        return _kernel_port()
    for _ in range(1000):
        port = _rng.randint(lo, hi)
        if port not in _handed_out and _free(port):
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free loopback port in {lo}-{hi} after 1000 tries")


def _kernel_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    _handed_out.add(port)
    return port


@contextlib.contextmanager
def unused_port() -> Iterator[int]:
    """A port where connections are refused for as long as the block runs: it stays bound (not
    listening), so no server can appear there by chance."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def is_bind_error(text: str) -> bool:
    """Whether a server's log or stderr says its listen address was taken."""
    low = text.lower()
    return any(e in low for e in _BIND_ERRORS)
