"""Clock skew for one process (F6, process tier): libfaketime, with an offset the harness changes while
the process runs.

    clock = SkewedClock(run_dir / "r1-p0.faketime")      # writes "+0" to the file
    proc = spawn(argv, log, env=clock.apply(os.environ))  # only planners get this env, never etcd
    clock.set_offset(30)                                  # the child's wall clock is now +30 s
    clock.clear()                                         # back to real time (the file stays)

How: the child is started with `LD_PRELOAD` of libfaketime and `FAKETIME_TIMESTAMP_FILE` naming a
file that holds the offset; `FAKETIME_NO_CACHE=1` makes libfaketime re-read the file on every
wall-clock call, so a change is seen by the very next `time.time()` (tests/chaos/test_clock.py,
a child polling every ~1 ms: 1-2 ms typically, up to 90 ms on this loaded 2-core machine: the
child's scheduling, not libfaketime).
`FAKETIME_DONT_FAKE_MONOTONIC=1` leaves `CLOCK_MONOTONIC` (and so `time.monotonic()`, asyncio's loop
clock, lease deadlines, gRPC's timers) alone: the fault is a wrong wall clock, not a wrong stopwatch.

Caveats, each found on this machine (libfaketime 0.9.10, Debian 12) and tested:

- **Use libfaketimeMT.so.1, not libfaketime.so.1.** With `FAKETIME_NO_CACHE=1` every wall-clock
  call re-reads and re-parses the file into libfaketime's globals; the plain library does that
  unlocked, and with 4 threads calling `time.time()` about 1 call in 3000 returned the *real* time
  (offset 0) for an instant, with a constant file. A planner has gRPC's threads. The MT build
  serialises the path: no wrong reading in the same test. `library()` picks the MT build.
- **File format.** One line, a signed number of seconds (`+30.000000`, `-3600.000000`); fractions
  work. libfaketime also reads unit suffixes, but `m` means *minutes* (`+30m` is +1800 s) and there
  is no `s`-means-seconds guarantee, so this module only ever writes plain seconds and parses the
  catalogue's `+30s`/`-1h` itself (`parse_offset`). An unparsable file makes libfaketime print an
  error and **exit the process**; hence writes go to a temporary file renamed over the real one
  (a reader sees the old or the new content, never half a line). An empty or missing file means
  real time (offset 0), but `clear()` writes `+0` rather than relying on that.
- **Absolute times.** `@2024-03-31 01:59:50` (start the clock there) is not used: with the file
  re-read on every call its meaning depends on libfaketime's start-time bookkeeping. `set_wall()`
  turns an instant into an offset from the harness's real clock instead, which is what
  `cluster.wall_clock_start` needs.
- **Cost.** Re-reading the file costs about 6 us per wall-clock call (1e5 `time.time()` in 0.6 s,
  against 0.02 s with a cache); monotonic calls are not slowed. `cache_duration=N` (whole seconds,
  `FAKETIME_CACHE_DURATION`) makes wall calls cheap again, at the price of up to N + 1 s before a
  change is seen (0.95-1.85 s measured for N = 1): the fault then starts that much later than
  `changes` records.
- **File times.** libfaketime also shifts `stat()` times by default; `NO_FAKE_STAT=1` turns that off,
  so a skewed planner does not see its source files as changed (Python's .pyc check) or write
  future mtimes the harness would then misread.
- **Inheritance.** The variables are ordinary environment: a child process of a skewed process is
  skewed too, following the same file (tested with a grandchild). A process that scrubs its
  environment (or a static binary, or one that reads the clock by raw syscall / vDSO without libc's
  `clock_gettime`, such as Go programs like etcd) is not affected; etcd must not get this env anyway.
- **What is not faked.** Only the one process tree: etcd's lease TTLs run on etcd's own clock, and the
  client's lease deadline is monotonic, so a skewed planner keeps its lease (tested with a real etcd
  and the project's LeaseKeeper across +1 h and -1 h jumps).
- **Event loops.** asyncio's loop runs on `time.monotonic()`, so timers and `sleep`s are unaffected
  (tested: a child with a running loop, a gRPC channel and two threads). uvloop is not a dependency
  of this project and is not installed here, so it is untested; libuv's timers read
  `CLOCK_MONOTONIC` too, which is not faked.
- The `FAKETIME` variable, if the parent had one, is removed from the env: it would take precedence
  over the file and the offset could not change.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "FAKETIME_DIRS",
    "ClockChange",
    "FaketimeMissing",
    "PlannerClockSet",
    "SkewedClock",
    "library",
    "parse_offset",
]

# Where Debian's libfaketime package (scripts/setup.sh) puts the preload libraries; others as fallbacks.
FAKETIME_DIRS = (
    Path("/usr/lib/x86_64-linux-gnu/faketime"),
    Path("/usr/lib/aarch64-linux-gnu/faketime"),
    Path("/usr/lib/faketime"),
    Path("/usr/local/lib/faketime"),
)
_ENV_OVERRIDE = "SCHED_LIBFAKETIME"  # a path to the .so, for machines that keep it elsewhere

_OFFSET = re.compile(r"^([+-]?)(\d+(?:\.\d+)?)([smhd]?)$")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class FaketimeMissing(RuntimeError):
    """libfaketime is not installed (scripts/setup.sh installs Debian's `faketime` package)."""


def library(*, multithreaded: bool = True) -> Path:
    """The libfaketime preload library: `$SCHED_LIBFAKETIME`, else the MT build (see the module
    docstring for why) in the usual directories. Raises FaketimeMissing."""
    override = os.environ.get(_ENV_OVERRIDE)
    if override:
        path = Path(override)
        if path.is_file():
            return path
        raise FaketimeMissing(f"${_ENV_OVERRIDE}={override} is not a file")
    name = "libfaketimeMT.so.1" if multithreaded else "libfaketime.so.1"
    for d in FAKETIME_DIRS:
        if (d / name).is_file():
            return d / name
    raise FaketimeMissing(f"{name} not found in {', '.join(map(str, FAKETIME_DIRS))}: install the "
                          f"`faketime` package (scripts/setup.sh) or set ${_ENV_OVERRIDE}")


def parse_offset(text: str | float) -> float:
    """Seconds from the catalogue's F6 offsets (`+30s`, `-30s`, `+1h`, `-1h`) or any `[+-]N[smhd]`;
    a number passes through."""
    if isinstance(text, int | float):
        return float(text)
    m = _OFFSET.match(text.strip())
    if m is None:
        raise ValueError(f"clock offset {text!r}: expected [+-]N[s|m|h|d], e.g. +30s or -1h")
    sign, number, unit = m.groups()
    value = float(number) * _UNITS[unit]
    return -value if sign == "-" else value


def _format(seconds: float) -> str:
    # Plain signed seconds only: libfaketime reads a suffix `m` as minutes (module docstring).
    return f"{seconds:+.6f}\n"


@dataclass(frozen=True)
class ClockChange:
    """One change of the offset: the harness's (real) wall time in epoch ms and the new offset."""

    t_ms: int
    offset_s: float


class SkewedClock:
    """The wall-clock offset of the processes started with `env()`/`apply()`; change it at any time.

    `path` is the timestamp file (created now, with the initial offset). Every change is recorded in
    `changes` with the harness's wall time, for the runner's fault windows and run.json's
    `clock_offset_ms`.
    """

    def __init__(self, path: Path | str, offset: float | str = 0.0, *, lib: Path | None = None,
                 cache_duration: int | None = None) -> None:
        if cache_duration is not None and cache_duration < 1:
            raise ValueError("cache_duration is whole seconds >= 1 (None: re-read on every call)")
        self.path = Path(path)
        self.lib = lib if lib is not None else library()
        self.cache_duration = cache_duration
        self.changes: list[ClockChange] = []
        self._offset = 0.0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.set_offset(offset)

    @property
    def offset(self) -> float:
        """The offset now in the file, seconds (positive: the process's clock is ahead)."""
        return self._offset

    @property
    def offset_ms(self) -> int:
        return round(self._offset * 1000)

    def env(self) -> dict[str, str]:
        """The variables to add to a process's environment (LD_PRELOAD holds only libfaketime:
        use `apply()` to keep a preload the environment already has)."""
        env = {
            "LD_PRELOAD": str(self.lib),
            "FAKETIME_TIMESTAMP_FILE": str(self.path),
            # 0.9.10 reads FAKETIME_DONT_FAKE_MONOTONIC; older releases read DONT_FAKE_MONOTONIC.
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "DONT_FAKE_MONOTONIC": "1",
            "NO_FAKE_STAT": "1",
        }
        if self.cache_duration is None:
            env["FAKETIME_NO_CACHE"] = "1"
        else:
            env["FAKETIME_CACHE_DURATION"] = str(self.cache_duration)
        return env

    def apply(self, base: Mapping[str, str]) -> dict[str, str]:
        """`base` (e.g. os.environ) plus `env()`: an existing LD_PRELOAD is kept after libfaketime,
        a FAKETIME variable is dropped (it would override the file)."""
        out = {k: v for k, v in base.items() if k not in ("FAKETIME", "FAKETIME_NO_CACHE", "FAKETIME_CACHE_DURATION")}
        mine = self.env()
        preload = [p for p in base.get("LD_PRELOAD", "").replace(":", " ").split() if p != str(self.lib)]
        mine["LD_PRELOAD"] = " ".join([str(self.lib), *preload])
        out.update(mine)
        return out

    def set_offset(self, seconds: float | str) -> None:
        """Make the processes' wall clock `seconds` ahead of real time (negative: behind), from
        their next wall-clock call on (or within `cache_duration`)."""
        value = parse_offset(seconds)
        if not math.isfinite(value):
            raise ValueError(f"clock offset must be finite, not {value}")
        # Rename over the file: libfaketime opens it by name on each read, so it sees the old file
        # or the new one whole. A torn read would make it exit the process (module docstring).
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(_format(value))
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._offset = value
        self.changes.append(ClockChange(time.time_ns() // 1_000_000, value))

    def set_wall(self, epoch_s: float) -> None:
        """Make the processes' wall clock read `epoch_s` now (and advance in real time from there):
        `cluster.wall_clock_start`. The offset is taken against this process's clock."""
        self.set_offset(epoch_s - time.time())

    def clear(self) -> None:
        """Back to real time. The file stays (the processes still read it), holding +0."""
        self.set_offset(0.0)


class PlannerClockSet:
    """One SkewedClock per node whose wall clock a drill moves, under `directory`: what the runner starts
    those processes with (`env_for`) and turns while they run (`set_offset`, for F6).

    `base_offset` is the whole cluster's shift (`cluster.wall_clock_start`, to put a DST transition in
    the window): every planner and worker gets it, and an F6 skew is added on top. Without it only the
    planners F6 targets get a preload, so the others pay nothing for the file read behind every
    wall-clock call. etcd and the harness are never shifted."""

    def __init__(self, directory: Path, nodes: Iterable[str], base_offset: float = 0.0) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.clocks = {n: SkewedClock(directory / f"{n}.offset", base_offset) for n in nodes}

    @classmethod
    def create(cls, directory: Path, nodes: Iterable[str], base_offset: float = 0.0) -> PlannerClockSet | None:
        """None when libfaketime is not installed (F6 and wall_clock_start are then refused before the run)."""
        try:
            library()
        except FaketimeMissing:
            return None
        return cls(directory, nodes, base_offset)

    def env_for(self, node: str) -> dict[str, str]:
        c = self.clocks.get(node)
        return c.env() if c is not None else {}  # merged into the process's environment by its starter

    def set_offset(self, node: str, seconds: float) -> None:
        """The node's skew on top of the cluster's shift (0: back to the cluster's clock)."""
        self.clocks[node].set_offset(self.base_offset + seconds)
